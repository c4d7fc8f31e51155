"""Rule `skipped-steps`: many optimizer steps skipped for non-finite gradients.

## What it finds
The updates the loss-scale optimizer dropped because a gradient was inf or NaN (from the per-step
flag, or from the rises of the cumulative count when only that was recorded): those within the
first {WARMUP_STEPS} steps, and the rate after them; and the scale each ran at (twice the scale
recorded after it: the skip halved it), the largest that overflowed and when.

## Why it matters
A skipped step is a batch thrown away: the update is dropped and the scale halves. A few at the
start (the scale coming down from 2^15) and one per 2000 steps (a failed doubling) are normal;
more means overflow in the model, not the scale.

## Threshold
Skipped steps after the first {WARMUP_STEPS} steps, per step: > {SKIP_RATE_WARN:g} warning, >
{SKIP_RATE_ERROR:g} error; within the first {WARMUP_STEPS}: more than {WARMUP_SKIP_ALLOWANCE}
warning, more than {WARMUP_SKIP_ERROR} (the scale fell below 1) error: a NaN storm at the start
is no warm-up. The steps after warm-up are the recorded per-step flags after step
{WARMUP_STEPS}, or, with only the cumulative count, the steps from {WARMUP_STEPS} to its last
record.

Each skip has a cause (:mod:`mpwatch.judge.evidence.skip_causes`): the scale's descent (bounded,
where a
probe's sweep knows it, by the scale at which the float32 reference's gradients overflow), a bad
batch, a failed doubling, the model's own overflow (a probe saw it, or the float32 reference
fits at that scale), or none found. Only the skips after the descent that no bad batch explains
count toward the rate, less those of the skips the run starts with that the float32 twin fits
and no probe tied to a layer: those cost their steps once, as the descent does, and count with
it toward the limits of the first steps (what they cost in scale, the scale and underflow rules
judge). Skips a probe tied to one layer become that layer's finding's evidence.

## Example evidence
```text
20 of 1000 steps skipped for non-finite gradients (2.0%)
32 steps skipped in all; 12 in the scale's descent from 2^15 (32768) to 8 (steps 1, 2, 3 and 9
more); 20 of the 1000 steps after it: 2 failed doubling(s) (expected about 1 per 2000), 18 at a
scale that had worked, on batches with sound input (steps 140, 388, 412, 519, 602, 733 and 12
more); the largest scale that overflowed: 2^15 (32768) at step 1; the smallest: 8 at step 12
```

## Fix
```python
# a model that overflows at any scale: find the layer (activation-overflow) and keep it float32
keras.layers.Dense(..., dtype="float32")
```

## References
- Keras LossScaleOptimizer: a step whose gradients are not finite is skipped and the scale
  halved; the scale doubles after 2000 finite steps
  <https://keras.io/api/optimizers/loss_scale_optimizer/>
- NVIDIA, Train With Mixed Precision: dynamic loss scaling skips the updates that overflow
  <https://docs.nvidia.com/deeplearning/performance/mixed-precision-training/index.html>
"""

from __future__ import annotations

import math

from mpwatch import contract
from mpwatch.judge.declare import Declared
from mpwatch.judge.evidence import scale_evidence as se
from mpwatch.judge.evidence import scale_facts as sf
from mpwatch.judge.evidence import skip_causes as sc
from mpwatch.judge.evidence.skip_causes import TWIN_FITS
from mpwatch.judge.finding import Finding
from mpwatch.judge.rule import Rule, pct
from mpwatch.read.run import Run

SKIP_RATE_WARN = 0.01  # skipped steps after warm-up, per step
SKIP_RATE_ERROR = 0.10
WARMUP_STEPS = sf.START_STEPS  # the scale starts at 2**15 and halves down: early skips expected
WARMUP_SKIP_ALLOWANCE = 10  # ...but no more than 10 of them (the scale down to 2**5) in warm-up
WARMUP_SKIP_ERROR = 15  # more than 15 and the scale fell below 1: it protects nothing

RULE = Rule(
    id="skipped-steps",
    title="Many steps skipped for non-finite gradients",
    severities=("warning", "error"),
    doc=__doc__,
    thresholds={
        "SKIP_RATE_WARN": SKIP_RATE_WARN,
        "SKIP_RATE_ERROR": SKIP_RATE_ERROR,
        "WARMUP_STEPS": WARMUP_STEPS,
        "WARMUP_SKIP_ALLOWANCE": WARMUP_SKIP_ALLOWANCE,
        "WARMUP_SKIP_ERROR": WARMUP_SKIP_ERROR,
    },
)


def _steps_after_warmup(run: Run) -> int | None:
    """How many steps after WARMUP_STEPS the run recorded; None when it recorded no skips at all.

    With the per-step flag: its records after warm-up (one per step). With only the cumulative
    count (sampled every few steps): the steps from WARMUP_STEPS to its last record.
    """
    flags = run.scalar(contract.STEP_SKIPPED)
    if len(flags):
        return int((flags.index > WARMUP_STEPS).sum())
    totals = run.scalar(contract.SKIPPED_STEPS_TOTAL)
    if len(totals):
        return max(0, int(totals.index[-1]) - WARMUP_STEPS)
    return None


def rests_on_layer(f: Finding) -> str | None:
    """The layer a finding of this rule rests on: where its skips after the scale's descent are
    all failed doublings or overflows a probe saw start in one layer (``overflow_layers``, none
    unexplained, and not raised by a descent too long on its own), that layer's finding (where
    the run has one) takes it as evidence."""
    layers = f.data.get("overflow_layers") or []
    causes = f.data.get("by_cause") or {}
    if len(layers) != 1 or causes.get("unexplained") or not causes.get("model_overflow"):
        return None
    if len(causes.get("descent") or []) > WARMUP_SKIP_ALLOWANCE:  # raised by the descent too
        return None
    return str(layers[0])


DECLARED = Declared(rests_on_layer=rests_on_layer)


def check(run: Run) -> list[Finding]:
    """Findings of this rule on one run."""
    if len(run.scalar(contract.STEP_SKIPPED).dropna()):
        return _by_cause(run)
    return _from_totals(run)


def _which_pass(run: Run, steps: list[int]) -> str | None:
    """Where a descent past a scale of 1 overflowed, measured: "forward" where the loss Keras
    reported is not finite at one of ``steps``, "backward" where it is finite at all of them
    (Keras reports the epoch's running mean: a non-finite batch loss would stay in it), None
    where the loss was not recorded at those steps."""
    losses = run.scalar(contract.TRAIN_LOSS).dropna()
    seen = [float(losses[s]) for s in steps if s in losses.index]
    if not seen or len(seen) < len(steps):
        return None
    return "backward" if all(math.isfinite(v) for v in seen) else "forward"


def _by_cause(run: Run) -> list[Finding]:
    """With the per-step flags: every skip attributed (:mod:`mpwatch.judge.evidence.skip_causes`);
    the
    rate judged on the skips after the descent that no bad batch explains."""
    flags = run.scalar(contract.STEP_SKIPPED).dropna()
    flags = flags[flags.index > 0]
    groups = sc.by_cause(sc.skip_causes(run))
    descent = groups["descent"]
    # the skips the run starts with, consecutively, that no probe tied to a layer (the float32
    # twin fits at their scale: the backward pass's own activation gradients may not) cost
    # their steps once, as the descent does: judged by their number with it, not as a rate over
    # a fit's length (3 of a 19-step fit's are not 3 of 10,000's); what the start cost in
    # scale, the scale and underflow rules judge
    start = set(sc.descent_steps(run))
    judged = groups["growth"] + groups["model_overflow"] + groups["unexplained"]
    later = [c for c in judged if c.step not in start or not c.detail.startswith(TWIN_FITS)]
    last_start = max([c.step for c in descent] + [c.step for c in judged if c not in later] + [0])
    n_steps = int((flags.index > last_start).sum())
    early = len(descent) + len(judged) - len(later)
    rate = len(later) / n_steps if n_steps > 0 else 0.0
    sev_rate = None
    if n_steps > 0 and rate > SKIP_RATE_WARN:
        sev_rate = "error" if rate > SKIP_RATE_ERROR else "warning"
    sev_early = None
    if early > WARMUP_SKIP_ALLOWANCE:
        sev_early = "error" if early > WARMUP_SKIP_ERROR else "warning"
    if sev_rate is None and sev_early is None:
        return []
    severity = "error" if "error" in (sev_rate, sev_early) else "warning"
    total = sum(len(v) for v in groups.values())
    initial, growth_interval = sf.growth_facts(run)
    if sev_rate is not None:
        title = f"{len(later)} of {n_steps} steps skipped for non-finite gradients ({pct(rate)})"
    else:  # the descent need not be consecutive (a new lowest scale): count its halvings
        title = (
            f"{early} steps skipped while the loss scale fell from "
            f"{se.scale_text(initial)} to {se.scale_text(initial / 2.0 ** early)}"
        )
    parts = [f"{total} steps skipped in all"]
    if descent:
        low = initial / 2.0 ** len(descent)
        parts.append(
            f"{len(descent)} in the scale's descent from {se.scale_text(initial)} to "
            f"{se.scale_text(low)} (steps {sc.steps_text([c.step for c in descent], 3)})"
        )
    after = [
        f"{len(judged) + len(groups['bad_input'])} of the {n_steps + early - len(descent)} steps"
        + (" after it" if descent else "")
    ]
    if groups["growth"]:
        after.append(
            f"{len(groups['growth'])} failed doubling(s) (expected about 1 per {growth_interval})"
        )
    if groups["bad_input"]:
        after.append(f"{len(groups['bad_input'])} on bad batches (bad-batches)")
    roots = list(
        dict.fromkeys(
            c.detail.rsplit("first in ", 1)[-1]
            for c in groups["model_overflow"]
            if "first in " in c.detail
        )
    )
    twin_fits = [c for c in groups["model_overflow"] if c.detail.startswith(TWIN_FITS)]
    probed = len(groups["model_overflow"]) - len(twin_fits)
    if probed:
        after.append(
            f"{probed} at a scale at which a probe saw the model's own pass overflow"
            + (f" (first in {', '.join(roots)})" if roots else "")
        )
    if twin_fits:
        after.append(
            f"{len(twin_fits)} at scales the float32 reference's gradients fit (the probe's "
            "sweep): the float16 pass overflowed where its float32 twin would not"
        )
    if groups["unexplained"]:
        steps = [c.step for c in groups["unexplained"]]
        after.append(
            f"{len(steps)} at a scale that had worked, on batches with sound input (steps "
            f"{sc.steps_text(steps)})"
        )
    parts.append(": ".join([after[0], ", ".join(after[1:])]) if len(after) > 1 else after[0])
    scales = _scales(run)
    if scales["text"]:
        parts.append(scales["text"])
    if groups["unexplained"]:
        fix = (
            "# the model overflows on some batches at a scale that had worked: probe one of them\n"
            f"# (steps {sc.steps_text([c.step for c in groups['unexplained']], 3)}) to find the "
            "layer\n"
            "mpwatch.MixedPrecisionMonitor(log_dir, probe_data=(x_batch, y_batch))"
        )
    elif twin_fits and not roots and _outputs_float32(run):
        fix = (
            "# the float16 pass overflows on training batches where its float32 twin fits, and\n"
            "# the probe's batch (Dropout off) did not show where; the model's outputs compute\n"
            "# in float32 already: a layer inside overflows (a 16-bit division, square root or\n"
            "# exp of small or large values). Probe a training batch that skipped to find it\n"
            "mpwatch.MixedPrecisionMonitor(log_dir, probe_data=(x_batch, y_batch))"
        )
    elif twin_fits and not roots:
        fix = (
            "# the float16 pass overflows on training batches where its float32 twin fits, and\n"
            "# the probe's batch (Dropout off) did not show where: a 16-bit output (softmax,\n"
            "# sigmoid) or a layer near 65504. Keep the model's output float32, then probe a\n"
            "# training batch that skipped to find any other layer\n"
            "mpwatch.MixedPrecisionMonitor(log_dir, probe_data=(x_batch, y_batch))"
        )
    elif len(descent) > WARMUP_SKIP_ERROR:
        where = _which_pass(run, [c.step for c in descent])
        if where == "backward":
            parts.append("the loss Keras reported stayed finite at every one of these steps")
        fix = {
            "backward": "# even a scale of 1 or less overflowed, and the loss was finite on these\n"
            "# batches: the backward pass overflows (a gradient beyond 65504 at any scale);\n",
            "forward": "# even a scale of 1 or less overflowed: the loss itself is not finite on\n"
            "# these batches (the forward pass), no scale helps;\n",
        }.get(where, "# even a scale of 1 or less overflowed: the forward or the backward pass is\n"
                     "# not finite on these batches, no scale helps;\n") + (
            "# probe the first batch to find the layer\n"
            "mpwatch.MixedPrecisionMonitor(log_dir, probe_every=1)"
        )  # fmt: skip
    else:
        start = se.scale_text(initial / 2.0 ** len(descent)).split(" ")[0].replace("^", "**")
        fix = (
            "# the scale starts higher than these gradients allow: start where it settled\n"
            f"keras.optimizers.LossScaleOptimizer(optimizer, initial_scale={start})"
        )
    return [
        RULE.finding(
            severity,
            title,
            "; ".join(parts),
            fix=fix,
            data={
                "skipped": len(judged),
                "steps": n_steps,
                "rate": rate,
                "later": len(later),  # judged as a rate: after the skips the run starts with
                "total": total,
                "early": len(descent),
                "by_cause": {k: [c.step for c in v] for k, v in groups.items()},
                "overflow_layers": [r.strip("'") for r in roots],
                "max_overflow_scale": scales["max_scale"],
                "max_overflow_step": scales["max_step"],
                "min_overflow_scale": scales["min_scale"],
            },
        )
    ]


def _from_totals(run: Run) -> list[Finding]:
    """With only the cumulative count (sampled every few steps): skips after
    ``WARMUP_STEPS`` against the steps after it, and the skips within it."""
    n_steps = _steps_after_warmup(run)
    if n_steps is None:
        return []
    skipped = run.skipped_steps()
    n_skip = int(skipped[skipped.index > WARMUP_STEPS].sum())
    total = int(skipped.sum())
    rate = n_skip / n_steps if n_steps > 0 else 0.0
    early = total - n_skip  # skipped at or before step WARMUP_STEPS
    sev_rate = None
    if n_steps > 0 and rate > SKIP_RATE_WARN:
        sev_rate = "error" if rate > SKIP_RATE_ERROR else "warning"
    sev_early = None
    if early > WARMUP_SKIP_ALLOWANCE:
        sev_early = "error" if early > WARMUP_SKIP_ERROR else "warning"
    if sev_rate is None and sev_early is None:
        return []
    severity = "error" if "error" in (sev_rate, sev_early) else "warning"
    if sev_rate is not None:
        title = f"{pct(rate)} of steps skipped for non-finite gradients"
    else:
        title = f"{early} steps skipped for non-finite gradients in the first {WARMUP_STEPS}"
    scales = _scales(run)
    return [
        RULE.finding(
            severity,
            title,
            f"{total} steps skipped in all (only the cumulative count was recorded): {early} at "
            f"or before step {WARMUP_STEPS}, {n_skip} of {max(n_steps, 0)} after it; the "
            "dynamic scale expects about 1 per 2000"
            + (f"; {scales['text']}" if scales["text"] else ""),
            fix="# record the per-step skip flag to see each skip's cause:\n"
            "mpwatch.MixedPrecisionMonitor(log_dir)  # with loss_scale=True (the default)",
            data={
                "skipped": n_skip,
                "steps": n_steps,
                "rate": rate,
                "total": total,
                "early": early,
                "max_overflow_scale": scales["max_scale"],
                "max_overflow_step": scales["max_step"],
                "min_overflow_scale": scales["min_scale"],
            },
        )
    ]


def _outputs_float32(run: Run) -> bool:
    """Whether the layer table marks the model's outputs and every one computes in float32
    (advice to keep them float32 would change nothing)."""
    lt = run.layers
    if not len(lt) or not {"is_output", "compute_dtype"} <= set(lt):
        return False
    outs = lt[lt["is_output"].fillna(False).astype(bool)]
    return bool(len(outs)) and bool((outs["compute_dtype"].astype(str) == "float32").all())


def _scales(run: Run) -> dict:
    """The scales the skipped steps ran at (``scale_facts.overflows``): the largest that
    overflowed and when, the smallest, as a sentence and as numbers."""
    ovs = [o for o in sf.overflows(run) if o.scale is not None]
    if not ovs:
        return {"text": "", "max_scale": None, "max_step": None, "min_scale": None}
    top = max(ovs, key=lambda o: (o.scale, -o.step))
    low = min(ovs, key=lambda o: (o.scale, o.step))
    text = (
        f"the largest scale that overflowed: {se.scale_text(top.scale)} at step {top.step}; the "
        f"smallest: {se.scale_text(low.scale)} at step {low.step}"
    )
    if low.scale <= 1.0:
        text += " (a scale of 1 or less protects nothing: the model itself overflows)"
    return {"text": text, "max_scale": top.scale, "max_step": top.step, "min_scale": low.scale}
