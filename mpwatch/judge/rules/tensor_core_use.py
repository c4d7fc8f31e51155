"""Rule `tensor-core-use`: how much GPU time ran on Tensor Cores, and why the rest did not.

## What it finds
From a profile with GPU kernels (`source` `device_kernels`: each kernel classified by its name,
see `docs/kernels.md`): one finding with the share of device time on Tensor Cores, beside the
share xprof's own "Kernel uses TensorCore" column gives, the time by precision and the share of
unknown precision, and which layers spend the time that is not on Tensor Cores and why (matrix
math not on Tensor Cores, Tensor Core use unknown, or kernels that are no matrix math:
element-wise, reductions, copies). Then, under a 16-bit policy, one finding per layer whose
matrix multiplies or convolutions run {LAYER_MIN_SHARE:.0%} or more of device time in kernels
that are not Tensor Core kernels, with the reason the record gives: float32 kernels of a layer
under a float32 policy (the policy), 16-bit kernels of a layer whose dimensions are not multiples
of 8 (the alignment), a batch size that is not one, or no reason in the record. Kernels of
unknown precision stay unknown: never counted as 16-bit, never as "not on Tensor Cores".

## Why it matters
Mixed precision is fast where matrix multiplies and convolutions run on Tensor Cores; time that
does not is where a missing speed-up hides. xprof's "Kernel uses TensorCore" matches kernel names
against a list from the Volta/Turing era (PyProf's), which lacks the names of most Ampere and
Hopper Tensor Core kernels (`sm80_`/`sm90_xmma_*`, cuBLAS `nvjet_*`, CUTLASS templates on
`half_t`): both figures are shown, with the time that makes them differ.

## Threshold
The summary: info, on every profile with GPU kernels; a warning when under a 16-bit policy less
than {TENSOR_CORE_LOW:.0%} of the matrix-math time (eligible kernels of known Tensor Core use)
runs on Tensor Cores. A layer: eligible time not on Tensor Cores of at least {LAYER_MIN_SHARE:.0%}
of device time, under a 16-bit policy (or an unrecorded one whose kernels run 16-bit): warning;
info for an output layer kept in float32, a layer that computes in float32 inside, a width the
task fixes (a model output's units: the number of classes; see `tensor-core-alignment`), or when
the record holds no reason. The layer finding is the head of the same layer's
`tensor-core-alignment` and `profile` findings; an alignment finding for a layer whose matrix
math the profile shows on Tensor Cores becomes info, with that measurement.

## Example evidence
```text
76.2% of GPU time ran on Tensor Cores (xprof's flag: 12.5%)
not on Tensor Cores: batch_normalization 1.1 ms (no matrix math), conv2d 884 us (helper
kernels of its matmul/conv 416 us, no matrix math 467 us), ...; matmul/conv ops 12.7 ms:
Tensor Core kernels 12.2 ms, ...; device time 16 ms: float16 79.5%, unknown precision
20.5% (never counted as 16-bit); xprof marks 12.5% 'Kernel uses TensorCore', and 63.7% more
runs in kernels whose names say Tensor Core (its name list predates Ampere and Hopper kernel
names)
```

## Fix
```python
keras.layers.Conv2D(filters=32, ...)  # dims in multiples of 8 (the alignment)
keras.layers.Dense(..., dtype="mixed_float16")  # a float32 layer, if its numerics allow
```

## References
- NVIDIA Deep Learning Performance guide, Matrix Multiplication: Tensor Core requirements on
  matrix dimensions (multiples of 8 for float16)
  <https://docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication/index.html>
- NVIDIA, Train With Mixed Precision: Tensor Cores, and which operations they run
  <https://docs.nvidia.com/deeplearning/performance/mixed-precision-training/index.html>
- openxla/xprof, kernel_stats_utils.cc: IsKernelUsingTensorCore, a substring match of kernel
  names against a fixed list
  <https://github.com/openxla/xprof/blob/master/xprof/utils/kernel_stats_utils.cc>
- tensorflow/tensorflow#51812: the profiler's Tensor Core detection is a heuristic to be updated
  for Ampere and beyond <https://github.com/tensorflow/tensorflow/issues/51812>
- mpwatch.profile.kernel_patterns: the kernel-name patterns (docs/kernels.md)
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import pandas as pd

from mpwatch.formats import SIXTEEN_BIT
from mpwatch.judge.declare import Declared
from mpwatch.judge.evidence.graph import WIDTH_DIMS, task_fixed
from mpwatch.judge.finding import Finding
from mpwatch.judge.rule import (
    Rule,
    compute_dtype,
    finite,
    layer_constructor,
    layer_row,
    names_list,
    pct,
    policy,
)
from mpwatch.read.run import Run
from mpwatch.words import duration_us

LAYER_MIN_SHARE = 0.01  # a layer's eligible time not on Tensor Cores, of the device time
TENSOR_CORE_LOW = 0.5  # of the matrix-math time on Tensor Cores, under a 16-bit policy
NOT_TC_LAYERS_SHOWN = 5  # layers named in the summary's "not on Tensor Cores" evidence
# the dimensions a user sets in a layer's constructor (the alignment rule's, and the batch size)
SETTABLE_DIMS = ("units", "filters", "output_dim", "key_dim", "heads_x_key_dim")
SIXTEEN_BIT_KERNELS = ("float16", "bfloat16")
#: cuDNN's kernels that pad a tensor's channels for its Tensor Core kernels
PADDING_KERNEL = r"[Aa]ddPadding|nhwcPad|padding_kernel"

RULE = Rule(
    id="tensor-core-use",
    title="Tensor Core use on the GPU (from the kernels)",
    severities=("info", "warning"),
    doc=__doc__,
    thresholds={
        "LAYER_MIN_SHARE": LAYER_MIN_SHARE,
        "TENSOR_CORE_LOW": TENSOR_CORE_LOW,
    },
)


def _us(x: float) -> str:
    """Microseconds as a reader reads them (:func:`mpwatch.words.duration_us`: ``16 ms``)."""
    return duration_us(x)


def _round8(v: int) -> int:
    return max(8, int(math.ceil(v / 8.0)) * 8)


def _num(row: Mapping[str, Any], key: str) -> float:
    return finite(row.get(key)) or 0.0


def _sixteen_bit_run(run: Run, summary: Mapping[str, Any]) -> bool:
    """Under a 16-bit policy, or an unrecorded policy whose kernels run 16-bit (a raw trace)."""
    dt = compute_dtype(run)
    if dt:
        return dt in SIXTEEN_BIT
    return (finite(summary.get("share_16bit")) or 0.0) > 0


def _dims(run: Run, row: Mapping[str, Any]) -> dict[str, int]:
    """The layer's Tensor Core dims: the profile's (captured with the model), else the layers
    record's."""
    dims = row.get("tc_dims")
    if not isinstance(dims, Mapping) or not dims:
        lr = layer_row(run, str(row.get("layer"))) or {}
        dims = lr.get("tc_dims")
    if not isinstance(dims, Mapping):
        return {}
    return {str(k): int(v) for k, v in dims.items() if isinstance(v, (int, float))}


def _layer_facts(run: Run, row: Mapping[str, Any]) -> dict[str, Any]:
    """What the layers record (or the profile) says of a layer: class, compute dtype, output,
    float32 inside."""
    name = str(row.get("layer"))
    lr = layer_row(run, name) or {}
    cls = str(lr.get("class") or row.get("class") or "")
    dtype = str(lr.get("compute_dtype") or row.get("compute_dtype") or "")
    effective = str(lr.get("effective_dtype") or "")
    return {
        "class": cls,
        "compute_dtype": dtype,
        "inside": effective == "float32" and dtype in SIXTEEN_BIT,
        "output": bool(lr.get("is_output")) if lr else False,
        "known": bool(lr) or bool(cls),
    }


def _not_tc_split(kernels: pd.DataFrame, row: Mapping[str, Any]) -> tuple[float, float, str]:
    """``(float32 us, 16-bit us, kernel names)`` of a layer's eligible kernels not on Tensor Cores.
    From the record's kernel table; where it was trimmed, the layer's float32 time bounds the
    float32 part."""
    name = str(row.get("layer"))
    total = _num(row, "eligible_not_tensor_core_us")
    if len(kernels) and {"layer", "eligible_not_tensor_core", "precision"} <= set(kernels.columns):
        mine = kernels[
            kernels["layer"].astype(str).eq(name)
            & kernels["eligible_not_tensor_core"].map(lambda v: v is True or v == 1)
        ]
        t = pd.to_numeric(mine["total_duration_us"], errors="coerce").fillna(0.0)
        f32 = float(t[mine["precision"].eq("float32")].sum())
        b16 = float(t[mine["precision"].isin(SIXTEEN_BIT_KERNELS)].sum())
        names = mine.sort_values("total_duration_us", ascending=False)["kernel_name"].astype(str)
        if f32 + b16 > 0 or total == 0:
            return f32, b16, names_list([n[:60] for n in names], 2)
    f32 = min(total, _num(row, "float32_us"))
    b16 = min(total - f32, _num(row, "float16_us") + _num(row, "bfloat16_us"))
    return f32, b16, ""


def _disagreements(s: Mapping[str, Any]) -> str:
    """Where a kernel's name says another precision than the HLO it runs (issue 26), in words."""
    odd = [d for d in (s.get("precision_disagreements") or []) if isinstance(d, Mapping)]
    if not odd:
        return ""
    shown = [
        f"{d.get('kernel')} (name: {d.get('name_precision')}, HLO: {d.get('hlo_precision')}, "
        f"{_us(_num(d, 'us'))})"
        for d in odd[:3]
    ]
    more = f" and {len(odd) - 3} more" if len(odd) > 3 else ""
    return "; kernel name and HLO disagree (the HLO counted): " + ", ".join(shown) + more


def _summary_finding(run: Run, s: Mapping[str, Any], layers: pd.DataFrame, mixed: bool) -> Finding:
    total = _num(s, "total_us")
    tc = finite(s.get("tensor_core_share"))
    xtc = finite(s.get("xprof_tensor_core_share"))
    unknown = finite(s.get("unknown_share")) or 0.0
    by = s.get("by_precision_share") if isinstance(s.get("by_precision_share"), Mapping) else {}
    parts = [f"{p} {pct(v)}" for p, v in by.items() if p != "unknown" and (finite(v) or 0) > 0]
    precision = ", ".join(parts) or "no kernel of known precision"
    missed = finite(s.get("tensor_core_missed_by_xprof_share")) or 0.0
    eligible = _num(s, "eligible_us")
    elig_unknown = _num(s, "eligible_tensor_core_unknown_us")
    elig_not = _num(s, "eligible_not_tensor_core_us")
    on_tc = min(eligible, _num(s, "tensor_core_us"))
    helpers = max(0.0, eligible - on_tc - elig_not - elig_unknown)
    known_elig = eligible - elig_unknown - helpers  # matrix math of known Tensor Core use
    elig_on = on_tc / known_elig if known_elig > 0 else None

    not_tc = []
    for _, r in layers.iterrows():
        off = _num(r, "time_us") - _num(r, "tensor_core_us")
        if off <= 0:
            continue
        e_not = _num(r, "eligible_not_tensor_core_us")
        e_unk = _num(r, "eligible_tensor_core_unknown_us")
        # the rest of its matmul/conv ops' time: their helper kernels (padding, split-K sums)
        helper = max(0.0, _num(r, "eligible_us") - e_not - e_unk - _num(r, "tensor_core_us"))
        other = max(0.0, off - e_not - e_unk - helper)
        parts = [
            (e_not, "matmul/conv off Tensor Cores"),
            (e_unk, "Tensor Core use unknown"),
            (helper, "helper kernels of its matmul/conv"),
            (other, "no matrix math"),
        ]
        parts = [(us, why) for us, why in parts if us > 0]
        why = parts[0][1] if len(parts) == 1 else ", ".join(f"{w} {_us(us)}" for us, w in parts)
        not_tc.append((off, str(r["layer"]), why, e_not, e_unk, helper, other))
    not_tc.sort(key=lambda t: -t[0])
    outside = _num(s, "unattributed_us")
    shown = [f"{name} {_us(off)} ({why})" for off, name, why, *_ in not_tc[:NOT_TC_LAYERS_SHOWN]]
    if len(not_tc) > NOT_TC_LAYERS_SHOWN:
        shown.append(f"{len(not_tc) - NOT_TC_LAYERS_SHOWN} more layers")
    by_part = s.get("by_part_us") if isinstance(s.get("by_part_us"), Mapping) else None
    if by_part is not None:  # issue 26: the time outside layers owned by named parts of the step
        owned = [f"{p} {_us(us)}" for p, us in by_part.items() if (finite(us) or 0) > 0]
        if owned:
            shown.append("outside layers: " + ", ".join(owned))
        if outside > 0:
            ops = [str(d.get("op")) for d in (s.get("unowned_ops") or []) if isinstance(d, Mapping)]
            shown.append(f"no owner {_us(outside)}" + (f" ({names_list(ops, 3)})" if ops else ""))
    elif outside > 0:
        shown.append(f"outside every layer {_us(outside)} (optimizer, loss, XLA's own)")
    unknown_names = [str(n) for n in (s.get("unknown_kernels") or [])]
    evidence = (
        ("not on Tensor Cores: " + ", ".join(shown) + "; " if shown else "")
        + (
            f"matmul/conv ops {_us(eligible)}: Tensor Core kernels {_us(on_tc)}, helper "
            f"kernels {_us(helpers)} (padding, split-K sums), float32 or CUDA-core kernels "
            f"{_us(elig_not)}, Tensor Core use unknown {_us(elig_unknown)}; "
            if eligible > 0
            else ""
        )
        + f"device time {_us(total)}: {precision}, unknown precision {pct(unknown)} (never "
        "counted as 16-bit)"
        + (f"; kernels no pattern knows: {names_list(unknown_names, 3)}" if unknown_names else "")
        + _disagreements(s)
        + f"; xprof marks {pct(xtc or 0.0)} 'Kernel uses TensorCore', and "
        f"{pct(missed)} more runs in Tensor Core kernels (by their HLO or names: its name list "
        "predates Ampere and Hopper kernel names); no matrix math = element-wise kernels, "
        "reductions and copies, which Tensor Cores do not run"
    )
    low = mixed and elig_on is not None and elig_on < TENSOR_CORE_LOW
    title = f"{pct(tc or 0.0)} of GPU time ran on Tensor Cores (xprof's flag: {pct(xtc or 0.0)})"
    if low:
        title += f"; only {pct(elig_on)} of the matrix math"
    fully_on = [
        str(r["layer"])
        for _, r in layers.iterrows()
        if _num(r, "eligible_us") > 0
        and _num(r, "eligible_not_tensor_core_us") == 0
        and _num(r, "eligible_tensor_core_unknown_us") == 0
    ]
    return RULE.finding(
        "warning" if low else "info",
        title,
        evidence,
        fix=(
            "# see the layer findings for the matrix math that is not on Tensor Cores; time in "
            "element-wise kernels does not run on Tensor Cores at any precision"
            if not low
            else "# see the layer findings: dimensions in multiples of 8, 16-bit policies"
        ),
        data={
            "tensor_core_share": tc,
            "xprof_tensor_core_share": xtc,
            "tensor_core_missed_by_xprof_share": missed,
            "unknown_share": unknown,
            "by_precision_share": dict(by),
            "matrix_math_on_tensor_cores": elig_on,
            "not_tensor_core_layers": [
                {
                    "layer": name,
                    "us": off,
                    "eligible_not_tensor_core_us": e_not,
                    "eligible_tensor_core_unknown_us": e_unk,
                    "helper_us": helper,
                    "other_us": other,
                }
                for off, name, _, e_not, e_unk, helper, other in not_tc
            ],
            "unattributed_us": outside,
            "precision_disagreements": [
                dict(d) for d in (s.get("precision_disagreements") or []) if isinstance(d, Mapping)
            ],
            "matrix_math_on_tensor_cores_layers": fully_on,
        },
    )


def _layer_finding(
    run: Run, row: Mapping[str, Any], kernels: pd.DataFrame, total: float
) -> Finding | None:
    name = str(row["layer"])
    off = _num(row, "eligible_not_tensor_core_us")
    if total <= 0 or off / total < LAYER_MIN_SHARE:
        return None
    facts = _layer_facts(run, row)
    f32, b16, names = _not_tc_split(kernels, row)
    cls = facts["class"] or "Layer"
    head = f"{_us(off)} ({pct(off / total)} of device time) of matrix math not on Tensor Cores"
    seen = f"; kernels: {names}" if names else ""
    data: dict[str, Any] = {
        "eligible_not_tensor_core_us": off,
        "share": off / total,
        "float32_us": f32,
        "sixteen_bit_us": b16,
    }
    if f32 >= b16 and f32 > 0:
        dtype = facts["compute_dtype"]
        if facts["inside"]:
            return RULE.finding(
                "info",
                f"Layer {name!r}: float32 matrix math, computed in float32 inside",
                f"{head}: {_us(f32)} in float32 kernels; {cls} computes in float32 inside a "
                f"16-bit policy (Keras' choice for its numerics){seen}",
                fix=f"# {cls} {name!r}: float32 inside by design; nothing to change",
                layer=name,
                data={**data, "cause": "float32_inside"},
            )
        if dtype == "float32":
            if facts["output"]:
                return RULE.finding(
                    "info",
                    f"Layer {name!r}: an output kept in float32, its matrix math in float32",
                    f"{head}: {_us(f32)} in float32 kernels; policy float32 (an output: kept "
                    f"in float32 as the mixed precision guides advise){seen}",
                    fix=f"# {cls} {name!r}: an output kept in float32 on purpose; nothing to "
                    "change unless its time matters",
                    layer=name,
                    data={**data, "cause": "output_float32"},
                )
            return RULE.finding(
                "warning",
                f"Layer {name!r}: matrix math in float32, not on Tensor Cores (its policy)",
                f"{head}: {_us(f32)} in float32 kernels; {cls} {name!r} computes in float32 "
                f"under a run policy of {policy(run) or 'a 16-bit one'}{seen}",
                fix=f"{layer_constructor(run, facts['class'] or None)}(..., "
                f'dtype="{policy(run) or "mixed_float16"}")  # if its numerics allow',
                layer=name,
                data={**data, "cause": "policy"},
            )
        return RULE.finding(
            "warning" if dtype in SIXTEEN_BIT else "info",
            f"Layer {name!r}: float32 matrix math not on Tensor Cores",
            f"{head}: {_us(f32)} in float32 kernels although the layer's compute dtype is "
            f"{dtype or 'not recorded'}: something in it computes in float32 (a cast in its "
            f"call?){seen}",
            fix=f"# {cls} {name!r}: look for a float32 cast in its call (or a float32 input)",
            layer=name,
            data={**data, "cause": "float32_kernels"},
        )
    dims = _dims(run, row)
    bad = {k: v for k, v in dims.items() if v % 8}
    why_fixed = task_fixed(run).get(name)
    if bad and why_fixed and all(k in WIDTH_DIMS for k in bad):
        return RULE.finding(
            "info",
            f"Layer {name!r}: matrix math not on Tensor Cores, its width fixed by the task",
            f"{head}: {_us(b16)} in 16-bit kernels that are no Tensor Core kernels; {cls} "
            f"{name!r}: {', '.join(f'{k}={v}' for k, v in bad.items())} is {why_fixed}{seen}",
            fix=f"# {cls} {name!r}: its width is the task's (not a setting): nothing to change",
            layer=name,
            data={**data, "cause": "task_fixed", "dims": bad},
        )
    if why_fixed:  # the width is the task's: only its other dims are the user's to change
        bad = {k: v for k, v in bad.items() if k not in WIDTH_DIMS}
    if bad:
        settable = {k: _round8(v) for k, v in bad.items() if k in ("units", "filters")}
        changes = ", ".join(f"{k}={v} -> {_round8(v)}" for k, v in bad.items())
        fix = (
            f"{layer_constructor(run, facts['class'] or None)}"
            f"({', '.join(f'{k}={v}' for k, v in settable.items())}, ...)"
            if settable
            else f"# {cls} {name!r}: " + ", ".join(f"{k}={_round8(v)}" for k, v in bad.items())
        )
        if not any(k in SETTABLE_DIMS for k in bad):
            fix += "  # set by the layer before it (its units/filters) or by the data"
        return RULE.finding(
            "warning",
            f"Layer {name!r}: matrix math not on Tensor Cores, {', '.join(bad)} not a multiple "
            "of 8",
            f"{head}: {_us(b16)} in 16-bit kernels that are no Tensor Core kernels; {cls} "
            f"{name!r}: {changes}{seen}",
            fix=fix,
            layer=name,
            data={**data, "cause": "alignment", "dims": bad},
        )
    bs = run.batch_size
    if isinstance(bs, (int, float)) and int(bs) % 8:
        return RULE.finding(
            "warning",
            f"Layer {name!r}: matrix math not on Tensor Cores, batch size {int(bs)} not a "
            "multiple of 8",
            f"{head}; its own dims {dims or 'not recorded'}; batch size {int(bs)} -> "
            f"{_round8(int(bs))}{seen}",
            fix=f"model.fit(..., batch_size={_round8(int(bs))})",
            layer=name,
            data={**data, "cause": "batch_size", "batch_size": int(bs)},
        )
    return RULE.finding(
        "info",
        f"Layer {name!r}: matrix math not on Tensor Cores, reason not in the record",
        f"{head}; dims {dims or 'not recorded'} are multiples of 8 or unknown, batch size "
        f"{bs if bs else 'not recorded'}{seen}",
        fix=f"# {cls} {name!r}: record the layers table (LayerDtypeMonitor) and the batch size "
        "to tell dims from other causes",
        layer=name,
        data={**data, "cause": "unexplained", "dims": dims},
    )


def _padding_finding(
    run: Run, row: Mapping[str, Any], kernels: pd.DataFrame, total: float
) -> Finding | None:
    """A layer whose tensors cuDNN pads for its Tensor Core kernels (``nhwcAddPaddingKernel``):
    the math runs on Tensor Cores, the padding is the cost of a dimension not a multiple of 8."""
    if not len(kernels) or not {"layer", "kernel_name"} <= set(kernels.columns):
        return None
    name = str(row["layer"])
    mine = kernels[
        kernels["layer"].astype(str).eq(name)
        & kernels["kernel_name"].astype(str).str.contains(PADDING_KERNEL, regex=True)
    ]
    pad = float(pd.to_numeric(mine["total_duration_us"], errors="coerce").fillna(0.0).sum())
    if total <= 0 or pad / total < LAYER_MIN_SHARE:
        return None
    facts = _layer_facts(run, row)
    cls = facts["class"] or "Layer"
    dims = _dims(run, row)
    bad = {k: v for k, v in dims.items() if v % 8}
    kinds = sorted({re.sub(r"^void\s+", "", str(k)).split("<")[0] for k in mine["kernel_name"]})
    evidence = (
        f"{_us(pad)} ({pct(pad / total)} of device time) in {names_list(kinds, 2)}: cuDNN pads "
        "the tensors so that its Tensor Core kernels can run"
    )
    settable = {k: _round8(v) for k, v in bad.items() if k in ("units", "filters")}
    if settable:
        evidence += "; " + ", ".join(f"{k}={v} -> {_round8(v)}" for k, v in bad.items())
        fix = (
            f"{layer_constructor(run, facts['class'] or None)}"
            f"({', '.join(f'{k}={v}' for k, v in settable.items())}, ...)"
        )
    elif bad:
        evidence += "; " + ", ".join(f"{k}={v}" for k, v in bad.items()) + " not a multiple of 8"
        fix = (
            f"# {cls} {name!r}: "
            + ", ".join(f"{k}={v}" for k, v in bad.items())
            + " comes from its input (the data or the layer before); the padding is cuDNN's: "
            "pad the input yourself only where that is cheaper"
        )
    else:
        evidence += "; its dimensions are not in the record (no layers table)"
        fix = (
            f"# {cls} {name!r}: a dimension (input channels, filters) is not a multiple of 8; "
            "record the layers table (LayerDtypeMonitor) to see which"
        )
    return RULE.finding(
        "info",
        f"Layer {name!r}: cuDNN pads its tensors for the Tensor Cores ({_us(pad)})",
        evidence,
        fix=fix,
        layer=name,
        data={"cause": "padding", "padding_us": pad, "share": pad / total, "dims": bad},
    )


def measured_alignment(findings: list[Finding]) -> list[Finding]:
    """A ``tensor-core-alignment`` finding about a layer whose matrix math the profile shows on
    Tensor Cores (this rule's run-wide ``data["matrix_math_on_tensor_cores_layers"]``) becomes
    info, with that measurement in its evidence: the kernels ran on Tensor Cores with those
    dimensions."""
    on_tc: dict[str | None, set[str]] = {}
    for f in findings:
        if f.rule == RULE.id and f.layer is None:
            on_tc[f.run] = set(f.data.get("matrix_math_on_tensor_cores_layers") or [])
    for f in findings:
        if f.rule == "tensor-core-alignment" and f.layer and f.layer in on_tc.get(f.run, set()):
            f.severity = "info"
            f.evidence += (
                "; the profile shows this layer's matrix multiplies/convolutions on Tensor Cores "
                "with these dimensions (rounding them may still save padding work)"
            )
            f.data = {**f.data, "measured_on_tensor_cores": True}
    return findings


#: a layer's finding here heads the same layer's findings of the same cause (the static dimension
#: check, and the profile's float32-layer time); a measured alignment is said so
DECLARED = Declared(
    layer_head_of=("tensor-core-alignment", "profile"), settle=measured_alignment
)


def check(run: Run) -> list[Finding]:
    """Findings of this rule on one run."""
    if run.profile_source != "device_kernels":
        return []
    s = run.profile_kernels
    if not s or not (finite(s.get("total_us")) or 0) > 0:
        return []
    layers = run.profile_kernel_layers
    mixed = _sixteen_bit_run(run, s)
    found = [_summary_finding(run, s, layers, mixed)]
    if not mixed:
        return found  # a float32 run: try-mixed-precision's subject, not a layer's
    total = _num(s, "total_us")
    kernels = run.profile_kernel_table
    for _, row in layers.iterrows():
        f = _layer_finding(run, row, kernels, total) or _padding_finding(run, row, kernels, total)
        if f is not None:
            found.append(f)
    return found
