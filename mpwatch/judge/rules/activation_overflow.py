"""Rule `activation-overflow`: activations overflow float16, or come close to its maximum.

## What it finds
In the latest float16 or pre-flight probe: the layer where non-finite values first appear, and
every layer whose largest absolute activation is above float16's maximum ({FLOAT16_MAX:g}), is
non-finite, or leaves less than {HEADROOM_WARN_BITS:g} doublings of headroom below it.

## Why it matters
float16's largest value is {FLOAT16_MAX:g}; a larger activation becomes inf and every later value
NaN. Within a few doublings of it, one unlucky batch overflows.

## Threshold
Probe max |activation| > {FLOAT16_MAX:g} or non-finite (or the probe's first non-finite layer):
error; activation headroom below {HEADROOM_WARN_BITS:g} bits (max |activation| >
{FLOAT16_MAX:g}/2^{HEADROOM_WARN_BITS:g}): warning. float16 and pre-flight probes only (bfloat16
has float32's range).

## Example evidence
```text
Activations of layer 'dense' overflow float16
probe at step 10: max |activation| 131008 (float16 max 65504), headroom -1 bits
```

## Fix
```python
keras.layers.Dense(..., dtype="float32", name="dense")  # keep 'dense' in float32
# or, without editing the model code:
model = mpwatch.apply_recommendations(model, findings).model
# or normalize / scale the input of this layer
```
A layer that already computes in float32 inside (see `float32-inside`) gets no float32 action.

## References
- Micikevicius et al. 2017, Mixed Precision Training: float16's range, and the operations kept
  in float32
  <https://arxiv.org/abs/1710.03740>
- NVIDIA, Train With Mixed Precision: float16's dynamic range, and overflow of activations and
  gradients
  <https://docs.nvidia.com/deeplearning/performance/mixed-precision-training/index.html>
"""

from __future__ import annotations

import math

from mpwatch.formats import FLOAT16
from mpwatch.judge.finding import Finding
from mpwatch.judge.rule import (
    HEADROOM_WARN_BITS,
    Rule,
    effective_float32,
    finite,
    fmt,
    keep_float32_fix,
    layer_row,
)
from mpwatch.read.run import Run

RULE = Rule(
    id="activation-overflow",
    title="Activations overflow or come close to float16's maximum",
    severities=("warning", "error"),
    doc=__doc__,
    thresholds={"HEADROOM_WARN_BITS": HEADROOM_WARN_BITS, "FLOAT16_MAX": FLOAT16.max},
)


def check(run: Run) -> list[Finding]:
    """Findings of this rule on one run."""
    probe = run.latest_probe(modes=("float16", "preflight"))
    if probe is None:
        return []
    step, model, layers = probe.step, probe.model, probe.layers
    found: list[Finding] = []
    inside = effective_float32(run)
    first_bad = model.get("first_nonfinite_layer")
    flagged: set[str] = set()
    if isinstance(first_bad, str) and first_bad:
        row = layer_row(run, first_bad) or {}
        found.append(
            RULE.finding(
                "error",
                f"Non-finite values first appear in layer {first_bad!r}",
                f"probe at step {step} ({model.get('mode')}): first non-finite layer "
                f"{first_bad!r}; model max |activation| "
                f"{fmt(finite(model.get('max_abs_activation')))}",
                fix=keep_float32_fix(first_bad, row.get("class")),
                layer=first_bad,
                action={} if first_bad in inside else {"dtype": "float32"},
                data={"step": step},
            )
        )
        flagged.add(first_bad)
    if not len(layers) or "layer" not in layers:
        return found
    for _, r in layers.iterrows():
        name = str(r["layer"])
        if name in flagged:
            continue
        mx = finite(r.get("max_abs_activation"))
        head = finite(r.get("activation_headroom_bits"))
        nf = r.get("nonfinite")
        nonfinite = (
            bool(nf) if nf is not None and not (isinstance(nf, float) and nf != nf) else False
        )
        if head is None and mx is not None and mx > 0:
            head = math.log2(FLOAT16.max / mx)
        raw_mx = r.get("max_abs_activation")
        overflow = nonfinite or (mx is not None and mx > FLOAT16.max)
        try:
            overflow = overflow or (raw_mx is not None and math.isinf(float(raw_mx)))
        except (TypeError, ValueError):
            pass
        if not overflow and (head is None or head >= HEADROOM_WARN_BITS):
            continue
        row = layer_row(run, name) or {}
        sev = "error" if overflow else "warning"
        title = (
            f"Activations of layer {name!r} overflow float16"
            if overflow
            else f"Activations of layer {name!r} come within {head:.1f} doublings of "
            f"{FLOAT16.max:g}"
        )
        found.append(
            RULE.finding(
                sev,
                title,
                f"probe at step {step}: max |activation| {fmt(mx)} (float16 max "
                f"{FLOAT16.max:g}), headroom {fmt(head)} bits"
                + ("; non-finite values" if nonfinite else ""),
                fix=keep_float32_fix(name, row.get("class"))
                + "\n# or normalize / scale the input of this layer",
                layer=name,
                action={} if name in inside else {"dtype": "float32"},
                data={"step": step, "max_abs_activation": mx, "headroom_bits": head},
            )
        )
        flagged.add(name)
    return found
