"""Rule `mixed-vs-float32`: a mixed-precision run compared with a float32 run of the same model.

A rule about two runs: `check_pair(mixed, fp32)` takes the mixed run and the float32 run, and
`mpwatch.judge.diagnose_runs` pairs them (`compare_all` in `mpwatch/judge/diagnose.py`): every run
whose policy starts with `mixed_` with the first float32 run of the same model. Same model means
the same structure: the same parameter count and, layer by layer in the layer table, the same
classes and parameter counts (layer and model names are not compared: Keras numbers them per
session); where either run has no layer table, the same model name, class and parameter count.
Two models that merely have the same parameter count are not compared. The finding belongs to
the mixed run; on a device without fast 16-bit math it replaces `no-tensor-cores` (the
measurement wins).

## What it finds
The median step time (after the first logged interval), the peak memory and the final training
loss (mean over the last tenth of the steps both runs logged) of the mixed run against the
float32 run.

## Why it matters
The point of mixed precision is speed and memory at the same loss. The speed-up is not
guaranteed: a small model, or one bound by input or casts, can show none. Measure it.

## Threshold
Same model in one logdir: step-time ratio (mixed / float32) above {SLOWER_RATIO:g}: warning (no
speed-up; "slower" above 1, with the device when it has no fast 16-bit math); final training
losses differing by more than {LOSS_AGREE_REL:.0%} of the float32 loss: warning; otherwise info
with the ratios.

## Example evidence
```text
'mixed' (mixed_float16) vs 'fp32' (float32): no speed-up, losses differ
step time 30 ms vs 25 ms (x1.20, speed-up 0.83x); peak memory 400 MiB vs 800 MiB (x0.50); final
training loss 0.01026 vs 0.005234 (96.1% apart: DIFFER)
```

## Fix
```python
# slower on a device without fast 16-bit math (a CPU, a GPU below compute capability 7.0):
keras.mixed_precision.set_global_policy("float32")  # on this device
# no speed-up on a GPU with Tensor Cores: check multiples of 8 and the profile's Cast share
# losses differ: see the underflow and output findings
```

## References
- TensorFlow mixed precision guide: the speed-ups to expect, and on which GPUs
  <https://www.tensorflow.org/guide/mixed_precision>
- NVIDIA, Train With Mixed Precision: matching float32 accuracy, and measuring the speed-up
  <https://docs.nvidia.com/deeplearning/performance/mixed-precision-training/index.html>
- Micikevicius et al. 2017, Mixed Precision Training: mixed and float32 runs reach the same loss
  <https://arxiv.org/abs/1710.03740>
"""

from __future__ import annotations

from typing import Any

from mpwatch import contract
from mpwatch.judge.finding import Finding
from mpwatch.judge.rule import Rule, compute_dtype, fast_16bit, pct, policy
from mpwatch.read.run import Run
from mpwatch.words import duration_ms, number

LOSS_AGREE_REL = 0.05  # final losses of a mixed and a float32 run within 5% agree
SLOWER_RATIO = 0.95  # mixed step time / float32 step time above this: no speed-up

RULE = Rule(
    id="mixed-vs-float32",
    title="Mixed run compared with a float32 run of the same model",
    severities=("info", "warning"),
    doc=__doc__,
    thresholds={"LOSS_AGREE_REL": LOSS_AGREE_REL, "SLOWER_RATIO": SLOWER_RATIO},
)


def check_pair(mixed: Run, fp32: Run) -> list[Finding]:
    """Step time, memory and loss of a mixed run against a float32 run of the same model."""
    parts = []
    data: dict[str, Any] = {"float32_run": fp32.name, "mixed_run": mixed.name}
    sev = "info"
    problems = []
    st_m, st_f = mixed.scalar(contract.STEP_TIME_MS), fp32.scalar(contract.STEP_TIME_MS)
    if len(st_m) and len(st_f):
        # skip the first interval (tracing, warm-up)
        tm = float((st_m.iloc[1:] if len(st_m) > 1 else st_m).median())
        tf_ = float((st_f.iloc[1:] if len(st_f) > 1 else st_f).median())
        if tf_ > 0:
            ratio = tm / tf_
            data.update({"step_time_ms_mixed": tm, "step_time_ms_float32": tf_,
                         "step_time_ratio": ratio})  # fmt: skip
            parts.append(f"step time {duration_ms(tm)} vs {duration_ms(tf_)} (x{number(ratio)}, "
                         f"speed-up {number(1 / ratio)}x)")  # fmt: skip
            if ratio > SLOWER_RATIO:
                sev = "warning"
                slower = f", {number(ratio)}x slower" if ratio > 1.05 else ""
                problems.append("no speed-up" + slower)
    mm, mf = mixed.scalar(contract.PEAK_MEMORY_MB), fp32.scalar(contract.PEAK_MEMORY_MB)
    if len(mm) and len(mf) and float(mf.max()) > 0:
        r = float(mm.max()) / float(mf.max())
        data.update({"peak_memory_mb_mixed": float(mm.max()),
                     "peak_memory_mb_float32": float(mf.max()), "memory_ratio": r})  # fmt: skip
        parts.append(f"peak memory {number(float(mm.max()), 4)} MiB vs "
                     f"{number(float(mf.max()), 4)} MiB "
                     f"(x{number(r)})")  # fmt: skip
    lm, lf = mixed.scalar(contract.TRAIN_LOSS), fp32.scalar(contract.TRAIN_LOSS)
    if len(lm) and len(lf):
        common = lm.index.intersection(lf.index)
        if len(common):
            k = max(1, len(common) // 10)
            a = float(lm.loc[common[-k:]].mean())
            b = float(lf.loc[common[-k:]].mean())
            rel = abs(a - b) / max(abs(b), 1e-12)
            agree = rel <= LOSS_AGREE_REL
            data.update({"final_loss_mixed": a, "final_loss_float32": b, "loss_rel_diff": rel,
                         "losses_agree": agree, "common_steps": int(len(common))})  # fmt: skip
            parts.append(f"final training loss {number(a, 4)} vs {number(b, 4)} ({pct(rel)} apart: "
                         f"{'agree' if agree else 'DIFFER'})")  # fmt: skip
            if not agree:
                sev = "warning"
                problems.append("losses differ")
    if not parts:
        return []
    slow_device = fast_16bit(mixed) is False
    dev = mixed.info.get("device") or {}
    title = f"{mixed.name!r} ({policy(mixed)}) vs {fp32.name!r} (float32)"
    if problems:
        title += ": " + ", ".join(problems)
    fixes = []
    action: dict[str, Any] = {}
    if "step_time_ratio" in data and data["step_time_ratio"] > SLOWER_RATIO:
        if slow_device:
            where = "a CPU" if dev.get("type") == "CPU" else (
                f"a GPU of compute capability {dev.get('compute_capability')}"
            )  # fmt: skip
            title += f" on {where}"
            parts.append(f"device {dev.get('type')} ({dev.get('name') or 'unnamed'}): no fast "
                         f"{compute_dtype(mixed)} math")  # fmt: skip
            fixes.append('keras.mixed_precision.set_global_policy("float32")  # on this device')
            action = {"policy": "float32"}
            data["device"] = dict(dev)
        else:
            fixes.append("# no speed-up: check multiples of 8 and the profile's Cast share")
    if data.get("losses_agree") is False:
        fixes.append("# losses differ: see the underflow and output findings")
    fix = "\n".join(fixes) or "# nothing to change"
    return [RULE.finding(sev, title, "; ".join(parts), fix=fix, run=mixed.name, action=action,
                         data=data)]  # fmt: skip
