"""Rule `preflight-policy`: a pre-flight's candidate policy, the policy its run was seen under.

## What it finds
A run recorded by a pre-flight (`mpwatch.preflight`, `mpwatch preflight`): no fit ran; the model
built under its own policy was seen under a candidate policy on one batch (its layers switched,
the same weights), with the loss scale Keras would start with. One info finding names the
candidate and how to build the model under it, so that the run's advice is whole: the policy,
then the other findings' layers to keep in float32 and loss scale, which
`mpwatch.apply_recommendations` applies together.

## Why it matters
The other findings of such a run are about the model *under the candidate*: their fixes hold
only when the model is built under it. The policy is the first part of the advice.

## Threshold
Any run whose `run_info` has a `preflight` entry (a fit's record has none).

## Example evidence
```text
pre-flight before any fit: the model built under float32 seen under mixed_float16 on one batch of
32, the probe at loss scale 2^15 (32768), Keras' start
```

## Fix
```python
keras.mixed_precision.set_global_policy("mixed_float16")  # before the model is built
```

## References
- Keras mixed precision API: `keras.mixed_precision.set_global_policy`, set before the model is
  built
  <https://keras.io/api/mixed_precision/>
"""

from __future__ import annotations

from mpwatch import words
from mpwatch.judge.finding import Finding
from mpwatch.judge.rule import Rule
from mpwatch.read.run import Run

RULE = Rule(
    id="preflight-policy",
    title="A pre-flight's candidate policy",
    severities=("info",),
    doc=__doc__,
)


def check(run: Run) -> list[Finding]:
    """One info finding on a pre-flight's candidate run; none on a fit's run."""
    pre = run.info.get("preflight")
    if not isinstance(pre, dict):
        return []
    policy = str(run.info.get("policy") or "")
    own = str(pre.get("of") or "float32")
    scale = pre.get("scale")
    kept = [str(n) for n in pre.get("float32_layers") or []]
    batch = run.info.get("batch_size")
    at = (
        f", the probe at loss scale {words.loss_scale(float(scale))}"
        if isinstance(scale, (int, float)) and scale > 1
        else ""
    )
    evidence = (
        f"pre-flight before any fit: the model built under {own} seen under {policy}"
        + (f" on one batch of {batch}" if batch else " on one batch")
        + at
        + (f", with {', '.join(repr(n) for n in kept)} kept in float32" if kept else "")
    )
    fix = f'keras.mixed_precision.set_global_policy("{policy}")  # before the model is built'
    return [
        RULE.finding(
            "info",
            f"Pre-flight under {policy}: build the model under {policy}",
            evidence,
            fix=fix,
            action={"policy": policy},
            data={"of": own, "scale": scale, "float32_layers": kept},
        )
    ]
