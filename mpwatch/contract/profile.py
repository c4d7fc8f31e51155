"""The ``profile`` record: the profiler summary, its tables' columns (layers, op types, GPU kernels
per layer and one by one), the kernel precisions, the record's sources, and their types."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mpwatch.contract import schema as s
from mpwatch.contract.tags import KIND_PROFILE

# Column names of the record's tables, in order (writers build rows in this order).
PROFILE_LAYER_COLUMNS = [
    "layer",
    "time_us",
    "time_16bit_us",
    "time_32bit_us",
    "ops",
    "share",
    "cast_us",
    "path",
    "class",
    "compute_dtype",
    "bits",
    "trainable_params",
]
PROFILE_OP_TYPE_COLUMNS = [
    "op_type",
    "time_us",
    "bits",
    "count",
    "kept_float32_by_amp",
    "ops",
    "share",
]
#: where a ``profile`` record's per-layer precision and time come from (its ``source`` key):
#: ``device_kernels`` the GPU kernels the trace holds, each classified by its name
#: (``mpwatch/profile/kernel_classes.py``): the ``kernel_*`` keys; ``host_ops`` the framework (or
#: XLA) ops on the host, each counted in its layer's compute dtype (a CPU); ``device_ops``
#: framework ops on a device without a kernel table (what records written before ``source``
#: existed hold on a GPU)
PROFILE_SOURCES = ("device_kernels", "host_ops", "device_ops")
#: the ``unattributed_by_category`` key of matmul and convolution ops outside every layer that no
#: named part of the step owns: a model's math the join could not place (a train step's own
#: computation, or a sub-model no scope of the model reaches); their precision is not read from
#: a layer (they count 32-bit)
PROFILE_UNJOINED_MATH = "matmul/conv joined to no layer"
#: the precisions a GPU kernel is classified in (``mpwatch.profile.kernel_patterns.PRECISIONS``)
#: (``mixed``: an XLA kernel reading or writing 16- and 32-bit data both; ``integer``: one without
#: floating point; both from the HLO, added with issue 26: older records lack their columns)
PROFILE_PRECISIONS = (
    "float32",
    "tf32",
    "float16",
    "bfloat16",
    "float8",
    "int8",
    "mixed",
    "integer",
    "unknown",
)
PROFILE_KERNEL_LAYER_COLUMNS = [
    "layer",
    "time_us",
    "forward_us",
    "backward_us",
    "share",
    *[f"{p}_us" for p in PROFILE_PRECISIONS],
    "tensor_core_us",
    "tensor_core_share",
    "tensor_core_unknown_us",
    "xprof_tensor_core_us",
    "eligible_us",
    "eligible_not_tensor_core_us",
    "eligible_tensor_core_unknown_us",
    "kernels",
    "path",
    "class",
    "compute_dtype",
    "tc_dims",
    "tc_aligned",
]
PROFILE_KERNEL_COLUMNS = [
    "kernel_name",
    "op_name",
    "op_name_from",
    "layer",
    "direction",
    "total_duration_us",
    "occurrences",
    "precision",
    "tensor_core",
    "pattern",
    "kind",
    "evidence",
    "eligible",
    "eligible_not_tensor_core",
    "xprof_tensor_core",
    "xprof_tensor_core_eligible",
    "grid_dim",
    "block_dim",
    # issue 26: the HLO's reading (absent in older records)
    "part",
    "precision_source",
    "name_precision",
    "precision_disagrees",
    "tensor_core_why",
    "is_cast",
    "hlo_op",
    "hlo_opcode",
]

PROFILE_LAYER_COLUMN_TYPES: dict[str, Any] = {
    "layer": s._str("the layer's name (its path where two nested layers share a name)"),
    "time_us": s._num("time of the layer's ops, microseconds"),
    "time_16bit_us": s._num("of which in 16-bit ops"),
    "time_32bit_us": s._num("of which in 32-bit ops"),
    "ops": s._int("distinct ops"),
    "share": s._num("of the total time"),
    "cast_us": s._num("time in Cast ops (part of the 32-bit time)"),
    "path": s._str("the layer's path, as in the layers record"),
    "class": s._str("the layer's class name"),
    "compute_dtype": s._str(s._DTYPE),
    "bits": s._int("16 or 32: the precision its ops count in"),
    "trainable_params": s._int("trainable parameters"),
}
PROFILE_OP_TYPE_COLUMN_TYPES: dict[str, Any] = {
    "op_type": s._str("the op type"),
    "time_us": s._num("microseconds"),
    "bits": s._int("16 or 32"),
    "count": s._int("occurrences"),
    "kept_float32_by_amp": s._bool("an op type mixed precision keeps in float32"),
    "ops": s._int("distinct ops"),
    "share": s._num("of the total time"),
}

_US = "microseconds of device time"
PROFILE_KERNEL_LAYER_COLUMN_TYPES: dict[str, Any] = {
    "layer": s._str("the layer's name (its path where two nested layers share a name)"),
    "time_us": s._num("device time of the layer's kernels, " + _US),
    "forward_us": s._num("of which in the forward pass"),
    "backward_us": s._num("of which in the backward pass (gradients)"),
    "share": s._num("of the run's device time"),
    **{
        f"{p}_us": s._num(
            "of which in kernels of unknown precision (never counted as 16-bit)"
            if p == "unknown"
            else f"of which in {p} kernels"
        )
        for p in PROFILE_PRECISIONS
    },
    "tensor_core_us": s._num(
        "of which on Tensor Cores (mpwatch's reading of the HLO and kernel names)"
    ),
    "tensor_core_share": s._num("tensor_core_us / time_us"),
    "tensor_core_unknown_us": s._num("of which in kernels whose Tensor Core use is unknown"),
    "xprof_tensor_core_us": s._num("of which xprof's 'Kernel uses TensorCore' marks"),
    "eligible_us": s._num("of which in matrix multiplies and convolutions (Tensor Core eligible)"),
    "eligible_not_tensor_core_us": s._num(
        "of which eligible but not on Tensor Cores (float32 or CUDA-core matmul/conv kernels)"
    ),
    "eligible_tensor_core_unknown_us": s._num("of which eligible, Tensor Core use unknown"),
    "kernels": s._int("distinct kernels (kernel name and op)"),
    "path": s._str("the layer's path, as in the layers record (its scope without a model)"),
    "class": s._str("the layer's class name (empty without a model)"),
    "compute_dtype": s._str(s._DTYPE + " (empty without a model)"),
    "tc_dims": s._t(
        ["object", "null"],
        "the dimensions that decide its Tensor Core use, as the layers record's tc_dims (None: "
        "not known at capture)",
        additionalProperties=s._int(),
    ),
    "tc_aligned": s._bool("every tc_dims a multiple of 8 (None without tc_dims)", nullable=True),
}
PROFILE_KERNEL_COLUMN_TYPES: dict[str, Any] = {
    "kernel_name": s._str("the GPU kernel's name"),
    "op_name": s._str("the framework op that launched it (JAX or TensorFlow name)"),
    "op_name_from": s._enum(
        ["xprof", "hlo", ""],
        "where op_name comes from: xprof's table, the trace's HLO metadata (XLA fusions xprof "
        'names XlaModule), or nowhere ("")',
    ),
    "layer": s._str("the layer it belongs to (None: outside every layer)", nullable=True),
    "direction": s._enum(["forward", "backward", "unknown"], "the pass it ran in"),
    "total_duration_us": s._num(_US + ", every launch"),
    "occurrences": s._int("launches"),
    "precision": s._enum(
        list(PROFILE_PRECISIONS),
        "what its arithmetic reads: from the HLO instruction it runs, else from its name",
    ),
    "tensor_core": s._enum(["yes", "no", "unknown"], "whether it ran on Tensor Cores"),
    "pattern": s._str("the kernel family that matched (docs/kernels.md; empty: none)"),
    "kind": s._str("gemm, conv, elementwise, reduction, copy, fusion, ..."),
    "evidence": s._str("what decided: name, op, name+xprof, ..."),
    "eligible": s._bool("a matrix multiply or convolution (Tensor Core eligible)"),
    "eligible_not_tensor_core": s._bool("eligible, and a float32 or CUDA-core kernel"),
    "xprof_tensor_core": s._bool("xprof's 'Kernel uses TensorCore'", nullable=True),
    "xprof_tensor_core_eligible": s._bool("xprof's 'Op is TensorCore eligible'", nullable=True),
    "grid_dim": s._str("launch grid x,y,z"),
    "block_dim": s._str("block x,y,z"),
    "part": s._str(
        "outside every layer: the named part of the step it belongs to (optimizer update, loss "
        "scaling, loss, metrics, input; None: a layer's, or no owner)",
        nullable=True,
    ),
    "precision_source": s._enum(
        ["hlo", "name", ""],
        "what decided precision: the HLO instruction it runs, its name, or nothing (unknown)",
    ),
    "name_precision": s._str("the precision its name alone says (kept as corroboration)"),
    "precision_disagrees": s._bool("the name says another precision than the HLO"),
    "tensor_core_why": s._str("why it runs on Tensor Cores or not (operands, device, helper)"),
    "is_cast": s._bool("it only converts between floating-point types (and moves data)"),
    "hlo_op": s._str("the HLO instruction it runs (empty: not found)"),
    "hlo_opcode": s._str("that instruction's opcode (fusion, custom-call, ...)"),
}
_BY_PRECISION = s._obj(
    {p: s._num() for p in PROFILE_PRECISIONS}, "one value per precision", required=[]
)
_PROFILE_KERNEL_SUMMARY = s._obj(
    {
        "total_us": s._num("device time of every kernel, " + _US),
        "kernels": s._int("distinct kernels"),
        "by_precision_us": _BY_PRECISION,
        "by_precision_share": _BY_PRECISION,
        "tensor_core_by_precision_us": _BY_PRECISION,
        "share_16bit": s._num("share of device time in float16 and bfloat16 kernels"),
        "unknown_share": s._num("share in kernels of unknown precision"),
        "tensor_core_us": s._num(
            "time on Tensor Cores (mpwatch's reading of the HLO and kernel names)"
        ),
        "tensor_core_share": s._num("tensor_core_us / total_us"),
        "tensor_core_unknown_share": s._num("share in kernels whose Tensor Core use is unknown"),
        "xprof_tensor_core_us": s._num("time xprof's 'Kernel uses TensorCore' marks"),
        "xprof_tensor_core_share": s._num(
            "xprof's share: a substring list of Volta/Turing-era names, which misses most "
            "Ampere/Hopper Tensor Core kernels"
        ),
        "tensor_core_missed_by_xprof_share": s._num(
            "share on Tensor Cores by the name that xprof does not mark: why the two differ"
        ),
        "xprof_eligible_share": s._num("share xprof marks 'Op is TensorCore eligible'"),
        "eligible_us": s._num("time in matmul/convolution kernels"),
        "eligible_share": s._num("eligible_us / total_us"),
        "eligible_not_tensor_core_us": s._num("eligible time not on Tensor Cores"),
        "eligible_not_tensor_core_share": s._num("eligible_not_tensor_core_us / total_us"),
        "eligible_tensor_core_unknown_us": s._num("eligible time whose Tensor Core use is unknown"),
        "attributed_us": s._num("time of kernels joined to a layer"),
        "unattributed_us": s._num(
            "time of kernels with no owner: outside every layer and every named part (before "
            "issue 26: outside every layer)"
        ),
        "forward_us": s._num("time in the forward pass"),
        "backward_us": s._num("time in the backward pass"),
        "direction_unknown_us": s._num("time whose pass is unknown"),
        "op_name_from_hlo_us": s._num("time of kernels joined through the HLO metadata"),
        "unknown_kernels": s._t(
            "array", "the longest kernels no pattern knows (up to 10)", items=s._str()
        ),
        "part_us": s._num("time outside every layer in a named part of the step"),
        "by_part_us": s._t(
            "object",
            "that time by part (optimizer update, loss scaling, loss, metrics, input)",
            additionalProperties=s._num(),
        ),
        "owned_us": s._num("time owned by a layer or a named part"),
        "owned_share": s._num("owned_us / total_us"),
        "unowned_ops": s._t(
            "array",
            "the time with no owner, by op (or kernel), longest first (up to 10)",
            items=s._obj({"op": s._str(), "us": s._num()}, "one op", required=["op", "us"]),
        ),
        "precision_from_hlo_share": s._num("share whose precision the HLO decided"),
        "precision_from_name_share": s._num("share whose precision the kernel name decided"),
        "precision_disagreements": s._t(
            "array",
            "kernels whose name says another precision than their HLO (up to 10)",
            items=s._obj(
                {
                    "kernel": s._str(),
                    "name_precision": s._str(),
                    "hlo_precision": s._str(),
                    "us": s._num(),
                },
                "one kernel",
                required=["kernel", "name_precision", "hlo_precision", "us"],
            ),
        ),
        "cast_us": s._num("time in kernels that only convert between float types"),
        "cast_share": s._num("cast_us / total_us"),
        "compute_capability": s._str('the GPU\'s compute capability ("9.0"; "" unknown)'),
        "compute_capability_from": s._str('"trace" (the GPU plane) or "kernel names" (smXY)'),
        "hlo_note": s._str("why the trace's HLO was not joined to the kernels (absent: it was)"),
    },
    "device_kernels: the run's kernel figures (mpwatch/profile/kernel_time.py: kernel_time)",
    required=[
        "total_us",
        "by_precision_us",
        "by_precision_share",
        "share_16bit",
        "unknown_share",
        "tensor_core_share",
        "xprof_tensor_core_share",
        "eligible_not_tensor_core_us",
    ],
)

#: the ``profile`` record's payload schema
SCHEMA = s._record_schema(
    KIND_PROFILE,
    "The profiler summary: per-layer time by precision and per-op-type time "
    "(mpwatch/profile/summary.py: summarize; record/callbacks/profile_capture.py writes it). "
    "On a trace with GPU kernels (source device_kernels) also each kernel's precision and Tensor "
    "Core use from the HLO instruction it runs (else its name) and its owner (a layer or a named "
    "part of the step), per layer and for the run, beside xprof's own Tensor Core flag.",
    {
        "steps": s._t(
            ["array", "null"],
            "first and last profiled step",
            items=s._int(),
            minItems=2,
            maxItems=2,
        ),
        "device": s._enum(["GPU", "CPU"], "where the profiled ops ran"),
        "total_us": s._num("profiled time, microseconds"),
        "unattributed_us": s._num("time of ops outside every layer"),
        "unattributed_by_category": s._t(
            "object",
            "that time by the named part of the step it belongs to (optimizer update, loss "
            "scaling, loss, metrics, input), else by a rough category (input_pipeline, "
            f"gradients, other, {PROFILE_UNJOINED_MATH!r})",
            additionalProperties=s._num(),
        ),
        "cast_us": s._num("time in Cast ops"),
        "cast_share": s._num("cast_us / total_us"),
        "share_16bit": s._num("share of the time in 16-bit ops"),
        "layers": s._table_schema(
            PROFILE_LAYER_COLUMNS, PROFILE_LAYER_COLUMN_TYPES, "time per layer, by precision"
        ),
        "op_types": s._table_schema(
            PROFILE_OP_TYPE_COLUMNS, PROFILE_OP_TYPE_COLUMN_TYPES, "time per op type"
        ),
        "trace_dir": s._str("where the trace is (TensorBoard's Profile tab reads it too)"),
        "side": s._str('"device" (GPU ops) or "host"'),
        "tool": s._str("the converter's tool name"),
        "bits_rule": s._str("how an op's precision was decided, in words"),
        "layers_dropped": s._int("layers left out of the table to keep the record small"),
        "source": s._enum(
            list(PROFILE_SOURCES),
            "where per-layer precision and time come from: device_kernels (the GPU kernels, "
            "kernel_* keys), host_ops (ops on the host: XLA's by their HLO instruction, others "
            "in their layer's dtype; a CPU), "
            "device_ops (device ops without kernels); absent in older records: "
            "profile_source() derives it from side",
        ),
        "kernel_summary": _PROFILE_KERNEL_SUMMARY,
        "kernel_layers": s._table_schema(
            PROFILE_KERNEL_LAYER_COLUMNS,
            PROFILE_KERNEL_LAYER_COLUMN_TYPES,
            "device_kernels: per layer, device time by pass, precision and Tensor Core use",
        ),
        "kernels": s._table_schema(
            PROFILE_KERNEL_COLUMNS,
            PROFILE_KERNEL_COLUMN_TYPES,
            "device_kernels: the classified kernels, longest first",
        ),
        "kernels_dropped": s._int("kernels left out of that table to keep the record small"),
        "kernel_tool": s._str("the converter's tool for the kernels (kernel_stats)"),
        "kernel_rules": s._str("how a kernel's precision and Tensor Core use were decided"),
        "precisions": s._t("array", "the precisions a kernel is classified in", items=s._str()),
        "kernel_note": s._str("why a trace has no kernel figures (a failed conversion)"),
    },
    [
        "steps",
        "device",
        "total_us",
        "unattributed_us",
        "unattributed_by_category",
        "cast_us",
        "cast_share",
        "share_16bit",
        "layers",
        "op_types",
        "trace_dir",
        "side",
        "tool",
        "bits_rule",
        "layers_dropped",
    ],
    {  # the GPU kernels' figures come together
        "if": {"required": ["source"], "properties": {"source": {"const": "device_kernels"}}},
        "then": {"required": ["kernel_summary", "kernel_layers", "kernels"]},
    },
)


def profile_source(payload: Mapping[str, Any] | None) -> str | None:
    """A ``profile`` record's :data:`PROFILE_SOURCES` value: its ``source``, or for a record
    written before that key, ``device_ops`` on the device side and ``host_ops`` otherwise (None
    without a record).

    >>> profile_source({"side": "host"}), profile_source({"source": "device_kernels"})
    ('host_ops', 'device_kernels')
    """
    if not payload:
        return None
    source = payload.get("source")
    if source in PROFILE_SOURCES:
        return str(source)
    return "device_ops" if payload.get("side") == "device" else "host_ops"
