"""Rule `loss-scale`: the loss scale is stuck low, or far from the one the probe recommends.

## What it finds
The median dynamic loss scale over the last quarter of logged steps, against 1 and against the
latest float16 probe's recommended scale (the least underflow with a safety margin below
overflow).

## Why it matters
A dynamic scale that ends at 1 or below no longer protects small gradients (and usually means the
forward pass overflows); far below the probe's recommended scale, gradients underflow that a
larger scale would keep.

## Threshold
Median scale over the last quarter of steps <= {SCALE_STUCK_LOW:g}: error;
|log2(scale / recommended)| >= {SCALE_FAR_BITS:g}: warning when below and the probe's underflow
fraction at the scale used is >= {UNDERFLOW_WARN:g}, otherwise info (the dynamic scale will grow
on its own).

## Example evidence
```text
Loss scale 256 is 6 doublings below the recommended 16384
median scale over the last 100 logged steps 256; probe at step 400 recommends 16384 (least
underflow with a safety margin below overflow); underflow at the scale used: 5.00% of the
reference's nonzero gradient values
```

## Fix
```python
keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=16384)
# a scale stuck at 1: find the overflowing layer (activation-overflow findings) and keep it
# float32:
keras.layers.Dense(..., dtype="float32")
```

## References
- Keras LossScaleOptimizer: the dynamic scale starts at 2^15, halves on a non-finite gradient and
  doubles after 2000 finite steps
  <https://keras.io/api/optimizers/loss_scale_optimizer/>
- TensorFlow mixed precision guide: loss scaling, and how the dynamic scale is chosen
  <https://www.tensorflow.org/guide/mixed_precision>
- NVIDIA, Train With Mixed Precision: choosing a scaling factor, and dynamic loss scaling
  <https://docs.nvidia.com/deeplearning/performance/mixed-precision-training/index.html>
"""

from __future__ import annotations

import math

from mpwatch import contract
from mpwatch.judge.finding import Finding
from mpwatch.judge.rule import UNDERFLOW_WARN, Rule, finite, fmt
from mpwatch.read.run import Run

SCALE_STUCK_LOW = 1.0  # a final dynamic scale at or below this cannot protect gradients
SCALE_FAR_BITS = 4.0  # |log2(scale / recommended)| at or above this

RULE = Rule(
    id="loss-scale",
    title="Loss scale stuck low, or far from the recommended one",
    severities=("info", "warning", "error"),
    doc=__doc__,
    thresholds={
        "SCALE_STUCK_LOW": SCALE_STUCK_LOW,
        "SCALE_FAR_BITS": SCALE_FAR_BITS,
        "UNDERFLOW_WARN": UNDERFLOW_WARN,
    },
)


def _log2(x: float) -> float:
    return math.log2(x) if x > 0 else float("-inf")


def check(run: Run) -> list[Finding]:
    """Findings of this rule on one run."""
    ls = run.scalar(contract.LOSS_SCALE)
    if not len(ls):
        return []
    found: list[Finding] = []
    tail = ls.iloc[-max(1, len(ls) // 4) :]
    med = float(tail.median())
    if med <= SCALE_STUCK_LOW:
        found.append(
            RULE.finding(
                "error",
                f"Loss scale stuck at {fmt(med)}",
                f"median dynamic loss scale over the last {len(tail)} logged steps "
                f"(steps {int(tail.index[0])}-{int(tail.index[-1])}): {fmt(med)}; minimum "
                f"{fmt(float(ls.min()))}. A scale this low means the forward or backward pass "
                "itself overflows float16.",
                fix="# find the overflowing layer (activation-overflow findings) and keep it "
                'float32:\nkeras.layers.Dense(..., dtype="float32")',
                data={"median_scale": med, "min_scale": float(ls.min())},
            )
        )
    probe = run.latest_probe(modes=("float16",))
    rec = finite(probe.model.get("recommended_scale")) if probe is not None else None
    if probe is not None and rec and med > SCALE_STUCK_LOW:
        model = probe.model
        bits = _log2(med) - _log2(rec)
        if abs(bits) >= SCALE_FAR_BITS:
            below = bits < 0
            # far below only matters when float16 really loses gradients at the scale used:
            # otherwise Keras' dynamic scaling (x2 every 2000 good steps) is doing its job
            uf = finite(model.get("underflow_fraction"))
            losing = uf is not None and uf >= UNDERFLOW_WARN
            found.append(
                RULE.finding(
                    "warning" if below and losing else "info",
                    f"Loss scale {fmt(med)} is {abs(bits):.0f} doublings "
                    f"{'below' if below else 'above'} the recommended {fmt(rec)}",
                    f"median scale over the last {len(tail)} logged steps {fmt(med)}; probe at "
                    f"step {probe.step} recommends {fmt(rec)} (least underflow with a safety "
                    "margin below overflow)"
                    + (
                        f"; underflow at the scale used: {uf:.2%} of the reference's nonzero "
                        "gradient values"
                        if uf is not None
                        else ""
                    ),
                    fix=f"keras.optimizers.LossScaleOptimizer(optimizer, initial_scale={rec:g})",
                    action={"loss_scale": rec},
                    data={"median_scale": med, "recommended_scale": rec, "log2_ratio": bits},
                )
            )
    return found
