"""Rule `profile`: where the profiled time goes (casts, 16-bit share, float32 layers).

## What it finds
From the profile record (a few steps traced by the profiler): the share of time in Cast ops, the
share of compute time that runs in 16 bits, and the layers under a float32 policy that take a
large share of the time in float32 ops. On a GPU trace with kernels (`source`
`device_kernels`) the 16-bit share and a layer's float32 time are the kernels' (what the GPU ran,
by kernel name; time of unknown precision is counted neither way), elsewhere the ops' (counted in
their layer's dtype).

## Why it matters
Casts between float32 and float16 are pure overhead; float32 layers that could run in 16 bits, or
a low 16-bit share of compute, explain a missing speed-up.

## Threshold
Cast share > {CAST_SHARE_WARN:.0%}: warning; 16-bit share of time < {SHARE_16BIT_WARN:.0%} under a
16-bit policy (on GPU kernels: even with every kernel of unknown precision counted 16-bit):
warning; a float32 layer (its own policy float32; not an output, not one that
computes in float32 inside) taking > {FLOAT32_LAYER_SHARE:.0%} of time under a 16-bit policy:
info. The last two advise more 16-bit compute: not given on a device without fast 16-bit math
(a CPU, a GPU without Tensor Cores: see `no-tensor-cores`).

## Example evidence
```text
20.0% of profiled time is spent in Cast ops
Cast ops 2 ms of 10 ms over steps [5, 8]
```

## Fix
```python
# fewer float32<->float16 boundaries: keep neighbouring layers in one dtype; float features may
# be fed as float16 (within its range); integer ids stay int32: keras.Input(..., dtype="int32")
# (on CPUs and pre-Volta GPUs 16-bit math is emulated: use float32 there)
keras.layers.Dense(..., dtype="mixed_float16")  # a float32 layer, if its numerics allow
```

## References
- TensorFlow Profiler guide: reading the op and kernel time of a traced step
  <https://www.tensorflow.org/guide/profiler>
- TensorFlow mixed precision guide: performance, and why older GPUs and CPUs gain nothing
  <https://www.tensorflow.org/guide/mixed_precision>
- NVIDIA, Train With Mixed Precision: which operations run in float16 and which stay in float32
  <https://docs.nvidia.com/deeplearning/performance/mixed-precision-training/index.html>
"""

from __future__ import annotations

import pandas as pd

from mpwatch.formats import SIXTEEN_BIT
from mpwatch.judge.evidence.graph import id_inputs
from mpwatch.judge.finding import Finding
from mpwatch.judge.rule import (
    Rule,
    compute_dtype,
    effective_float32,
    fast_16bit,
    finite,
    layer_constructor,
    layer_row,
    pct,
    policy,
)
from mpwatch.read.run import Run
from mpwatch.words import duration_us

CAST_SHARE_WARN = 0.10
SHARE_16BIT_WARN = 0.50
FLOAT32_LAYER_SHARE = 0.10  # a float32 layer taking this share of profiled time

RULE = Rule(
    id="profile",
    title="Where the time goes (profiler)",
    severities=("info", "warning"),
    doc=__doc__,
    thresholds={
        "CAST_SHARE_WARN": CAST_SHARE_WARN,
        "SHARE_16BIT_WARN": SHARE_16BIT_WARN,
        "FLOAT32_LAYER_SHARE": FLOAT32_LAYER_SHARE,
    },
)


def _cast_fix(ids: list[str]) -> str:
    """The Cast advice: never float16 for integer ids (``ids``: the model inputs carrying them),
    which a 16-bit float rounds above 2048 (see `id-rounding`)."""
    head = "# fewer float32<->float16 boundaries: keep neighbouring layers in one dtype\n"
    tail = "# (on CPUs and pre-Volta GPUs 16-bit math is emulated: use float32 there)"
    if ids:
        named = ", ".join(repr(n) for n in ids)
        return (
            head + f"# the integer ids ({named}) stay int32, never float16 (it rounds ids above "
            '2048):\ninputs = keras.Input(shape=..., dtype="int32")\n' + tail
        )
    return (
        head + "# float features may be fed as float16 (within its range); integer ids stay "
        'int32: keras.Input(..., dtype="int32")\n' + tail
    )


def check(run: Run) -> list[Finding]:
    """Findings of this rule on one run."""
    prof = run.profile
    if not prof:
        return []
    found = []
    cast = finite(prof.get("cast_share"))
    share16 = finite(prof.get("share_16bit"))
    total = finite(prof.get("total_us"))
    if cast is not None and cast > CAST_SHARE_WARN:
        found.append(
            RULE.finding(
                "warning",
                f"{pct(cast)} of profiled time is spent in Cast ops",
                f"Cast ops {duration_us(finite(prof.get('cast_us')))} of {duration_us(total)} "
                f"over steps {prof.get('steps')}",
                fix=_cast_fix(id_inputs(run)),
                data={"cast_share": cast},
            )
        )
    # on a device without fast 16-bit math (a CPU, an older GPU: see no-tensor-cores) more
    # 16-bit compute is no gain: no advice to move layers to 16 bits there
    mixed = compute_dtype(run) in SIXTEEN_BIT and fast_16bit(run) is not False
    kern = run.profile_kernels if run.profile_source == "device_kernels" else None
    if kern is not None:  # what the GPU ran: unknown precision counts neither way
        share16 = finite(kern.get("share_16bit"))
        unknown = finite(kern.get("unknown_share")) or 0.0
        if mixed and share16 is not None and share16 + unknown < SHARE_16BIT_WARN:
            found.append(
                RULE.finding(
                    "warning",
                    f"Only {pct(share16)} of GPU time runs in 16-bit kernels",
                    f"16-bit kernels {pct(share16)} of device time, unknown precision "
                    f"{pct(unknown)}, under policy {policy(run)}",
                    fix="# see the per-layer kernel table: move the heaviest float32 layers to "
                    "the mixed policy",
                    data={"share_16bit": share16, "unknown_share": unknown},
                )
            )
    elif mixed and share16 is not None and share16 < SHARE_16BIT_WARN:
        found.append(
            RULE.finding(
                "warning",
                f"Only {pct(share16)} of compute time runs in 16 bits",
                f"16-bit share of profiled op time {pct(share16)} under policy {policy(run)}",
                fix="# see the per-layer time table: move the heaviest float32 layers to the "
                "mixed policy",
                data={"share_16bit": share16},
            )
        )
    pl = run.profile_layers
    if kern is not None:  # a layer's float32 time: its float32 and TF32 kernels
        kl = run.profile_kernel_layers
        pl = pd.DataFrame(
            {
                "layer": kl["layer"],
                "time_32bit_us": pd.to_numeric(kl["float32_us"], errors="coerce").fillna(0.0)
                + pd.to_numeric(kl["tf32_us"], errors="coerce").fillna(0.0),
            }
        )
        total = finite(kern.get("total_us"))
    if mixed and len(pl) and total and "time_32bit_us" in pl:
        inside = effective_float32(run)
        outputs = set()
        if len(run.layers) and "is_output" in run.layers:
            outputs = set(
                run.layers.loc[run.layers["is_output"].fillna(False).astype(bool), "name"]
            )
        for _, r in pl.iterrows():
            name = str(r.get("layer"))
            t32 = finite(r.get("time_32bit_us")) or 0.0
            if t32 / total <= FLOAT32_LAYER_SHARE or name in inside or name in outputs:
                continue
            row = layer_row(run, name) or {}
            if str(row.get("compute_dtype")) != "float32":
                continue  # already under a 16-bit policy: its float32 time is Keras' own choice
            found.append(
                RULE.finding(
                    "info",
                    f"Layer {name!r} spends {pct(t32 / total)} of profiled time in float32",
                    f"{duration_us(t32)} in 32-bit {'kernels' if kern is not None else 'ops'} of "
                    f"{duration_us(total)} total; policy {row.get('policy')}",
                    fix=f"{layer_constructor(run, row.get('class'))}(..., "
                    f'dtype="{policy(run) or "mixed_float16"}")  # if its numerics allow',
                    layer=name,
                    data={"time_32bit_us": t32, "share": t32 / total},
                )
            )
    return found
