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
when a step was skipped on such a batch, else warning. Not a bad batch, and no finding of this
rule:

- values beyond {F16_MAX:g} where every layer that takes the model's inputs computes in float32
  (the layer table's graph): float16 never sees them (an adapted `Normalization` in float32
  brings them into range first);
- values beyond {F16_MAX:g} in {SYSTEMATIC_SHARE:.0%} of the batches or more: that is the
  features' own scale (areas, prices), not bad records, and dropping them would drop the data.
  The finding then says so (error): the input reaches that far in so many batches, the layers
  that take it in float16, and the fix is theirs: a normalizing layer that takes the raw
  features (`Normalization`, `Rescaling`) kept float32 where it is created (before `adapt`), or
  an adapted `Normalization` in float32 first in the model.

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
# and normalize features to a small range (keras.layers.Normalization adapted on clean data,
# in float32)
```

## References
- NVIDIA, Train With Mixed Precision: values beyond float16's range overflow to inf whatever the
  loss scale <https://docs.nvidia.com/deeplearning/performance/mixed-precision-training/index.html>
- Keras LossScaleOptimizer: a step whose gradients are not finite is skipped
  <https://keras.io/api/optimizers/loss_scale_optimizer/>
"""

from __future__ import annotations

from typing import Any

from mpwatch import contract
from mpwatch.formats import FLOAT16, SIXTEEN_BIT
from mpwatch.judge.declare import Cause, Declared
from mpwatch.judge.evidence.graph import NORMALIZE_FIX, NORMALIZING, input_layers
from mpwatch.judge.evidence.skip_causes import bad_input_steps, steps_text
from mpwatch.judge.finding import Finding
from mpwatch.judge.rule import Rule, fmt, layer_constructor
from mpwatch.judge.rules import activation_overflow
from mpwatch.read.run import Run

F16_MAX = FLOAT16.max
STEPS_SHOWN = 6
SYSTEMATIC_SHARE = 0.5  # batches beyond float16's range: from this share on, the data's scale

RULE = Rule(
    id="bad-batches",
    title="Batches with NaN/inf or out-of-range inputs",
    severities=("warning", "error"),
    doc=__doc__,
    thresholds={"F16_MAX": F16_MAX, "SYSTEMATIC_SHARE": SYSTEMATIC_SHARE},
)


#: the features' own scale beyond float16's range, taken in float16 by the layers named (inf at
#: any scale): the cause of activation-overflow's consequences; the input layer's cause too
DECLARED = Declared(
    causes=(
        Cause(
            "forward overflow",
            when=lambda f: f.severity == "error"
            and f.data.get("cause") == "input_scale"
            and bool(f.data.get("layers")),
            rests=lambda f: f.rule in activation_overflow.OVERFLOW_CONSEQUENCES,
        ),
    ),
    layer_cause=6,
)


def check(run: Run) -> list[Finding]:
    """Findings of this rule on one run."""
    bad = bad_input_steps(run)
    if not bad:
        return []
    peak = run.scalar(contract.INPUT_MAX_ABS).dropna()
    n_batches = len(peak) or len(run.scalar(contract.INPUT_NONFINITE_COUNT).dropna())
    beyond = [s for s, why in bad.items() if "NaN/inf" not in why]
    takers = input_layers(run)
    if beyond and takers is not None and not any(_in_16bit(r) for r in takers):
        bad = {s: why for s, why in bad.items() if s not in beyond}  # float16 never sees them
        beyond = []
    found: list[Finding] = []
    if beyond and len(beyond) >= SYSTEMATIC_SHARE * n_batches:
        found.append(_scale_finding(run, beyond, n_batches, peak, takers))
        bad = {s: why for s, why in bad.items() if s not in beyond}
    if not bad:
        return found
    return found + _bad_batches(run, bad, peak, n_batches)


def _in_16bit(row: dict) -> bool:
    return str(row.get("compute_dtype")) in SIXTEEN_BIT


def _scale_finding(
    run: Run, beyond: list[int], n_batches: int, peak: Any, takers: list[dict] | None
) -> Finding:
    """Most batches beyond float16's range: the features' scale, and the layers taking it."""
    top = float(peak.max()) if len(peak) else float("nan")
    low = [r for r in takers or [] if _in_16bit(r)]
    names = ", ".join(f"{r['name']!r} ({r.get('class')})" for r in low)
    evidence = (
        f"{len(beyond)} of {n_batches} batches reach beyond float16's {F16_MAX:g} (up to "
        f"{fmt(top)}): the features' own scale, not bad records"
        + (f"; the model takes them in float16 in {names}: they are inf there, whatever the loss "
           "scale" if low else "")
    )  # fmt: skip
    lines = []
    for r in low:
        cls = str(r.get("class"))
        if cls in NORMALIZING:
            lines.append(
                f'{layer_constructor(run, cls)}(..., dtype="float32", name="{r["name"]}")  # '
                "where it is created (before adapt): it takes the raw features in float32"
            )
    if not lines or len(lines) < len(low):
        lines += ["# normalize them first, in float32: float16 never sees the raw values",
                  NORMALIZE_FIX]  # fmt: skip
    return RULE.finding(
        "error",
        f"The input reaches {fmt(top)} in {len(beyond)} of {n_batches} batches, beyond "
        f"float16's {F16_MAX:g}"
        + (f": {low[0]['name']!r} takes it in float16" if len(low) == 1 else ""),  # fmt: skip
        evidence,
        fix="\n".join(lines),
        layer=str(low[0]["name"]) if len(low) == 1 else None,
        action={"dtype": "float32"}
        if len(low) == 1 and str(low[0].get("class")) in NORMALIZING
        else {},
        data={"cause": "input_scale", "steps": beyond, "layers": [str(r["name"]) for r in low]},
    )


def _bad_batches(run: Run, bad: dict[int, str], peak: Any, n_batches: int) -> list[Finding]:
    skipped = run.skipped_steps()
    skipped_steps = {int(s) for s, n in skipped.items() if n}
    steps = sorted(bad)
    nonfinite = [s for s in steps if "NaN/inf" in bad[s]]
    hit = [s for s in steps if s in skipped_steps]
    sound = peak[[int(s) not in bad for s in peak.index]]
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
                "on clean data, in float32)"
            ),
            data={
                "cause": "input",
                "steps": steps,
                "skipped_steps": hit,
                "nonfinite_steps": nonfinite,
            },  # fmt: skip
        )
    ]
