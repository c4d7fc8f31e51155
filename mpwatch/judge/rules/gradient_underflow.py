"""Rule `gradient-underflow`: gradients underflow to zero in float16 at the loss scale used.

## What it finds
From the latest float16 probe (which runs the same batch in float16 and against a float32
reference): the share of the reference's nonzero gradient values that are zero in float16 at the
loss scale used, model-wide and per layer. Without a probe: the share of the training gradients,
scaled, that fall in float16's subnormal range (precision lost, not yet underflow).

## Why it matters
Gradient values below float16's smallest subnormal (2^-24) become zero: those weights stop
learning. The probe counts them against a float32 reference, so dead ReLUs are not counted.

## Threshold
Latest probe's model-wide underflow fraction > {UNDERFLOW_WARN:g}: warning, >
{UNDERFLOW_ERROR:g}: error; a layer's > {LAYER_UNDERFLOW_WARN:g}: warning. Without a probe:
median share of subnormal scaled gradients over the last quarter of logged steps >
{SUBNORMAL_WARN:g}: info.

## Example evidence
```text
2.00% of gradient values underflow to zero at loss scale 8
probe at step 10: 20 of 1000 reference-nonzero gradient elements are zero in float16 (underflow
fraction 0.02) at scale 8; recommended scale 32768
```

## Fix
```python
optimizer = keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=32768)
# the probe's recommended scale; without one, a dynamic scale:
optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
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
"""

from __future__ import annotations

from mpwatch import contract
from mpwatch.judge.finding import Finding
from mpwatch.judge.rule import UNDERFLOW_WARN, Rule, finite, fmt, pct
from mpwatch.read.run import Run

UNDERFLOW_ERROR = 0.10  # model-wide underflow fraction at the scale used
LAYER_UNDERFLOW_WARN = 0.05  # one layer's underflow fraction
SUBNORMAL_WARN = 0.05  # share of scaled training gradients in float16's subnormal range

RULE = Rule(
    id="gradient-underflow",
    title="Gradients underflow at the loss scale used",
    severities=("info", "warning", "error"),
    doc=__doc__,
    thresholds={
        "UNDERFLOW_WARN": UNDERFLOW_WARN,
        "UNDERFLOW_ERROR": UNDERFLOW_ERROR,
        "LAYER_UNDERFLOW_WARN": LAYER_UNDERFLOW_WARN,
        "SUBNORMAL_WARN": SUBNORMAL_WARN,
    },
)


def check(run: Run) -> list[Finding]:
    """Findings of this rule on one run."""
    probe = run.latest_probe(modes=("float16",))
    found: list[Finding] = []
    if probe is not None:
        step, model, layers = probe.step, probe.model, probe.layers
        uf = finite(model.get("underflow_fraction"))
        scale = finite(model.get("loss_scale"))
        rec = finite(model.get("recommended_scale"))
        fix = (
            "optimizer = keras.optimizers.LossScaleOptimizer(optimizer, "
            f"initial_scale={rec:g})" if rec else
            "optimizer = keras.optimizers.LossScaleOptimizer(optimizer)  # dynamic scale"
        )  # fmt: skip
        if uf is not None and uf > UNDERFLOW_WARN:
            found.append(
                RULE.finding(
                    "error" if uf > UNDERFLOW_ERROR else "warning",
                    f"{pct(uf)} of gradient values underflow to zero at loss scale {fmt(scale)}",
                    f"probe at step {step}: {fmt(finite(model.get('underflow_count')))} of "
                    f"{fmt(finite(model.get('ref_nonzero')))} reference-nonzero gradient elements "
                    "are zero in "
                    f"float16 (underflow fraction {fmt(uf)}) at scale {fmt(scale)}; "
                    f"recommended scale {fmt(rec)}",
                    fix=fix,
                    action={"loss_scale": rec} if rec else {},
                    data={
                        "step": step,
                        "underflow_fraction": uf,
                        "loss_scale": scale,
                        "recommended_scale": rec,
                    },
                )  # fmt: skip
            )
        if len(layers) and "underflow_fraction" in layers:
            for _, r in layers.iterrows():
                luf = finite(r.get("underflow_fraction"))
                if luf is None or luf <= LAYER_UNDERFLOW_WARN:
                    continue
                name = str(r["layer"])
                found.append(
                    RULE.finding(
                        "warning",
                        f"{pct(luf)} of the gradient values of layer {name!r} underflow",
                        f"probe at step {step}: {fmt(finite(r.get('underflow_count')))} of "
                        f"{fmt(finite(r.get('ref_nonzero')))} nonzero reference gradient elements "
                        f"of {name!r} are zero at scale {fmt(scale)}",
                        fix=fix,
                        layer=name,
                        action={"loss_scale": rec} if rec else {},
                        data={"step": step, "underflow_fraction": luf},
                    )
                )
        return found
    # no probe: the training gradients' subnormal share tells precision loss, not underflow
    sub = run.scalar(contract.GRAD_SUBNORMAL_FRACTION)
    if len(sub):
        tail = sub.iloc[-max(1, len(sub) // 4) :]
        med = float(tail.median())
        if med > SUBNORMAL_WARN:
            found.append(
                RULE.finding(
                    "info",
                    f"{pct(med)} of scaled gradients are float16 subnormals",
                    f"median share of |g*S| < 2^-14 over the last {len(tail)} logged steps: "
                    f"{fmt(med)} (no probe recorded: true underflow not measured)",
                    fix="mpwatch.MixedPrecisionMonitor(log_dir=..., probe_every=...)"
                    "  # measure underflow against a float32 reference",
                    data={"subnormal_fraction": med},
                )
            )
    return found
