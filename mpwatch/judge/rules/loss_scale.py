"""Rule `loss-scale`: the loss scale is stuck low, or the gradients need a scale it does not reach.

## What it finds
The loss-scale advice from the whole run (``mpwatch.judge.evidence.scale_evidence``): the scale
history
and every skipped step (the scale each ran at: the largest that overflowed, and when), every
reliable float16 probe's sweep of predicted underflow and overflow per power-of-two scale (not
only the last), and Keras' dynamic rule (halve on overflow, double after `dynamic_growth_steps`
finite steps). It proposes `initial_scale`, `dynamic_growth_steps`, or, when no single scale fits
the gradients, the layers to keep in float32. Every proposed value comes with the underflow and
overflow the sweep predicts there. Also a dynamic scale stuck at 1 or below.

## Why it matters
Gradient values below float16's smallest subnormal (2^-24) after scaling become zero and their
weights stop learning; a larger loss scale keeps them, up to the point where the largest gradients
overflow (a skipped step, the scale halved). Keras' dynamic scale starts at 2^15 and only doubles
every 2000 finite steps: when the gradients shrink faster than that during training, the scale
lags the one they need. A scale stuck at 1 protects nothing.

## Threshold
Median scale over the last quarter of logged steps <= {SCALE_STUCK_LOW:g}: error (where the compiled
optimizer never stepped and a model's own LossScaleOptimizers did, as a GAN's: each one's final
scale, from the ``train_step`` record, judged alone). Otherwise silent
unless the latest reliable float16 probe measures underflow of at least {UNDERFLOW_MATERIAL:g} of
the reference's nonzero gradient values at the scale used (then a warning). A probe allows a scale
when its sweep predicts no overflow there and its largest reference gradient (activation gradients
included) stays at least {HEADROOM_BITS} doublings below 65504 (room for batches whose gradients
are up to 2^{HEADROOM_BITS} times the probe's). The target is the smallest power of two above the
scale used whose predicted underflow is at most {UNDERFLOW_NEGLIGIBLE:g} (else the largest
candidate), allowed by the latest probe and below every scale that overflowed after the first
{START_STEPS} steps; its predicted underflow must be at least {UNDERFLOW_MATERIAL:g} below the one
predicted at the scale used. `initial_scale` is the target lowered to what every probe allows and
to below every scale that overflowed in the run: overflows in the first {START_STEPS} steps (the
descent at initialisation) bar an initial scale at or above them, since the run would skip again
and halve back, but not a level the scale climbs to later; later overflows bar both. It is proposed
only above the run's initial scale and the scale used, where the sweep predicts less underflow
(never Keras' default when the run used it, never lower: a lower scale only loses more). The
earliest probe stands for the start; should the start's gradients be larger, the scale halves back
in a few skipped steps (a scale too high is lowered far more quickly than one too low is raised, as
Keras' documentation says). `dynamic_growth_steps` is proposed when the need rises over the probes
faster than one doubling per `dynamic_growth_steps` (least-squares slope over at least two probes
and two doublings), or when, doubling once per `dynamic_growth_steps` from where the scale starts
(the proposed initial scale, else where the descent of the first {START_STEPS} steps left it), it
would miss a probe's need by that probe's step: the largest of {GROWTH_LADDER} that keeps up, at
least {MIN_GROWTH_STEPS} (a failed doubling per {MIN_GROWTH_STEPS} steps already skips 1% of them),
and below the run's own. When even the best allowed scale predicts underflow of at least
{UNDERFLOW_MATERIAL:g}, no single scale fits: the layers losing more than {LAYER_UNDERFLOW_WARN:g}
at the scale used are named to keep in float32, with the model-wide underflow their per-layer
counts leave (or `mixed_bfloat16` on a GPU of compute capability {BFLOAT16_MIN_CC:g} or more).
Measured underflow that is material while the sweep predicts less than {UNDERFLOW_MATERIAL:g} at
the scale used is lost inside the backward pass, which the sweep does not predict: no scale is
proposed, the layers are named. A probe its recorder marked unreliable, or one without a float32
reference, is not used; layers fed integer ids that a float16 cast rounds (`id-rounding`) are left
out of the measured underflow.

## Example evidence
```text
Start the loss scale at 2^22 (4194304) (predicted underflow 0.04%; 33.0% measured at 2^15 (32768))
probe at step 400: 33.0% of the reference's nonzero gradient values are zero in float16 at the
scale used, 2^15 (32768) (the sweep predicts 34.1%); no skipped step: no scale the run used
overflowed; the run's LossScaleOptimizer: initial_scale=32768, dynamic_growth_steps=2000; predicted
at 2^22 (4194304) (initial_scale): underflow 0.04%, overflow 0% at step 400; at most 0% overflow in
any of the 2 probes
```

## Fix
```python
optimizer = keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=4194304)
# gradients that shrink faster than the scale grows:
optimizer = keras.optimizers.LossScaleOptimizer(optimizer, dynamic_growth_steps=200)
# no single scale fits: keep the named layers in float32
model = mpwatch.apply_recommendations(model, findings).model
```

## References
- Keras LossScaleOptimizer: the dynamic scale starts at 2^15, halves on a non-finite gradient and
  doubles after `dynamic_growth_steps` (2000) finite steps
  <https://keras.io/api/optimizers/loss_scale_optimizer/>
- TensorFlow mixed precision guide: loss scaling, and how the dynamic scale is chosen
  <https://www.tensorflow.org/guide/mixed_precision>
- NVIDIA, Train With Mixed Precision: choosing a scaling factor, and dynamic loss scaling
  <https://docs.nvidia.com/deeplearning/performance/mixed-precision-training/index.html>
- Micikevicius et al. 2017, Mixed Precision Training: the range of gradient values against
  float16's, and loss scaling
  <https://arxiv.org/abs/1710.03740>
"""

from __future__ import annotations

from mpwatch import contract
from mpwatch.judge.evidence import scale_evidence as se
from mpwatch.judge.evidence import scale_facts as sf
from mpwatch.judge.finding import Finding
from mpwatch.judge.rule import Rule
from mpwatch.read.run import Run

SCALE_STUCK_LOW = 1.0  # a final dynamic scale at or below this cannot protect gradients

RULE = Rule(
    id="loss-scale",
    title="Loss scale stuck low, or short of the one the gradients need",
    severities=("warning", "error"),
    doc=__doc__,
    thresholds={
        "SCALE_STUCK_LOW": SCALE_STUCK_LOW,
        "UNDERFLOW_MATERIAL": se.UNDERFLOW_MATERIAL,
        "UNDERFLOW_NEGLIGIBLE": se.UNDERFLOW_NEGLIGIBLE,
        "HEADROOM_BITS": se.HEADROOM_BITS,
        "START_STEPS": sf.START_STEPS,
        "GROWTH_LADDER": se.GROWTH_LADDER,
        "MIN_GROWTH_STEPS": se.MIN_GROWTH_STEPS,
        "LAYER_UNDERFLOW_WARN": se.LAYER_UNDERFLOW_WARN,
        "BFLOAT16_MIN_CC": sf.BFLOAT16_MIN_CC,
    },
)


def _stuck_fix(run: Run) -> str:
    """How to find the layer that overflows at every scale: a probe names it and checks keeping
    it float32 on its batch (where it did, this finding is evidence of that one's)."""
    if not len(run.probe_model):
        return (
            "# no probe ran to name the layer that overflows: one probes a batch, names the\n"
            "# first layer that is not finite and checks keeping it float32 on that batch\n"
            "mpwatch.MixedPrecisionMonitor(log_dir, probe_every=N)"
        )
    return (
        "# the probe's batch (Dropout off) did not show which layer overflows: probe a\n"
        "# training batch that skipped\n"
        "mpwatch.MixedPrecisionMonitor(log_dir, probe_data=(x_batch, y_batch))"
    )


def _own_optimizers_stuck(run: Run, scales: dict[str, float | None]) -> list[Finding]:
    """Where the compiled optimizer never stepped (a GAN's own LossScaleOptimizers did): the
    recorded scale series is the idle one's; each stepping optimizer's final scale, from the
    ``train_step`` record, at or below the stuck threshold is an error."""
    stuck = {n: v for n, v in scales.items() if v is not None and v <= SCALE_STUCK_LOW}
    if not stuck:
        return []
    said = ", ".join(f"{n!r} {se.scale_text(v)}" for n, v in stuck.items())
    return [
        RULE.finding(
            "error",
            f"Loss scale of {', '.join(repr(n) for n in stuck)} stuck at or below "
            f"{SCALE_STUCK_LOW:g}",
            f"final loss scale of the optimizers the train step ran (the train_step record; "
            f"the compiled optimizer never stepped, so mpwatch's loss-scale series is not this "
            f"training's): {said}. A scale this low means the passes whose loss it scales "
            "overflow float16 at any scale: their updates are skipped.",
            fix=(
                "# no forward pass of the model's own for a probe to run: keep the sub-model\n"
                "# this optimizer trains in float32 to confirm, then narrow it down to its\n"
                "# layers (its last layers and any output it returns in float16 first)"
            ),
            data={"optimizers": stuck},
        )
    ]


def check(run: Run) -> list[Finding]:
    """Findings of this rule on one run."""
    scales = run.stepping_loss_scales()
    if scales is not None:  # the recorded series is an idle compiled optimizer's
        return _own_optimizers_stuck(run, scales)
    found: list[Finding] = []
    ls = run.scalar(contract.LOSS_SCALE)
    med = None
    if len(ls):
        steps = ls[ls.index > 0] if (ls.index > 0).any() else ls  # step 0: the initial scale
        tail = steps.iloc[-max(1, len(steps) // 4) :]
        med = float(tail.median())
        if med <= SCALE_STUCK_LOW:
            found.append(
                RULE.finding(
                    "error",
                    f"Loss scale stuck at {se.scale_text(med)}",
                    f"median dynamic loss scale over the last {len(tail)} logged steps "
                    f"(steps {int(tail.index[0])}-{int(tail.index[-1])}): {se.scale_text(med)}; "
                    f"minimum {se.scale_text(float(steps.min()))}. A scale this low means the "
                    "forward or backward pass itself overflows float16.",
                    fix=_stuck_fix(run),
                    data={"median_scale": med, "min_scale": float(steps.min())},
                )
            )
    if med is not None and med <= SCALE_STUCK_LOW:
        return found  # every scale overflows: no scale to propose
    adv = se.advise(run)
    if adv.kind not in ("change", "range", "unpredicted") or adv.latest is None:
        return found
    lt = adv.latest
    fix = adv.fix
    if not fix:  # the range problem, no layer to name and no bfloat16 on this device
        fix = (
            "# no single scale fits and no layer stands out: the probe's per-layer table shows "
            "where gradients are smallest\nmpwatch.MixedPrecisionMonitor(log_dir=..., "
            "probe_every=...)"
        )
    found.append(
        RULE.finding(
            "warning",
            adv.headline,
            "; ".join(adv.lines),
            fix=fix,
            action=adv.action,
            data={
                "kind": adv.kind,
                "probe_step": lt.step,
                "scale_used": lt.scale,
                "underflow_at_used": lt.measured,
                "initial_scale": adv.initial_scale,
                "dynamic_growth_steps": adv.growth_steps,
                "target_scale": adv.target,
                "run_initial_scale": adv.run_initial,
                "run_dynamic_growth_steps": adv.run_growth,
                "predicted": adv.predicted_rows(),
                "max_overflow_scale": max(
                    (o.scale for o in adv.overflows if o.scale is not None), default=None
                ),
                "layers": [n for n, _ in adv.layers],
                "underflow_with_layers_float32": adv.layers_leave,
                **adv.summary(),
            },
        )
    )
    return found
