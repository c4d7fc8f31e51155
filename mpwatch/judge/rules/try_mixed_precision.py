"""Rule `try-mixed-precision`: a float32 model on hardware that gains from mixed precision.

## What it finds
A run whose policy is float32 on a GPU with Tensor Cores (compute capability 7.0 or more, or
the device facts say Tensor Cores).
Suggests mixed_bfloat16 from compute capability 8.0 (float32's range, no loss scale: the
pre-flight probe's float16 predictions do not apply to it and are not its evidence), and
mixed_float16 below, with what the pre-flight probe (the same batch run by a mixed_float16 twin)
predicts for it: the share of gradient values that would underflow at the initial scale, and the
layers whose activations would overflow or come close. Never on a CPU or a GPU without Tensor
Cores, where 16-bit math is not faster.

## Why it matters
GPUs of compute capability 7.0+ have Tensor Cores for 16-bit math: mixed precision is often
1.5-3x faster and halves activation memory. bfloat16 (8.0+) needs no loss scale.

## Threshold
Policy float32 on a GPU of compute capability >= 7.0: info, suggesting mixed_bfloat16 from
compute capability 8.0, mixed_float16 below; for mixed_float16, with the pre-flight probe's
predicted underflow and overflow when recorded (layers with max |activation| > 65504 /
2^{HEADROOM_WARN_BITS:g} are listed to keep in float32); for mixed_bfloat16, the float16
predictions appear only as the alternative's evidence, in the fix.

## Example evidence
```text
float32 model on hardware that gains from mixed precision: try mixed_float16
policy float32 on Tesla V100 (compute capability 7.0, Tensor Cores); pre-flight at step 5:
3.00% of gradient values would underflow in float16 at the initial scale 32768, max
|activation| 30000; would overflow or come close in float16: dense
```

## Fix
```python
keras.mixed_precision.set_global_policy("mixed_float16")  # before building the model
# keep the output float32:
outputs = keras.layers.Activation("softmax", dtype="float32")(x)
# and keep 'dense' float32: dtype="float32"
```

## References
- TensorFlow mixed precision guide: the speed-up needs a GPU of compute capability 7.0 or
  higher; bfloat16 on newer hardware needs no loss scaling
  <https://www.tensorflow.org/guide/mixed_precision>
- Keras mixed precision API: `keras.mixed_precision.set_global_policy`
  <https://keras.io/api/mixed_precision/>
- NVIDIA, Train With Mixed Precision: Tensor Cores and the speed-ups to expect
  <https://docs.nvidia.com/deeplearning/performance/mixed-precision-training/index.html>
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from mpwatch.formats import FLOAT16, SIXTEEN_BIT
from mpwatch.judge.finding import Finding
from mpwatch.judge.rule import HEADROOM_WARN_BITS, Rule, compute_dtype, finite, fmt, pct, policy
from mpwatch.read.run import Run
from mpwatch.words import loss_scale

RULE = Rule(
    id="try-mixed-precision",
    title="float32 model on hardware that gains from mixed precision",
    severities=("info",),
    doc=__doc__,
    thresholds={"HEADROOM_WARN_BITS": HEADROOM_WARN_BITS},
)


def check(run: Run) -> list[Finding]:
    """Findings of this rule on one run."""
    pol = policy(run)
    if pol and pol != "float32":
        return []
    if not pol and compute_dtype(run) in SIXTEEN_BIT:
        return []
    if not run.info:
        return []
    dev = run.info.get("device") or {}
    cc = finite(str(dev.get("compute_capability") or "").split(" ")[0] or None)
    gains = (str(dev.get("type")) == "GPU" and cc is not None and cc >= 7.0) or (
        dev.get("tensor_cores") is True
    )
    if not gains:
        return []  # a CPU, an older GPU, or an unknown one: 16-bit math is not faster there
    target = "mixed_bfloat16" if cc is not None and cc >= 8.0 else "mixed_float16"
    probe = run.latest_probe(modes=("preflight",))
    evidence = (
        f"policy float32 on {dev.get('name') or 'a GPU'} (compute capability "
        f"{dev.get('compute_capability')}, Tensor Cores)"
    )
    keep: list[str] = []
    data: dict[str, Any] = {"target": target, "compute_capability": cc}
    f16 = ""  # the pre-flight probe's float16 predictions
    if probe is not None:
        model, layers = probe.model, probe.layers
        uf = finite(model.get("underflow_fraction"))
        mx = finite(model.get("max_abs_activation"))
        f16 = (
            f"pre-flight at step {probe.step}: {pct(uf or 0.0)} of gradient values would "
            "underflow in float16 at the initial scale "
            f"{loss_scale(finite(model.get('loss_scale')))}, "
            f"max |activation| {fmt(mx)}"
        )
        data.update({"preflight_underflow_fraction": uf, "preflight_max_abs_activation": mx})
        if len(layers) and "max_abs_activation" in layers:
            mxs = pd.to_numeric(layers["max_abs_activation"], errors="coerce")
            keep = list(layers.loc[mxs > FLOAT16.max / 2**HEADROOM_WARN_BITS, "layer"].astype(str))
            if keep:
                f16 += f"; would overflow or come close in float16: {', '.join(keep)}"
        data["float16_keep_float32"] = keep
    if target == "mixed_float16":
        evidence += "; " + (f16 or "no pre-flight probe recorded")
        data["keep_float32"] = keep
    else:
        evidence += "; bfloat16 has float32's range: no loss scale, no float16 overflow"
        data["keep_float32"] = []
    fix = f'keras.mixed_precision.set_global_policy("{target}")  # before building the model\n'
    fix += "# keep the output float32:\n"
    fix += 'outputs = keras.layers.Activation("softmax", dtype="float32")(x)'
    if target == "mixed_float16":
        for k in keep:
            fix += f'\n# and keep {k!r} float32: dtype="float32"'
    elif f16:
        fix += "\n# mixed_float16 instead (not needed here): " + f16
    return [
        RULE.finding(
            "info",
            f"float32 model on hardware that gains from mixed precision: try {target}",
            evidence,
            fix=fix,
            action={"policy": target},
            data=data,
        )
    ]
