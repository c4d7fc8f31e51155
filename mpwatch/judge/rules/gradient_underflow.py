"""Rule `gradient-underflow`: gradients underflow to zero in the run's 16-bit format.

## What it finds
From the latest reliable probe of the run's own policy (float16 under `mixed_float16`, bfloat16
under `mixed_bfloat16`), which runs the same batch in 16 bits and against a float32 reference: the
share of the reference's nonzero gradient values that are zero in 16 bits (at the loss scale used,
under float16), model-wide, and the layers that lose most, in one finding. A layer fed integer ids
that a 16-bit cast rounds (the `id-rounding` rule) is left out: its mixed gradient lands on other
embedding rows than the reference's, and those zeros are not underflow. Nor are zeros of values
float16 holds: where the probe's sweep puts less than half of the measured zeros below float16's
smallest subnormal at the scale used (``|g_ref| * S < 2^-24``), the rest are the 16-bit backward
pass computing zero (cancellation, a saturated activation): said as info, with no scale advice,
since no loss scale brings them back. Under float16 the fix is
the `loss-scale` rule's advice, computed from the same evidence (never a scale that the sweep
predicts to lose more). A float16 run without a usable probe: the share of the training gradients,
scaled, in float16's subnormal range (precision lost, not yet underflow). Nothing about float16 is
said of a bfloat16 run.

## Why it matters
Gradient values below the format's smallest subnormal (2^-24 in float16, after the loss scale)
become zero: those weights stop learning. The probe counts them against a float32 reference, so
dead ReLUs are not counted. bfloat16 has float32's exponent range: a gradient float32 computes
as a normal number is never too small for it, so zeros in bfloat16 where float32 has none are the
16-bit computation taking another path (a ReLU off, an exact cancellation, rounded inputs), not
underflow: said as info, with nothing to change for underflow. No loss scale is used there.

## Threshold
Latest probe's model-wide underflow fraction > {UNDERFLOW_WARN:g}: warning, > {UNDERFLOW_ERROR:g}:
error; layers above {LAYER_UNDERFLOW_WARN:g} are named in it (at most {LAYERS_NAMED}), or, when
the model-wide fraction is below {UNDERFLOW_WARN:g}, make one warning of their own to keep them in
float32; only info, with no layer to change, when skipped steps brought the loss scale below the
one the probe's gradients allow (the overflow is the cause: fixed, the scale grows). A probe its
recorder marked unreliable is not used. Without a usable probe, on a float16 run only: median
share of subnormal scaled gradients over the last quarter of logged steps > {SUBNORMAL_WARN:g}:
info.

## Example evidence
```text
33.0% of gradient values underflow to zero in float16 at loss scale 2^15 (32768)
probe at step 400: 330 of 1000 reference-nonzero gradient elements are zero in float16 at scale
2^15 (32768); layers losing more than 5.00%: 'dense_19' 80.0%, 'dense_18' 41.0%; the loss-scale
advice: Start the loss scale at 2^22 (4194304) (predicted underflow 0.04%; 33.0%
measured at 2^15 (32768))
```

## Fix
```python
# the loss-scale rule's advice, for example:
optimizer = keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=4194304)
# when no single scale fits, or in bfloat16: keep the named layers in float32
model = mpwatch.apply_recommendations(model, findings).model
# without a probe, measure underflow against a float32 reference:
mpwatch.MixedPrecisionMonitor(log_dir=..., probe_every=...)
```

## References
- Micikevicius et al. 2017, Mixed Precision Training: loss scaling keeps small gradient values
  out of float16's underflow
  <https://arxiv.org/abs/1710.03740>
- NVIDIA, Train With Mixed Precision: gradient values below float16's range become zero
  <https://docs.nvidia.com/deeplearning/performance/mixed-precision-training/index.html>
- Keras LossScaleOptimizer: `initial_scale` and dynamic scaling
  <https://keras.io/api/optimizers/loss_scale_optimizer/>
- TensorFlow mixed precision guide: float16 and bfloat16, and why only float16 needs loss scaling
  <https://www.tensorflow.org/guide/mixed_precision>
"""

from __future__ import annotations

import math
from typing import Any

from mpwatch import contract
from mpwatch.judge.declare import Declared
from mpwatch.judge.evidence import scale_advice as sa
from mpwatch.judge.evidence import scale_evidence as se
from mpwatch.judge.evidence import scale_facts as sf
from mpwatch.judge.finding import Finding
from mpwatch.judge.fixes.fix import layers_code
from mpwatch.judge.rule import (
    UNDERFLOW_WARN,
    Rule,
    compute_dtype,
    finite,
    fmt,
    pct,
)
from mpwatch.read.run import ProbeResult, Run

UNDERFLOW_ERROR = 0.10  # model-wide underflow fraction at the scale used
LAYER_UNDERFLOW_WARN = se.LAYER_UNDERFLOW_WARN  # one layer's underflow fraction
SUBNORMAL_WARN = 0.05  # share of scaled training gradients in float16's subnormal range

RULE = Rule(
    id="gradient-underflow",
    title="Gradients underflow in the run's 16-bit format",
    severities=("info", "warning", "error"),
    doc=__doc__,
    thresholds={
        "UNDERFLOW_WARN": UNDERFLOW_WARN,
        "UNDERFLOW_ERROR": UNDERFLOW_ERROR,
        "LAYER_UNDERFLOW_WARN": LAYER_UNDERFLOW_WARN,
        "LAYERS_NAMED": sa.LAYERS_NAMED,
        "SUBNORMAL_WARN": SUBNORMAL_WARN,
    },
)

def _keep_fix(run: Run, layers: list[tuple[str, Any]]) -> str:
    """Keep these layers in float32, as code: one line each (a layer that holds layers: all of
    it), then how to apply it (:func:`mpwatch.judge.fixes.fix.layers_code`)."""
    return layers_code([n for n, _ in layers], run)


#: loss-scale's finding with the model-wide finding's action is the same advice (the two rules
#: share mpwatch.judge.evidence.scale_evidence): said once, here
DECLARED = Declared(same_advice_as=("loss-scale",))


def check(run: Run) -> list[Finding]:
    """Findings of this rule on one run."""
    cd = compute_dtype(run)
    mode = "bfloat16" if cd == "bfloat16" else "float16"
    probe = run.latest_probe(modes=(mode,))  # reliable probes only
    if probe is not None and finite(probe.model.get("underflow_fraction")) is not None:
        return _from_probe(run, probe, mode)
    if mode != "float16" or cd not in ("float16", ""):
        return []  # nothing float16-specific on a bfloat16 (or float32) run
    # no usable probe: the training gradients' subnormal share tells precision loss, not underflow
    sub = run.scalar(contract.GRAD_SUBNORMAL_FRACTION)
    if not len(sub):
        return []
    tail = sub.iloc[-max(1, len(sub) // 4) :]
    med = float(tail.median())
    if med <= SUBNORMAL_WARN:
        return []
    bad = sf.unreliable_probes(run, "float16")
    why = (
        f"{bad} probe{'s' if bad != 1 else ''} marked unreliable: true underflow not measured"
        if bad
        else "no probe against a float32 reference recorded: true underflow not measured"
    )
    return [
        RULE.finding(
            "info",
            f"{pct(med)} of scaled gradients are float16 subnormals",
            f"median share of |g*S| < 2^-14 over the last {len(tail)} logged steps: {fmt(med)} "
            f"({why})",
            fix="mpwatch.MixedPrecisionMonitor(log_dir=..., probe_every=...)"
            "  # measure underflow against a float32 reference",
            data={"subnormal_fraction": med},
        )
    ]


def _bfloat16_zeros(
    run: Run, probe: ProbeResult, model: dict[str, Any], uf: float | None, layers_table: Any,
    note: str,
) -> list[Finding]:  # fmt: skip
    """bfloat16 has float32's exponent range: a gradient float32 computes as a normal number is
    never too small for bfloat16, so its zeros there are a different computation, not underflow.
    At most an info, with nothing to change for underflow."""
    layers = se.underflowing_layers(run, layers_table, LAYER_UNDERFLOW_WARN, UNDERFLOW_WARN)
    if not (uf is not None and uf > UNDERFLOW_WARN) and not layers:
        return []
    where = f"; most in {sa.names_text(layers)}" if layers else ""
    return [
        RULE.finding(
            "info",
            f"{pct(uf)} of gradient values are zero in bfloat16 where float32's are not: not "
            "underflow",
            f"probe at step {probe.step}: {fmt(finite(model.get('underflow_count')))} of "
            f"{fmt(finite(model.get('ref_nonzero')))} reference-nonzero gradient elements are "
            f"zero in bfloat16{note}{where}; bfloat16 has float32's exponent range (smallest "
            "normal 2^-126), so these zeros come from the 16-bit computation taking another "
            "path (a ReLU off where float32's is on, terms that cancel exactly at bfloat16's "
            "precision, rounded inputs), not from the gradients' size",
            fix="# nothing to change for underflow: the output-error findings say where the "
            "16-bit forward pass departs from float32",
            data={
                "step": probe.step,
                "mode": "bfloat16",
                "underflow_fraction": uf,
                "layers": [n for n, _ in layers],
            },  # fmt: skip
        )
    ]


def _from_probe(run: Run, probe: ProbeResult, mode: str) -> list[Finding]:
    step, model = probe.step, dict(probe.model)
    uf = finite(model.get("underflow_fraction"))
    # layers fed integer ids that the cast rounded: their zeros are the wrong rows (id-rounding)
    excluded = sf.id_rounded_layers(run, step)
    layers_table = probe.layers
    if excluded:
        layers_table, frac, count, nonzero = sf.without_layers(probe.layers, excluded)
        if frac is not None:
            uf = frac
            model.update(underflow_count=count, ref_nonzero=nonzero)
    note = (
        f" (leaving out {', '.join(map(repr, excluded))}: fed integer ids that a {mode} cast "
        "rounds, see id-rounding; its gradient lands on other rows)"
        if excluded
        else ""
    )
    if mode == "bfloat16":
        return _bfloat16_zeros(run, probe, model, uf, layers_table, note)
    scale = finite(model.get("loss_scale")) if mode == "float16" else None
    at = f" at loss scale {se.scale_text(scale)}" if scale else ""
    in_range = _below_range(run, step, scale)
    if uf is not None and uf > UNDERFLOW_WARN and in_range is not None and in_range < uf / 2:
        return _zeros_in_range(probe, model, uf, in_range, layers_table, run, note, at)
    if uf is not None and uf > UNDERFLOW_WARN:
        # the layers that lose most: above LAYER_UNDERFLOW_WARN, else above UNDERFLOW_WARN
        layers = se.underflowing_layers(run, layers_table, LAYER_UNDERFLOW_WARN, UNDERFLOW_WARN)
        lines = [
            f"probe at step {step}: {fmt(finite(model.get('underflow_count')))} of "
            f"{fmt(finite(model.get('ref_nonzero')))} reference-nonzero gradient elements are "
            f"zero in {mode}{at.replace(' loss scale', ' scale')}{note}"
        ]
        if layers:
            least = min(u for _, u in layers)
            over = LAYER_UNDERFLOW_WARN if least > LAYER_UNDERFLOW_WARN else UNDERFLOW_WARN
            lines.append(f"layers losing more than {pct(over)}: {sa.names_text(layers)}")
        fix, action, advice = "", {}, {}
        if mode == "float16":
            adv = se.advise(run)
            if adv.latest is not None and adv.latest.step == step and adv.kind in (
                "change", "range", "unpredicted"
            ):  # fmt: skip
                lines.append(f"the loss-scale advice: {adv.headline}")
                fix, action = adv.fix, adv.action
                advice = adv.summary()
            elif adv.latest is not None and adv.latest.step == step and adv.kind == "stays":
                lines.append(
                    "no loss scale the run's overflows and the probe's margin allow is predicted "
                    "to halve it"
                )
        if not fix and layers:
            fix = _keep_fix(run, layers)
            action = {"float32_layers": [n for n, _ in layers]}
        if not fix:
            lines.append(f"no layer loses more than {pct(UNDERFLOW_WARN)}: the loss is spread thin")
            fix = (
                "# spread over many layers: keep the model in float32, or probe more often to see "
                "where it starts\nmpwatch.MixedPrecisionMonitor(log_dir=..., probe_every=...)"
            )
        return [
            RULE.finding(
                "error" if uf > UNDERFLOW_ERROR else "warning",
                f"{pct(uf)} of gradient values underflow to zero in {mode}{at}",
                "; ".join(lines),
                fix=fix,
                layer=layers[0][0] if len(layers) == 1 else None,
                action=action,
                data={
                    "step": step,
                    "mode": mode,
                    "underflow_fraction": uf,
                    "loss_scale": scale,
                    "layers": [n for n, _ in layers],
                    **advice,
                },
            )
        ]
    layers = se.underflowing_layers(run, layers_table, LAYER_UNDERFLOW_WARN, None)
    if not layers:
        return []
    n = len(layers)
    title = (
        f"{n} layer{'s' if n != 1 else ''} lose{'s' if n == 1 else ''} more than "
        f"{pct(LAYER_UNDERFLOW_WARN)} of {'their' if n != 1 else 'its'} gradient values to "
        f"underflow in {mode}"
    )
    evidence = (
        f"probe at step {step}{at}: {sa.names_text(layers)} of the reference's nonzero "
        f"gradient values are zero in {mode} (model-wide {pct(uf or 0.0)}){note}"
    )
    data = {"step": step, "mode": mode, "underflow_fraction": uf,
            "layers": {name: u for name, u in layers}}  # fmt: skip
    held = _held_down(run, probe, scale) if mode == "float16" else None
    if held is not None:
        # the scale is low because steps overflowed: the overflow is the cause, not these layers
        count, allowed = held
        return [
            RULE.finding(
                "info",
                title + f" at a loss scale held down by {count} overflows",
                evidence + f"; {count} skipped steps brought the scale down to "
                f"{se.scale_text(scale)} while this probe's gradients allow "
                f"{se.scale_text(allowed)}: what overflows drives the scale down, and these "
                "layers lose less at a higher one",
                fix="# fix what overflows first (the skipped-steps, output-16bit and "
                "activation-overflow findings); the loss scale then grows by itself",
                data=data | {"held_down_by_overflows": count, "allowed_scale": allowed},
            )
        ]
    return [
        RULE.finding(
            "warning",
            title,
            evidence,
            fix=_keep_fix(run, layers),
            layer=layers[0][0] if n == 1 else None,
            action={"float32_layers": [name for name, _ in layers]},
            data=data,
        )
    ]


def _below_range(run: Run, step: int, scale: float | None) -> float | None:
    """The share of the probe's reference-nonzero gradient values below float16's range at its
    loss scale (``|g_ref| * S < 2^-24``: what can underflow; the sweep or the histogram), or
    None where the probe measured neither."""
    if not scale:
        return None
    view = next((v for v in sf.float16_probes(run) if v.step == step), None)
    return None if view is None else view.under(math.log2(scale))


def _zeros_in_range(
    probe: ProbeResult, model: dict[str, Any], uf: float, below: float, layers_table: Any,
    run: Run, note: str, at: str,
) -> list[Finding]:  # fmt: skip
    """Most of the zeros are values float16 holds at this scale (the reference times the scale
    above 2^-24): the 16-bit backward pass computed them as zero (terms cancelling at float16's
    precision, an activation saturated or a ReLU off where float32's is not), not underflow. No
    loss scale brings them back; the gradient-error findings measure what they cost."""
    layers = se.underflowing_layers(run, layers_table, LAYER_UNDERFLOW_WARN, UNDERFLOW_WARN)
    where = f"; most in {sa.names_text(layers)}" if layers else ""
    return [
        RULE.finding(
            "info",
            f"{pct(uf)} of gradient values are zero in float16 where float32's are not, but only "
            f"{pct(below)} lie below its range{at}: not underflow",
            f"probe at step {probe.step}: {fmt(finite(model.get('underflow_count')))} of "
            f"{fmt(finite(model.get('ref_nonzero')))} reference-nonzero gradient elements are "
            f"zero in float16{at.replace(' loss scale', ' scale')}{note}{where}; at that scale "
            f"{pct(below)} of the reference's values fall below float16's smallest subnormal "
            "(2^-24), so the rest are values float16 can hold: the 16-bit backward pass computed "
            "them as zero (terms that cancel at float16's precision, an activation saturated, a "
            "ReLU off where float32's is on), and no loss scale brings them back",
            fix="# nothing to change for underflow (a larger loss scale does not help): the "
            "gradient-error and output-error findings say where the 16-bit pass departs",
            data={
                "step": probe.step,
                "mode": "float16",
                "underflow_fraction": uf,
                "below_range_fraction": below,
                "layers": [n for n, _ in layers],
            },  # fmt: skip
        )
    ]


def _held_down(run: Run, probe: ProbeResult, scale: float | None) -> tuple[int, float] | None:
    """(skipped steps, the probe's recommended scale) when skipped steps brought the loss scale
    below the one the probe's gradients allow (its recommended scale: margin kept), else None."""
    rec = finite(probe.model.get("recommended_scale"))
    if not scale or not rec or rec <= scale:
        return None
    count = sum(o.count for o in sf.overflows(run) if o.step <= probe.step)
    return (count, rec) if count else None
