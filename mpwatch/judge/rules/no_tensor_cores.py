"""Rule `no-tensor-cores`: a 16-bit policy on a device without fast 16-bit math.

## What it finds
A run under `mixed_float16` on a CPU or on a GPU of compute capability below 7.0 (no Tensor
Cores), or under `mixed_bfloat16` on a GPU of compute capability below 8.0 or on a CPU, from the
device facts in run_info. When the same logdir holds a float32 run of the same model,
`mixed-vs-float32` measures the step times instead and this finding is left out (one finding per
cause: the measurement wins).

## Why it matters
Mixed precision is faster only where the hardware computes in 16 bits natively: Tensor Cores
(compute capability 7.0+) for float16, compute capability 8.0+ for bfloat16. Elsewhere the 16-bit
math is emulated or converted back and forth, and the casts come on top: the TensorFlow guide
says such devices see no speed-up, and on a CPU mixed_float16 is usually slower than float32.
Advice to move more layers to 16 bits is withheld on such a device.

## Threshold
mixed_float16 on a CPU, or on a GPU whose compute capability is below 7.0: warning (likely
slower). mixed_bfloat16 on a GPU below 8.0: warning; on a CPU: info (CPUs with native bfloat16
instructions can gain; most do not). No finding when run_info records no device, or a GPU
without its compute capability.

## Example evidence
```text
mixed_float16 on a CPU: likely slower than float32
device CPU (x86_64): float16 math is fast only on a GPU with Tensor Cores (compute capability 7.0
or more); no float32 run of this model in the logdir to measure against
```

## Fix
```python
keras.mixed_precision.set_global_policy("float32")  # on this device; mixed_float16 on a GPU
# with Tensor Cores (compute capability >= 7.0)
# to measure: train the same model under float32 into the same logdir, then mpwatch diagnose
```

## References
- TensorFlow mixed precision guide: the speed-up needs a GPU of compute capability 7.0 or
  higher (bfloat16: TPUs and compute capability 8.0); CPUs and older GPUs see none
  <https://www.tensorflow.org/guide/mixed_precision>
- NVIDIA, Train With Mixed Precision: Tensor Cores, and which GPUs have them
  <https://docs.nvidia.com/deeplearning/performance/mixed-precision-training/index.html>
"""

from __future__ import annotations

from mpwatch.judge.declare import Declared
from mpwatch.judge.finding import Finding
from mpwatch.judge.rule import Rule, compute_dtype, fast_16bit, policy
from mpwatch.read.run import Run

RULE = Rule(
    id="no-tensor-cores",
    title="16-bit policy on a device without fast 16-bit math",
    severities=("info", "warning"),
    doc=__doc__,
)


#: a measured step-time comparison with a float32 run of the same model (mixed-vs-float32)
#: replaces this rule's expectation
DECLARED = Declared(superseded_by=lambda pair: "step_time_ratio" in pair.data)


def check(run: Run) -> list[Finding]:
    """Findings of this rule on one run: at most one."""
    dt = compute_dtype(run)
    if dt not in ("float16", "bfloat16") or not policy(run).startswith("mixed_"):
        return []
    if fast_16bit(run, dt) is not False:
        return []
    dev = run.info.get("device") or {}
    kind = str(dev.get("type") or "")
    cc = dev.get("compute_capability")
    where = "a CPU" if kind == "CPU" else f"a GPU of compute capability {cc}"
    need = "a GPU with Tensor Cores (compute capability 7.0 or more)" if dt == "float16" else (
        "a GPU of compute capability 8.0 or more"
    )  # fmt: skip
    sev = "info" if dt == "bfloat16" and kind == "CPU" else "warning"
    likely = "may be slower" if sev == "info" else "likely slower"
    return [
        RULE.finding(
            sev,
            f"{policy(run)} on {where}: {likely} than float32",
            f"device {kind} ({dev.get('name') or 'unnamed'})"
            + (f", compute capability {cc}" if cc else "")
            + f": {dt} math is fast only on {need}; no float32 run of this model in the logdir "
            "to measure against",
            fix=(
                'keras.mixed_precision.set_global_policy("float32")  # on this device\n'
                f"# {policy(run)} pays off on {need}\n"
                "# to measure: train the same model under float32 into the same logdir, then "
                "run mpwatch diagnose on the logdir"
            ),
            action={"policy": "float32"},
            data={"device": dict(dev), "compute_dtype": dt},
        )
    ]
