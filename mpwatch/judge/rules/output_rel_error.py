"""Rule `output-rel-error`: a layer's 16-bit output differs from its float32 reference.

## What it finds
In the latest float16 or bfloat16 probe: the layers whose output, computed in 16 bits, differs
from the same layer's output in the float32 reference by more than the format's threshold.
Layers that compute in float32 already (their policy, or inside: see `float32-inside`) are left
out.

## Why it matters
A layer whose 16-bit output differs from its float32 reference by more than a few units of
rounding loses information the next layers cannot recover; keep it float32.

## Threshold
Latest probe's output relative error above float16: {REL_ERROR_WARN[float16]:g}, bfloat16:
{REL_ERROR_WARN[bfloat16]:g} (float16 rounds at 2^-11, bfloat16 at 2^-8): warning.

## Example evidence
```text
Output of layer 'dense' differs from float32 by 2.00%: keep it float32
probe at step 10 (float16): output relative error 0.02 against the float32 reference (threshold
0.01)
```

## Fix
```python
keras.layers.Dense(..., dtype="float32", name="dense")  # keep 'dense' in float32
# or, without editing the model code:
model = mpwatch.apply_recommendations(model, findings).model
```

## References
- TensorFlow mixed precision guide: numerically sensitive layers can keep a float32 dtype under
  a mixed policy
  <https://www.tensorflow.org/guide/mixed_precision>
- Micikevicius et al. 2017, Mixed Precision Training: float16's rounding, and the operations kept
  in float32
  <https://arxiv.org/abs/1710.03740>
"""

from __future__ import annotations

from mpwatch.judge.finding import Finding
from mpwatch.judge.rule import (
    Rule,
    effective_float32,
    finite,
    fmt,
    keep_float32_fix,
    layer_row,
    pct,
)
from mpwatch.read.run import Run

#: output relative error above which a layer's 16-bit output is flagged, by probe mode
REL_ERROR_WARN = {"float16": 1e-2, "bfloat16": 5e-2, "preflight": 1e-2}

RULE = Rule(
    id="output-rel-error",
    title="Layer output differs from float32",
    severities=("warning",),
    doc=__doc__,
    thresholds={"REL_ERROR_WARN": REL_ERROR_WARN},
)


def check(run: Run) -> list[Finding]:
    """Findings of this rule on one run."""
    probe = run.latest_probe(modes=("float16", "bfloat16"))
    if probe is None or not len(probe.layers) or "output_rel_error" not in probe.layers:
        return []
    step, model, layers = probe.step, probe.model, probe.layers
    mode = str(model.get("mode") or "float16")
    thr = REL_ERROR_WARN.get(mode, REL_ERROR_WARN["float16"])
    inside = effective_float32(run)
    found = []
    for _, r in layers.iterrows():
        err = finite(r.get("output_rel_error"))
        name = str(r["layer"])
        if err is None or err <= thr or name in inside:
            continue
        row = layer_row(run, name) or {}
        if str(row.get("compute_dtype", "")) == "float32":
            continue
        found.append(
            RULE.finding(
                "warning",
                f"Output of layer {name!r} differs from float32 by {pct(err)}: keep it float32",
                f"probe at step {step} ({mode}): output relative error {fmt(err)} against the "
                f"float32 reference (threshold {thr:g})",
                fix=keep_float32_fix(name, row.get("class")),
                layer=name,
                action={"dtype": "float32"},
                data={"step": step, "output_rel_error": err, "threshold": thr},
            )
        )
    return found
