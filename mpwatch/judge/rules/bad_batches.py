"""Rule `bad-batches`: batches whose input holds NaN/inf or values beyond float16's range.

## What it finds
Steps whose batch's floating-point features (the per-batch input health the tap measures in the
train step: ``mpwatch/input/max_abs``, ``mpwatch/input/nonfinite_count``) hold NaN or inf, or,
under float16 math, values above float16's largest ({F16_MAX:g}), named by step, with whether the
step was skipped.

## Why it matters
Such a batch makes the forward pass non-finite at any loss scale: the step is skipped and the
scale halves (under mixed_float16), or, without a loss-scale optimizer, NaN reaches the weights.
Keras' reported loss is a running mean over the epoch, so one such batch makes it NaN for the
rest of the epoch. No layer dtype fixes a bad record: keeping the first layer in float32 moves the
overflow to the next one. The data needs cleaning or normalizing.

## Threshold
Any batch with NaN/inf features: error. Features beyond {F16_MAX:g} under float16 math: error
when a step was skipped on such a batch, else warning (a float32 first layer took them).

## Example evidence
```text
2 of 40 batches: step 18 (max |x| 1e+30 > float16's 65504; skipped), step 32 (max |x| 1e+30 >
float16's 65504; skipped); every other batch peaks at 4.2
```

## Fix
```python
# drop (or repair) the bad records before they reach the model, e.g. in tf.data:
ds = ds.filter(lambda x, y: tf.reduce_all(tf.math.is_finite(x))
               & (tf.reduce_max(tf.abs(x)) < 65504.0))
# and normalize features to a small range (keras.layers.Normalization adapted on clean data)
```

## References
- NVIDIA, Train With Mixed Precision: values beyond float16's range overflow to inf whatever the
  loss scale <https://docs.nvidia.com/deeplearning/performance/mixed-precision-training/index.html>
- Keras LossScaleOptimizer: a step whose gradients are not finite is skipped
  <https://keras.io/api/optimizers/loss_scale_optimizer/>
"""

from __future__ import annotations

from mpwatch import contract
from mpwatch.formats import FLOAT16
from mpwatch.judge.finding import Finding
from mpwatch.judge.rule import Rule, fmt
from mpwatch.judge.skip_causes import bad_input_steps, steps_text
from mpwatch.read.run import Run

F16_MAX = FLOAT16.max
STEPS_SHOWN = 6

RULE = Rule(
    id="bad-batches",
    title="Batches with NaN/inf or out-of-range inputs",
    severities=("warning", "error"),
    doc=__doc__,
    thresholds={"F16_MAX": F16_MAX},
)


def check(run: Run) -> list[Finding]:
    """Findings of this rule on one run."""
    bad = bad_input_steps(run)
    if not bad:
        return []
    skipped = run.skipped_steps()
    skipped_steps = {int(s) for s, n in skipped.items() if n}
    steps = sorted(bad)
    nonfinite = [s for s in steps if "NaN/inf" in bad[s]]
    hit = [s for s in steps if s in skipped_steps]
    peak = run.scalar(contract.INPUT_MAX_ABS).dropna()
    sound = peak[[int(s) not in bad for s in peak.index]]
    n_batches = len(peak) or len(run.scalar(contract.INPUT_NONFINITE_COUNT).dropna())
    parts = [
        f"step {s} ({bad[s]}{'; skipped' if s in skipped_steps else ''})"
        for s in steps[:STEPS_SHOWN]
    ]
    evidence = f"{len(steps)} of {n_batches} batches: " + ", ".join(parts)
    if len(steps) > STEPS_SHOWN:
        evidence += f" and {len(steps) - STEPS_SHOWN} more"
    if len(sound):
        evidence += f"; every other batch peaks at {fmt(float(sound.max()))}"
    loss = run.scalar(contract.TRAIN_LOSS)  # finite values only: a NaN loss reads as absent
    if len(loss) and len(peak) and loss.index[-1] < peak.index[-1]:
        first_nan = int(loss.index[-1]) + 1
        if any(s <= first_nan for s in steps):
            evidence += (
                f"; Keras' reported loss is not finite from step {first_nan} on (its running "
                "mean over the epoch takes in the bad batch's loss)"
            )
    severity = "error" if nonfinite or hit else "warning"
    what = "NaN/inf" if nonfinite else f"values beyond float16's {F16_MAX:g}"
    title = (
        f"{len(steps)} batch{'es' if len(steps) > 1 else ''} with {what} in the input "
        f"(step{'s' if len(steps) > 1 else ''} {steps_text(steps, 4)})"
    )
    if hit:
        title += f": {len(hit)} step{'s' if len(hit) > 1 else ''} skipped"
    return [
        RULE.finding(
            severity,
            title,
            evidence,
            fix=(
                "# drop (or repair) the bad records before they reach the model, e.g. in "
                "tf.data:\n"
                "ds = ds.filter(lambda x, y: tf.reduce_all(tf.math.is_finite(x))\n"
                f"               & (tf.reduce_max(tf.abs(x)) < {F16_MAX:g}.0))\n"
                "# and normalize features to a small range (keras.layers.Normalization adapted "
                "on clean data)"
            ),
            data={
                "cause": "input",
                "steps": steps,
                "skipped_steps": hit,
                "nonfinite_steps": nonfinite,
            },  # fmt: skip
        )
    ]
