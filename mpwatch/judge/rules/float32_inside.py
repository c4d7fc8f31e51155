"""Rule `float32-inside`: layers that already compute in float32 whatever their policy says.

## What it finds
Layers whose effective dtype (what their math really runs in, from the layer table) is float32
while their policy computes in 16 bits: the normalization layers, which Keras upcasts inside.

## Why it matters
Some layers (LayerNormalization, BatchNormalization under mixed_float16) compute in float32
inside whatever their policy says; casting them yourself changes nothing and mpwatch never
recommends it.

## Threshold
Effective dtype float32 while the layer's compute dtype is 16-bit: info, one finding for them
all, counted by class in one line (up to {NAMES_SHOWN} names per class in the evidence; every
name in the finding's data).

## Example evidence
```text
52 BatchNormalization layers compute in float32 inside: nothing to change
BatchNormalization: 52 layers ('bn_Conv1', 'expanded_conv_depthwise_BN',
'expanded_conv_project_BN' and 49 more) normalise in float32 inside and return float16
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
from mpwatch.judge.rule import Rule, effective_float32, layer_row, names_list
from mpwatch.read.run import Run

NAMES_SHOWN = 3  # layer names per class in the evidence

RULE = Rule(
    id="float32-inside",
    title="Layers that already compute in float32",
    severities=("info",),
    doc=__doc__,
    thresholds={"NAMES_SHOWN": NAMES_SHOWN},
)


def _counted(by_class: dict[str, list[str]]) -> str:
    parts = [f"{len(v)} {k}" for k, v in by_class.items()]
    plural = sum(len(v) for v in by_class.values()) > 1
    head = ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1]
    return head + (" layers" if plural else " layer")


def check(run: Run) -> list[Finding]:
    """Findings of this rule on one run: at most one."""
    inside = effective_float32(run)
    if not inside:
        return []
    lt = run.layers
    names = [str(n) for n in lt["name"] if str(n) in inside]  # the table's (model) order
    names = list(dict.fromkeys(names))
    by_class: dict[str, list[str]] = {}
    dtypes: set[str] = set()
    for n in names:
        row = layer_row(run, n) or {}
        by_class.setdefault(str(row.get("class") or "Layer"), []).append(n)
        dtypes.add(str(row.get("output_dtype") or row.get("compute_dtype") or ""))
    by_class = dict(sorted(by_class.items(), key=lambda kv: (-len(kv[1]), kv[0])))
    ret = " and ".join(sorted(d for d in dtypes if d)) or "16 bits"
    evidence = (
        "; ".join(
            f"{cls}: {len(v)} layer{'s' if len(v) > 1 else ''} ({names_list(v, NAMES_SHOWN)})"
            for cls, v in by_class.items()
        )
        + f" normalise in float32 inside and return {ret}"
    )
    verb = "compute" if len(names) > 1 else "computes"
    return [
        RULE.finding(
            "info",
            f"{_counted(by_class)} {verb} in float32 inside: nothing to change",
            evidence,
            fix="# nothing to do: do not cast these layers yourself",
            data={
                "layers": names,
                "by_class": {k: len(v) for k, v in by_class.items()},
                "count_layers": int(len(lt)),
            },  # fmt: skip
        )
    ]
