"""Rule `float32-inside`: layers that already compute in float32 whatever their policy says.

## What it finds
Layers whose effective dtype (what their math really runs in, from the layer table) is float32
while their policy computes in 16 bits: the normalization layers, which Keras upcasts inside.

## Why it matters
Some layers (LayerNormalization, BatchNormalization under mixed_float16) compute in float32
inside whatever their policy says; casting them yourself changes nothing and mpwatch never
recommends it.

## Threshold
Effective dtype float32 while the layer's compute dtype is 16-bit: info, one finding listing
them all (the first 20 in the evidence).

## Example evidence
```text
1 layer(s) already compute in float32 inside: nothing to change
layer_norm (LayerNormalization: normalises in float32 inside)
```

## Fix
```python
# nothing to do: do not cast these layers yourself
```

## References
- Keras mixed precision API: a layer's compute dtype comes from its dtype policy; the layer's own
  implementation may still compute some steps in float32
  <https://keras.io/api/mixed_precision/>
- TensorFlow mixed precision guide: which dtypes layers compute in under a mixed policy
  <https://www.tensorflow.org/guide/mixed_precision>
"""

from __future__ import annotations

from mpwatch.judge.finding import Finding
from mpwatch.judge.rule import Rule, effective_float32, layer_row
from mpwatch.read.run import Run

RULE = Rule(
    id="float32-inside",
    title="Layers that already compute in float32",
    severities=("info",),
    doc=__doc__,
)


def check(run: Run) -> list[Finding]:
    """Findings of this rule on one run."""
    names = sorted(effective_float32(run))
    if not names:
        return []
    lt = run.layers
    notes = []
    for n in names:
        row = layer_row(run, n) or {}
        notes.append(
            f"{n} ({row.get('class')}{': ' + str(row['note']) if row.get('note') else ''})"
        )
    return [
        RULE.finding(
            "info",
            f"{len(names)} layer(s) already compute in float32 inside: nothing to change",
            "; ".join(notes[:20]) + (f"; and {len(names) - 20} more" if len(names) > 20 else ""),
            fix="# nothing to do: do not cast these layers yourself",
            data={"layers": names, "count_layers": int(len(lt))},
        )
    ]
