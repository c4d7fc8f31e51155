"""Rule `target-range`: a regression target far from zero makes the backward pass overflow.

## What it finds
A probe whose pass went non-finite (or came within 2^3 of float16's maximum) re-ran it on the
same batch and weights under each candidate fix (``fix_checks``); for a regression target (one
floating target, not whole numbers, some |y| of {RAW_TARGET:g} or more: prices, amounts, a series
near 1000) one candidate is the batch's target standardised per column, the inputs as they are.
When that pass is finite and in range where the pass as it is was not, the target's range is the
cause: the loss's gradient at the model's output (``2 (y_pred - y) / n`` for a mean squared
error) grows with the target's distance from the predictions, and every gradient below the
output with it, times the loss scale. The dynamic scale falls to where nothing is protected
(an LSTM forecaster on a raw series near 1000: 16 steps skipped, the scale at 0.5), and a
float16 output holds values near 1000 only to steps of 0.5.

Keeping a layer in float32 may bring the same batch in range at the probe's scale; it moves
the overflow, it does not remove the gradient's size: the target is named first, and the other
checks are kept as its evidence.

## Why it matters
Standardising the target costs nothing: the model learns ``(y - mean) / std`` and its predictions
are turned back with ``* std + mean``. The gradients stay near unit scale, the loss scale stays
high (small gradients kept), and the output needs only float16's precision near 1.

## Threshold
From the latest probe with fix checks: the standardised target in range, the pass as it is not.
Error when the pass as it is was not finite, warning when it only came near the maximum.

## Example evidence
```text
checked on step 10's batch at loss scale 2^5 (32): as it is, the scaled gradients are not
finite; keeping 'lstm' float32: finite, in range; standardising the target: finite, in range;
the target: mean 1000, standard deviation 21.3, |y| up to 1041; a float16 output holds values
near 1041 only to steps of 1
```

## Fix
```python
y_mean, y_std = y_train.mean(axis=0), y_train.std(axis=0)  # the training target, once
model.fit(x_train, (y_train - y_mean) / y_std, ...)       # train on the standardised target
y_pred = model.predict(x) * y_std + y_mean                # predictions in the target's units
```

## References
- NVIDIA, Train With Mixed Precision: keep activations and gradients within float16's range
  <https://docs.nvidia.com/deeplearning/performance/mixed-precision-training/index.html>
- keras.io, Timeseries forecasting for weather prediction: the features (the target among them)
  normalized before training <https://keras.io/examples/timeseries/timeseries_weather_forecasting/>
"""

from __future__ import annotations

import math

from mpwatch.formats import FLOAT16, RAW_TARGET
from mpwatch.judge.declare import Cause, Declared
from mpwatch.judge.evidence.fix_checks import checked_on, latest_checks, works
from mpwatch.judge.finding import Finding
from mpwatch.judge.rule import Rule, fmt
from mpwatch.judge.rules import input_range
from mpwatch.read.run import Run

RULE = Rule(
    id="target-range",
    title="A regression target far from zero makes the backward pass overflow float16",
    severities=("warning", "error"),
    doc=__doc__,
    thresholds={"RAW_TARGET": RAW_TARGET},
)

#: what a target-range finding takes in as its evidence (same run): what an input-range finding
#: takes in (the overflow and what it drives), and input-range's "normalize the inputs" where
#: that brings the same batch in range too (:func:`rests_on_it`: not its float16
#: Normalization's lost features, a cause of their own)
CONSEQUENCES = (*input_range.CONSEQUENCES, "input-range")


def rests_on_it(finding: Finding) -> bool:
    """Whether ``finding`` is evidence of a target-range finding of the same run."""
    if finding.rule == "input-range":
        return finding.data.get("cause") == "input_range"
    return finding.rule in CONSEQUENCES


FIX = (
    "y_mean, y_std = y_train.mean(axis=0), y_train.std(axis=0)  # the training target, once\n"
    "model.fit(x_train, (y_train - y_mean) / y_std, ...)       # train on the standardised "
    "target\n"
    "y_pred = model.predict(x) * y_std + y_mean                # predictions in the target's "
    "units"
)


def float16_step(value: float) -> float:
    """The spacing of float16's values near ``|value|`` (its normal range; inf past its
    maximum, where float16 holds no value at all)."""
    v = abs(float(value))
    if not math.isfinite(v) or v > FLOAT16.max:
        return math.inf
    if v < 2.0**-14:
        return 2.0**-24
    return 2.0 ** (math.floor(math.log2(v)) - 10)


def _held(top: float) -> str:
    """How a float16 output holds the target's largest |y|."""
    step = float16_step(top)
    if math.isinf(step):
        return f"a float16 output cannot hold {fmt(top)} at all (its maximum is {FLOAT16.max:g})"
    return f"a float16 output holds values near {fmt(top)} only to steps of {fmt(step)}"


#: a regression target's range that makes the backward pass overflow (the fix checks): the
#: run's overflow findings, their consequences and input-range's finding about the inputs rest on it
DECLARED = Declared(causes=(Cause("target range", rests=lambda f: rests_on_it(f)),))


def check(run: Run) -> list[Finding]:
    """Findings of this rule on one run."""
    got = latest_checks(run)
    if got is None:
        return []
    step, scale, checks = got
    tried = next((c for c in checks if c.get("fix") == "normalize_target"), None)
    base = next((c for c in checks if c.get("fix") == "none"), {})
    if tried is None or not works(tried) or works(base):
        return []
    target = tried.get("target") or {}
    evidence = checked_on(step, scale, checks)
    top = target.get("max_abs")
    if top is not None:
        evidence += (
            f"; the target: mean {fmt(target.get('mean'))}, standard deviation "
            f"{fmt(target.get('std'))}, |y| up to {fmt(top)}; {_held(top)}"
        )
    overflow = not base.get("finite", False)
    what = "makes the backward pass overflow float16" if overflow else (
        "brings the backward pass within 2^3 of float16's maximum"
    )
    return [
        RULE.finding(
            "error" if overflow else "warning",
            f"Standardise the regression target: its range {what} (checked on step {step}'s "
            "batch)",
            evidence,
            fix=FIX,
            data={
                "cause": "target_range",
                "step": step,
                "fix_checks": checks,
                "target": target,
            },  # fmt: skip
        )
    ]
