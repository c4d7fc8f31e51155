"""The on-disk contract: every tag, every record kind, the column lists and the payload schemas.

Pure data and pure functions, no TensorFlow: ``mpwatch/record/writer.py`` (the only code that writes
events) encodes with it, ``mpwatch/read/`` and the TensorBoard plugin decode with it.

Scalars are ordinary ``tf.summary.scalar`` float32 values under ``mpwatch/...`` tags, so
TensorBoard's Scalars and Time Series tabs show them too.

Structured records (the layer table, probe results, the profile summary, run facts) are
``DATA_CLASS_TENSOR`` summaries with ``plugin_name="mpwatch"``. Their tensor is a scalar
``tf.string`` holding zlib-compressed UTF-8 JSON; the summary metadata's plugin content is JSON
too: ``{"schema": SCHEMA_VERSION, "kind": KIND, "encoding": "json+zlib"}``. JSON payloads may
contain ``NaN`` and ``Infinity`` (Python's ``json`` reads and writes them); routes that serve
browsers turn them into ``null``.

Tables inside records use pandas' "split" layout: ``{"columns": [...], "data": [[...], ...]}``.

Steps: every value is written at mpwatch's *batch step*: the number of training batches the model
has run, 1 for the first batch, continued across ``fit`` calls (see ``record/state.py``). This
is not ``optimizer.iterations``, which does not advance on a skipped step.

Example:
    >>> from mpwatch import contract
    >>> contract.record_tag(contract.KIND_PROBE)
    'mpwatch/record/probe'
    >>> contract.decode_payload(contract.encode_payload({"a": 1}))
    {'a': 1}
"""

from __future__ import annotations

import json
import math
import os
import zlib
from collections.abc import Mapping
from typing import Any

PLUGIN_NAME = "mpwatch"
SCHEMA_VERSION = 1
ENCODING = "json+zlib"
PREFIX = "mpwatch/"

# No record's compressed payload is larger than this. A payload with tables that would be is
# written by ``RunWriter.record`` (record/writer.py) as several records of its kind at the same
# step: the head (``part`` 0, every key, its large tables' rows moved out), then continuation parts
# (``part`` 1, 2, ..., each with ``parts`` and the next rows of one table, in order); ``parts``
# counts the records in all. ``mpwatch.read`` joins them back (a part missing is a reader warning).
# A 1,000-layer model's records stay far below the limit; a model with tens of thousands of
# variables splits its ``grad_variables`` and probe records. TensorBoard's fast data provider
# (RustBoard) keeps one value per tag and step (a later write at a step preempts the earlier ones),
# so the tab, which reads through it, sees only the last part of a split record.
MAX_RECORD_BYTES = 512 * 1024

# --- scalar tags -------------------------------------------------------------------------------
# loss scale and skipped steps (record/loss_scale.py)
LOSS_SCALE = "mpwatch/loss_scale"  # dynamic_scale after each step; at 0: before the first
STEP_SKIPPED = "mpwatch/step_skipped"  # 1.0 at a step whose update was dropped, else 0.0
SKIPPED_STEPS = "mpwatch/skipped_steps"  # skipped steps in the log interval ending here
SKIPPED_STEPS_TOTAL = "mpwatch/skipped_steps_total"  # cumulative, across fit calls
# gradient health of the real (scaled) training gradients (record/gradient_health.py)
GRAD_ZERO_FRACTION = "mpwatch/grad/zero_fraction"  # share of elements of g*S exactly 0
GRAD_SUBNORMAL_FRACTION = "mpwatch/grad/subnormal_fraction"  # 0 < |g*S| < 2**-14
GRAD_NONFINITE_COUNT = "mpwatch/grad/nonfinite_count"  # elements inf or nan
GRAD_MAX_ABS = "mpwatch/grad/max_abs"  # max |g*S| over finite elements
GRAD_HEADROOM_BITS = "mpwatch/grad/headroom_bits"  # log2(65504 / max|g*S|)
# speed and memory (record/step_time.py)
STEP_TIME_MS = "mpwatch/perf/step_time_ms"  # median step time over the interval, ms per batch
PEAK_MEMORY_MB = "mpwatch/perf/peak_memory_mb"  # device peak (GPU) or process peak RSS (CPU), MiB
# training loss as Keras reports it (for comparing a mixed run with a float32 run)
TRAIN_LOSS = "mpwatch/train/loss"
# the probe against a float32 reference (record/probe.py)
PROBE_UNDERFLOW_FRACTION = "mpwatch/probe/underflow_fraction"
PROBE_GRAD_REL_ERROR = "mpwatch/probe/grad_rel_error"
PROBE_RECOMMENDED_SCALE = "mpwatch/probe/recommended_scale"
PROBE_ACTIVATION_HEADROOM_BITS = "mpwatch/probe/activation_headroom_bits"
# per-batch input health, from the train step's own input (record/state.py tap, input_health.py)
INPUT_MAX_ABS = "mpwatch/input/max_abs"  # max |x| over the batch's finite float inputs
INPUT_NONFINITE_COUNT = "mpwatch/input/nonfinite_count"  # elements of the float inputs inf or nan

SCALAR_TAGS = (
    LOSS_SCALE,
    STEP_SKIPPED,
    SKIPPED_STEPS,
    SKIPPED_STEPS_TOTAL,
    GRAD_ZERO_FRACTION,
    GRAD_SUBNORMAL_FRACTION,
    GRAD_NONFINITE_COUNT,
    GRAD_MAX_ABS,
    GRAD_HEADROOM_BITS,
    STEP_TIME_MS,
    PEAK_MEMORY_MB,
    TRAIN_LOSS,
    PROBE_UNDERFLOW_FRACTION,
    PROBE_GRAD_REL_ERROR,
    PROBE_RECOMMENDED_SCALE,
    PROBE_ACTIVATION_HEADROOM_BITS,
    INPUT_MAX_ABS,
    INPUT_NONFINITE_COUNT,
)

#: what each scalar tag means. The ``mpwatch/probe/*`` scalars repeat four numbers of the ``probe``
#: record (model-wide underflow and gradient error, recommended scale, activation headroom) so that
#: TensorBoard's own Scalars tab can chart them; the judge, the reports and the tab read the record.
SCALAR_DOCS = {
    LOSS_SCALE: "`LossScaleOptimizer.dynamic_scale` after each step, the scale the next step "
    "uses; at step 0 the scale before the run's first step (its initial scale). mixed_float16 "
    "only",
    STEP_SKIPPED: "1.0 at a step whose update the optimizer dropped (non-finite gradients), "
    "else 0.0",
    SKIPPED_STEPS: "skipped steps in the logging interval ending at this step (a count, not a "
    "per-step flag)",
    SKIPPED_STEPS_TOTAL: "skipped steps since the run began, across `fit` calls",
    GRAD_ZERO_FRACTION: "share of the scaled training gradients' elements that are exactly 0",
    GRAD_SUBNORMAL_FRACTION: "share with 0 < \\|g·S\\| < 2^-14 (float16 subnormal)",
    GRAD_NONFINITE_COUNT: "gradient elements that are inf or NaN",
    GRAD_MAX_ABS: "max \\|g·S\\| over finite elements",
    GRAD_HEADROOM_BITS: "log2(65504 / max \\|g·S\\|): doublings left before float16 overflows",
    STEP_TIME_MS: "median step time over the logging interval, ms per batch",
    PEAK_MEMORY_MB: "peak device memory (GPU) or process peak RSS (CPU), MiB",
    TRAIN_LOSS: "the training loss as Keras reports it",
    PROBE_UNDERFLOW_FRACTION: "probe: model-wide underflow fraction at the scale used (also in the "
    "probe record)",
    PROBE_GRAD_REL_ERROR: "probe: model-wide gradient relative error against float32 (also in the "
    "probe record)",
    PROBE_RECOMMENDED_SCALE: "probe: the recommended loss scale (also in the probe record)",
    PROBE_ACTIVATION_HEADROOM_BITS: "probe: smallest activation headroom below 65504, in "
    "doublings (also in the probe record)",
    INPUT_MAX_ABS: "max \\|x\\| over the finite elements of the batch's floating-point inputs "
    "(the features the train step receives), at every step",
    INPUT_NONFINITE_COUNT: "elements of the batch's floating-point inputs that are inf or NaN, at "
    "every step",
}

# --- record kinds (tag = "mpwatch/record/" + kind) ------------------------------------------------
KIND_RUN_INFO = "run_info"  # policy, loss-scale facts, versions, device, strategy (dict)
KIND_LAYERS = "layers"  # the per-layer dtype table (split table)
KIND_GRAD_VARIABLES = "grad_variables"  # per-variable gradient health (split table)
KIND_PROBE = "probe"  # probe results at one step (dict of tables, histogram, sweep)
KIND_PROFILE = "profile"  # profiler summary: per-layer time by dtype, op types (dict)
KIND_NOTICE = "notice"  # a recording part that stopped or is unavailable, and why (dict)
KIND_TRAIN_STEP = "train_step"  # the train step's contract: who steps, who scales (dict)

# Column names of the record tables, in order (writers build rows in this order; the payload
# schemas below give each column's type).
LAYERS_COLUMNS = [
    "name",
    "path",
    "class",
    "depth",
    "policy",
    "compute_dtype",
    "variable_dtype",
    "output_dtype",
    "effective_dtype",
    "params",
    "trainable_params",
    "tc_dims",
    "tc_aligned",
    "is_output",
    "note",
]
# written after LAYERS_COLUMNS since issue 24 (what a layer takes and gives); absent in older
# records, which readers and rules still take
LAYERS_GRAPH_COLUMNS = [
    "activation",
    "output_width",
    "inputs",
]
PROBE_VARIABLE_COLUMNS = [
    "variable",
    "layer",
    "size",
    "ref_nonzero",
    "underflow_count",
    "underflow_fraction",
    "grad_rel_error",
    "ref_max_abs",
]
PROBE_LAYER_COLUMNS = [
    "layer",
    "ref_nonzero",
    "underflow_count",
    "underflow_fraction",
    "grad_rel_error",
    "output_rel_error",
    "max_abs_activation",
    "activation_headroom_bits",
    "act_grad_underflow_fraction",
    "nonfinite",
]
PROBE_INPUT_COLUMNS = [
    "input",
    "dtype",
    "size",
    "integer_valued",
    "max_abs",
    "consumers",
    "cast_to",
    "changed",
]
PROBE_SWEEP_COLUMNS = [
    "scale_log2",
    "scale",
    "predicted_underflow_fraction",
    "predicted_overflow_fraction",
]
GRAD_VARIABLE_COLUMNS = [
    "variable",
    "layer",
    "size",
    "zero_fraction",
    "subnormal_fraction",
    "nonfinite_count",
    "max_abs",
    "headroom_bits",
]
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
#: (``mpwatch/kernels.py``): the ``kernel_*`` keys; ``host_ops`` the framework (or XLA) ops on the
#: host, each counted in its layer's compute dtype (a CPU); ``device_ops`` framework ops on a
#: device without a kernel table (what records written before ``source`` existed hold on a GPU)
PROFILE_SOURCES = ("device_kernels", "host_ops", "device_ops")
#: the precisions a GPU kernel is classified in (``mpwatch.kernels.PRECISIONS``)
PROFILE_PRECISIONS = ("float32", "tf32", "float16", "bfloat16", "float8", "int8", "unknown")
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
]

RECORD_KINDS = (
    KIND_RUN_INFO,
    KIND_LAYERS,
    KIND_GRAD_VARIABLES,
    KIND_PROBE,
    KIND_PROFILE,
    KIND_NOTICE,
    KIND_TRAIN_STEP,
)
RECORD_PREFIX = "mpwatch/record/"


def record_tag(kind: str) -> str:
    """The tag a record kind is written under."""
    if kind not in RECORD_KINDS:
        raise ValueError(f"unknown mpwatch record kind {kind!r}; known: {', '.join(RECORD_KINDS)}")
    return RECORD_PREFIX + kind


def kind_of_tag(tag: str) -> str | None:
    """The record kind of a tag, or None when the tag is no mpwatch record."""
    if tag.startswith(RECORD_PREFIX):
        kind = tag[len(RECORD_PREFIX) :]
        return kind if kind in RECORD_KINDS else None
    return None


# --- payload schemas (JSON Schema, draft 2020-12) ------------------------------------------------
# What each writer writes, as data: PAYLOAD_SCHEMAS[kind] validates one record's decoded payload
# (``jsonschema.validate(payload, PAYLOAD_SCHEMAS[kind])``; jsonschema is a test dependency only,
# mpwatch never imports it). Rules: every key a writer writes is listed with its type and a
# description; the keys always written are required (:func:`required_keys`); other keys are
# allowed (forward compatibility: readers ignore keys they do not know). Numbers may be NaN or
# +-Infinity (a JSON "number" here; Python's ``json`` reads and writes them). Tables are
# ``{"columns": <the column list above, exactly>, "data": [[one value per column, typed], ...]}``.
# A record with tables may be split (see MAX_RECORD_BYTES): its head says ``part`` 0 and
# ``parts``; a continuation part (``part`` >= 1) holds only ``part``, ``parts`` and the next rows of
# one of the head's tables, so for those kinds the required keys sit in the schema's first
# ``allOf`` rule (required unless ``part`` >= 1). ``notice`` records are never split: their
# ``part`` names the recording part the notice is about.
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def _t(kind: str | list[str], description: str = "", **more: Any) -> dict[str, Any]:
    """A typed value; ``kind`` a JSON type or a list of them."""
    out: dict[str, Any] = {"type": kind, **more}
    if description:
        out["description"] = description
    return out


def _num(description: str = "", nullable: bool = False) -> dict[str, Any]:
    return _t(["number", "null"] if nullable else "number", description)


def _int(description: str = "", nullable: bool = False) -> dict[str, Any]:
    return _t(["integer", "null"] if nullable else "integer", description)


def _str(description: str = "", nullable: bool = False) -> dict[str, Any]:
    return _t(["string", "null"] if nullable else "string", description)


def _bool(description: str = "", nullable: bool = False) -> dict[str, Any]:
    return _t(["boolean", "null"] if nullable else "boolean", description)


def _enum(values: list[Any], description: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"enum": list(values)}
    if description:
        out["description"] = description
    return out


def _obj(
    properties: dict[str, Any],
    description: str = "",
    required: list[str] | None = None,
    nullable: bool = False,
) -> dict[str, Any]:
    """An object with these keys (all required unless ``required`` says which)."""
    out = _t(["object", "null"] if nullable else "object", description)
    out.update(
        properties=properties,
        required=list(properties) if required is None else required,
        additionalProperties=True,
    )
    return out


def _table_schema(columns: list[str], types: dict[str, Any], description: str) -> dict[str, Any]:
    """A split table with exactly these columns; each row one value of each column's type."""
    if list(types) != list(columns):
        raise AssertionError(f"column types {list(types)} do not match columns {columns}")
    return {
        "type": "object",
        "description": description,
        "properties": {
            "columns": {"const": list(columns)},
            "data": {
                "type": "array",
                "items": {
                    "type": "array",
                    "prefixItems": [types[c] for c in columns],
                    "minItems": len(columns),
                    "maxItems": len(columns),
                },
            },
        },
        "required": ["columns", "data"],
        "additionalProperties": True,
    }


def _is_table_schema(schema: Any) -> bool:
    return isinstance(schema, dict) and "columns" in schema.get("properties", {})


_PART = _int("split record: this record's index, 0 for the head", nullable=False)
_PART["minimum"] = 0
_PARTS = _int("split record: how many records it was written as")
_PARTS["minimum"] = 2


def _record_schema(
    kind: str, description: str, properties: dict[str, Any], required: list[str], *rules: Any
) -> dict[str, Any]:
    """A record kind's schema; a kind with tables may come split into parts."""
    schema: dict[str, Any] = {
        "$schema": JSON_SCHEMA_DIALECT,
        "$id": f"https://mpwatch/contract/schema-{SCHEMA_VERSION}/{kind}",
        "title": f"mpwatch {kind} record payload (schema {SCHEMA_VERSION})",
        "description": description,
        "type": "object",
        "properties": dict(properties),
        "additionalProperties": True,
    }
    if not any(_is_table_schema(p) for p in properties.values()):
        schema["required"] = list(required)
        if rules:
            schema["allOf"] = list(rules)
        return schema
    schema["properties"].update(part=_PART, parts=_PARTS)
    continuation = {"required": ["part"], "properties": {"part": {"minimum": 1}}}
    schema["allOf"] = [
        {
            "if": continuation,
            "then": {"required": ["part", "parts"]},
            "else": {"required": list(required)},
        },
        *rules,
    ]
    return schema


_DTYPE = "a Keras dtype name: float16, bfloat16, float32, ..."
_MODEL_KIND = ["sequential", "functional", "subclassed"]
_NO_REF = " (None without a float32 reference)"

LAYERS_COLUMN_TYPES: dict[str, Any] = {
    "name": _str("the layer's name"),
    "path": _str("the layer's path from the root model down: model/outer/inner/dense"),
    "class": _str("the layer's class name"),
    "depth": _int("1 for the model's own layers, 2 inside a nested model, ..."),
    "policy": _str("the layer's dtype policy name"),
    "compute_dtype": _str(_DTYPE),
    "variable_dtype": _str(_DTYPE),
    "output_dtype": _str("the dtype the layer returns (None where unknown)", nullable=True),
    "effective_dtype": _str("what it really computes in (normalization: float32 inside)"),
    "params": _int("parameters"),
    "trainable_params": _int("trainable parameters"),
    "tc_dims": _t(
        "object", "dimensions deciding Tensor Core use: name -> size", additionalProperties=_int()
    ),
    "tc_aligned": _bool("every tc_dims a multiple of 8 (None without tc_dims)", nullable=True),
    "is_output": _bool("the layer produces a model output"),
    "note": _str("why effective_dtype or output_dtype differ from compute_dtype", nullable=True),
}
LAYERS_GRAPH_COLUMN_TYPES: dict[str, Any] = {
    "activation": _str(
        "the activation the layer applies last (its activation argument: sigmoid, softmax, "
        "linear, ...; softmax for a Softmax layer; None for a layer without one)",
        nullable=True,
    ),
    "output_width": _int("the last dimension of its output (None where unknown)", nullable=True),
    "inputs": _t(
        ["array", "null"],
        "the layers feeding it in its model's graph, by name (Keras' inbound nodes; a Sequential: "
        "the layer before it); a name not in the table is a model input; None where the graph is "
        "not known (a subclassed model)",
        items=_str(),
    ),
}
GRAD_VARIABLE_COLUMN_TYPES: dict[str, Any] = {
    "variable": _str("the variable's path"),
    "layer": _str("the layer-table path of the layer owning it"),
    "size": _int("elements"),
    "zero_fraction": _num("share of the elements of g*S exactly 0 (NaN when empty)"),
    "subnormal_fraction": _num("share with 0 < |g*S| < 2**-14 (NaN when empty)"),
    "nonfinite_count": _num("elements inf or nan"),
    "max_abs": _num("max |g*S| over the finite elements"),
    "headroom_bits": _num("log2(65504 / max_abs); Infinity when max_abs is 0"),
}
PROBE_VARIABLE_COLUMN_TYPES: dict[str, Any] = {
    "variable": _str("the variable's path"),
    "layer": _str("the name of the layer owning it"),
    "size": _int("elements"),
    "ref_nonzero": _int("elements nonzero in the reference gradient" + _NO_REF, nullable=True),
    "underflow_count": _int("of those, zero in the mixed gradient" + _NO_REF, nullable=True),
    "underflow_fraction": _num("underflow_count / ref_nonzero" + _NO_REF, nullable=True),
    "grad_rel_error": _num("||mixed - reference|| / ||reference||" + _NO_REF, nullable=True),
    "ref_max_abs": _num(
        "max |reference gradient| (unscaled; None without a float32 reference or in records "
        "written before it existed): the train-step rule compares it with what the optimizer "
        "receives",
        nullable=True,
    ),
}
PROBE_LAYER_COLUMN_TYPES: dict[str, Any] = {
    "layer": _str("the layer's name"),
    "ref_nonzero": _int("over the layer's variables" + _NO_REF, nullable=True),
    "underflow_count": _int("over the layer's variables" + _NO_REF, nullable=True),
    "underflow_fraction": _num("over the layer's variables" + _NO_REF, nullable=True),
    "grad_rel_error": _num("over the layer's variables" + _NO_REF, nullable=True),
    "output_rel_error": _num("relative error of the layer's output" + _NO_REF, nullable=True),
    "max_abs_activation": _num("max |output| of the mixed pass (None: not measured)", True),
    "activation_headroom_bits": _num("log2(format max / max_abs_activation)", nullable=True),
    "act_grad_underflow_fraction": _num(
        "underflow of the gradient w.r.t. the layer's output (None: not measured)", nullable=True
    ),
    "nonfinite": _int("non-finite activation and gradient elements"),
}
PROBE_INPUT_COLUMN_TYPES: dict[str, Any] = {
    "input": _str("the model input's name"),
    "dtype": _str("the dtype the batch holds it in"),
    "size": _int("elements in the probe batch"),
    "integer_valued": _bool("every finite value is an integer (token ids, class ids)"),
    "max_abs": _num("largest |value| (None: no finite value)", nullable=True),
    "consumers": _t(
        "array", "the layers that cast it to 16 bits on entry (autocast)", items=_str()
    ),
    "cast_to": _str("the 16-bit dtype they cast it to (None: none does)", nullable=True),
    "changed": _int("values that cast changes (numpy, exact)"),
}
PROBE_SWEEP_COLUMN_TYPES: dict[str, Any] = {
    "scale_log2": _int("log2 of the loss scale"),
    "scale": _num("the loss scale"),
    "predicted_underflow_fraction": _num("share of reference gradients that would underflow"),
    "predicted_overflow_fraction": _num("share that would overflow"),
}
PROFILE_LAYER_COLUMN_TYPES: dict[str, Any] = {
    "layer": _str("the layer's name (its path where two nested layers share a name)"),
    "time_us": _num("time of the layer's ops, microseconds"),
    "time_16bit_us": _num("of which in 16-bit ops"),
    "time_32bit_us": _num("of which in 32-bit ops"),
    "ops": _int("distinct ops"),
    "share": _num("of the total time"),
    "cast_us": _num("time in Cast ops (part of the 32-bit time)"),
    "path": _str("the layer's path, as in the layers record"),
    "class": _str("the layer's class name"),
    "compute_dtype": _str(_DTYPE),
    "bits": _int("16 or 32: the precision its ops count in"),
    "trainable_params": _int("trainable parameters"),
}
PROFILE_OP_TYPE_COLUMN_TYPES: dict[str, Any] = {
    "op_type": _str("the op type"),
    "time_us": _num("microseconds"),
    "bits": _int("16 or 32"),
    "count": _int("occurrences"),
    "kept_float32_by_amp": _bool("an op type mixed precision keeps in float32"),
    "ops": _int("distinct ops"),
    "share": _num("of the total time"),
}

_US = "microseconds of device time"
PROFILE_KERNEL_LAYER_COLUMN_TYPES: dict[str, Any] = {
    "layer": _str("the layer's name (its path where two nested layers share a name)"),
    "time_us": _num("device time of the layer's kernels, " + _US),
    "forward_us": _num("of which in the forward pass"),
    "backward_us": _num("of which in the backward pass (gradients)"),
    "share": _num("of the run's device time"),
    **{
        f"{p}_us": _num(
            "of which in kernels of unknown precision (never counted as 16-bit)"
            if p == "unknown"
            else f"of which in {p} kernels"
        )
        for p in PROFILE_PRECISIONS
    },
    "tensor_core_us": _num("of which on Tensor Cores (mpwatch's reading of the kernel names)"),
    "tensor_core_share": _num("tensor_core_us / time_us"),
    "tensor_core_unknown_us": _num("of which in kernels whose Tensor Core use is unknown"),
    "xprof_tensor_core_us": _num("of which xprof's 'Kernel uses TensorCore' marks"),
    "eligible_us": _num("of which in matrix multiplies and convolutions (Tensor Core eligible)"),
    "eligible_not_tensor_core_us": _num(
        "of which eligible but not on Tensor Cores (float32 or CUDA-core matmul/conv kernels)"
    ),
    "eligible_tensor_core_unknown_us": _num("of which eligible, Tensor Core use unknown"),
    "kernels": _int("distinct kernels (kernel name and op)"),
    "path": _str("the layer's path, as in the layers record (its scope without a model)"),
    "class": _str("the layer's class name (empty without a model)"),
    "compute_dtype": _str(_DTYPE + " (empty without a model)"),
    "tc_dims": _t(
        ["object", "null"],
        "the dimensions that decide its Tensor Core use, as the layers record's tc_dims (None: "
        "not known at capture)",
        additionalProperties=_int(),
    ),
    "tc_aligned": _bool("every tc_dims a multiple of 8 (None without tc_dims)", nullable=True),
}
PROFILE_KERNEL_COLUMN_TYPES: dict[str, Any] = {
    "kernel_name": _str("the GPU kernel's name"),
    "op_name": _str("the framework op that launched it (JAX or TensorFlow name)"),
    "op_name_from": _enum(
        ["xprof", "hlo", ""],
        "where op_name comes from: xprof's table, the trace's HLO metadata (XLA fusions xprof "
        'names XlaModule), or nowhere ("")',
    ),
    "layer": _str("the layer it belongs to (None: outside every layer)", nullable=True),
    "direction": _enum(["forward", "backward", "unknown"], "the pass it ran in"),
    "total_duration_us": _num(_US + ", every launch"),
    "occurrences": _int("launches"),
    "precision": _enum(list(PROFILE_PRECISIONS), "what its arithmetic reads, from its name"),
    "tensor_core": _enum(["yes", "no", "unknown"], "whether it ran on Tensor Cores"),
    "pattern": _str("the kernel family that matched (docs/kernels.md; empty: none)"),
    "kind": _str("gemm, conv, elementwise, reduction, copy, fusion, ..."),
    "evidence": _str("what decided: name, op, name+xprof, ..."),
    "eligible": _bool("a matrix multiply or convolution (Tensor Core eligible)"),
    "eligible_not_tensor_core": _bool("eligible, and a float32 or CUDA-core kernel"),
    "xprof_tensor_core": _bool("xprof's 'Kernel uses TensorCore'", nullable=True),
    "xprof_tensor_core_eligible": _bool("xprof's 'Op is TensorCore eligible'", nullable=True),
    "grid_dim": _str("launch grid x,y,z"),
    "block_dim": _str("block x,y,z"),
}
_BY_PRECISION = _obj(
    {p: _num() for p in PROFILE_PRECISIONS}, "one value per precision", required=[]
)
_PROFILE_KERNEL_SUMMARY = _obj(
    {
        "total_us": _num("device time of every kernel, " + _US),
        "kernels": _int("distinct kernels"),
        "by_precision_us": _BY_PRECISION,
        "by_precision_share": _BY_PRECISION,
        "tensor_core_by_precision_us": _BY_PRECISION,
        "share_16bit": _num("share of device time in float16 and bfloat16 kernels"),
        "unknown_share": _num("share in kernels of unknown precision"),
        "tensor_core_us": _num("time on Tensor Cores (mpwatch's reading of the kernel names)"),
        "tensor_core_share": _num("tensor_core_us / total_us"),
        "tensor_core_unknown_share": _num("share in kernels whose Tensor Core use is unknown"),
        "xprof_tensor_core_us": _num("time xprof's 'Kernel uses TensorCore' marks"),
        "xprof_tensor_core_share": _num(
            "xprof's share: a substring list of Volta/Turing-era names, which misses most "
            "Ampere/Hopper Tensor Core kernels"
        ),
        "tensor_core_missed_by_xprof_share": _num(
            "share on Tensor Cores by the name that xprof does not mark: why the two differ"
        ),
        "xprof_eligible_share": _num("share xprof marks 'Op is TensorCore eligible'"),
        "eligible_us": _num("time in matmul/convolution kernels"),
        "eligible_share": _num("eligible_us / total_us"),
        "eligible_not_tensor_core_us": _num("eligible time not on Tensor Cores"),
        "eligible_not_tensor_core_share": _num("eligible_not_tensor_core_us / total_us"),
        "eligible_tensor_core_unknown_us": _num("eligible time whose Tensor Core use is unknown"),
        "attributed_us": _num("time of kernels joined to a layer"),
        "unattributed_us": _num("time of kernels outside every layer (optimizer, loss, XLA)"),
        "forward_us": _num("time in the forward pass"),
        "backward_us": _num("time in the backward pass"),
        "direction_unknown_us": _num("time whose pass is unknown"),
        "op_name_from_hlo_us": _num("time of kernels joined through the HLO metadata"),
        "unknown_kernels": _t(
            "array", "the longest kernels no pattern knows (up to 10)", items=_str()
        ),
    },
    "device_kernels: the run's kernel figures (mpwatch/profile.py: kernel_time)",
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

_RUN_INFO = _record_schema(
    KIND_RUN_INFO,
    "The run's facts, written when each fit starts (record/monitor.py: run_info).",
    {
        "policy": _str("the model's dtype policy: mixed_float16, mixed_bfloat16, float32, ..."),
        "compute_dtype": _str(_DTYPE),
        "variable_dtype": _str(_DTYPE),
        "loss_scale": _obj(
            {
                "kind": _enum(["dynamic", "none"]),
                "reason": _str("why there is none", nullable=True),
                "initial": _num("the initial scale", nullable=True),
                "growth_interval": _int("steps between doublings", nullable=True),
            },
            "the loss scale's facts",
        ),
        "model": _obj(
            {
                "name": _str(),
                "class": _str(),
                "kind": _enum(_MODEL_KIND),
                "params": _int("parameters"),
            },
            "the model",
        ),
        "optimizer": _str('"LossScaleOptimizer(Adam)", or the optimizer\'s class'),
        "backend": _enum(
            ["tensorflow", "jax"], "Keras' backend (absent in older records: tensorflow)"
        ),
        "strategy": _str(
            "the tf.distribute strategy's class (TensorFlow), the keras.distribution's class or "
            '"None" (JAX)'
        ),
        "num_replicas": _int("replicas in sync"),
        "steps_per_execution": _int("batches per train-function call"),
        "batch_size": _int("Keras' batch size (None when unknown)", nullable=True),
        "log_every": _int("interval of the interval scalars and the gradient health, steps"),
        "chief": _bool("this process writes (the chief under multi-worker training)"),
        "start": _obj(
            {
                "iterations": _int("the optimizer's iterations"),
                "loss_scale": _num("the loss scale", nullable=True),
            },
            "the optimizer's state before the fit's first batch (the record's step is the step "
            "before it): how a resumed run finds its step (record/resume.py)",
            nullable=True,
        ),
        "device": _obj(
            {
                "type": _enum(["GPU", "CPU"]),
                "name": _str(),
                "compute_capability": _str('"8.0" (None on a CPU)', nullable=True),
                "tensor_cores": _bool(),
            },
            "the device trained on",
        ),
        "versions": _obj(
            {
                "mpwatch": _str(),
                "keras": _str(),
                "tensorflow": _str("None where TensorFlow is not in play", nullable=True),
                "jax": _str("None where JAX is not in play", nullable=True),
            },
            "library versions",
            required=["mpwatch", "keras", "tensorflow"],
        ),
    },
    [
        "policy",
        "compute_dtype",
        "variable_dtype",
        "loss_scale",
        "model",
        "optimizer",
        "strategy",
        "num_replicas",
        "steps_per_execution",
        "batch_size",
        "log_every",
        "chief",
        "start",
        "device",
        "versions",
    ],
)

_LAYERS = _record_schema(
    KIND_LAYERS,
    "The per-layer dtype table, when training begins and whenever it changes "
    "(record/layer_dtypes.py).",
    {
        "layers": _table_schema(
            LAYERS_COLUMNS + LAYERS_GRAPH_COLUMNS,
            {**LAYERS_COLUMN_TYPES, **LAYERS_GRAPH_COLUMN_TYPES},
            "one row per layer (records before issue 24 lack the last three columns)",
        ),
        "class_modules": _t(
            "object",
            "each layer class of the table -> the module defining it (keras.src... for Keras' own, "
            "__main__ or the user's package for a custom layer); absent in older records",
            additionalProperties=_str(),
        ),
    },
    ["layers"],
)

_GRAD_VARIABLES = _record_schema(
    KIND_GRAD_VARIABLES,
    "Per-variable health of the scaled training gradients g*S, every log_every steps "
    "(record/gradient_health.py).",
    {
        "loss_scale": _num("S, the scale of these gradients (1.0 without a loss scale)"),
        "variables": _table_schema(
            GRAD_VARIABLE_COLUMNS, GRAD_VARIABLE_COLUMN_TYPES, "one row per trainable variable"
        ),
    },
    ["loss_scale", "variables"],
)

_PROBE_MODEL = _obj(
    {
        "ref_nonzero": _int("reference gradient elements nonzero" + _NO_REF, nullable=True),
        "underflow_count": _int("of those, zero in the mixed gradient" + _NO_REF, nullable=True),
        "underflow_fraction": _num("underflow_count / ref_nonzero" + _NO_REF, nullable=True),
        "grad_rel_error": _num("gradient relative error" + _NO_REF, nullable=True),
        "max_abs_activation": _num("max |activation| (None: none measured)", nullable=True),
        "first_nonfinite_layer": _str(
            'the first layer (forward order) with a non-finite output, or "loss"', nullable=True
        ),
        "size": _int("gradient elements"),
        "nonfinite": _int("non-finite gradient elements"),
        "loss": _num("the mixed model's loss on the probe batch"),
        "ref_loss": _num("the reference's loss" + _NO_REF, nullable=True),
        "train_loss": _num(
            "the loss Keras' train step computes on the probe batch with the same weights (the "
            "model's own call in training mode); compared with the probe's own-policy pass"
        ),
        "activation_headroom_bits": _num("log2(format max / max_abs_activation)", nullable=True),
        "zero_fraction": _num(
            "written only without a float32 reference: the share of exactly-zero mixed gradient "
            "elements (an upper bound of underflow that includes genuine zeros)"
        ),
        "max_abs_ref_grad": _num(
            "float16 and pre-flight modes: the max |reference gradient| the recommended scale "
            "was derived from"
        ),
        "margin_bits": _num("float16 and pre-flight modes: the headroom the recommendation keeps"),
    },
    "model-wide results",
    required=[
        "ref_nonzero",
        "underflow_count",
        "underflow_fraction",
        "grad_rel_error",
        "max_abs_activation",
        "first_nonfinite_layer",
        "size",
        "nonfinite",
        "loss",
        "ref_loss",
        "activation_headroom_bits",
    ],
)

_PROBE = _record_schema(
    KIND_PROBE,
    "The probe against a float32 reference at one step (record/probe.py: Probe._payload).",
    {
        "mode": _enum(
            ["float16", "bfloat16", "preflight"],
            "mixed_float16, mixed_bfloat16, or a float32 model probed as mixed_float16",
        ),
        "loss_scale": _num("the scale S the mixed gradients were taken at (None: bfloat16)", True),
        "reference": _enum(
            ["float32_twin", "none"],
            "what the mixed gradients are compared to: float32_twin is the same model and "
            "weights with its mixed layers switched to float32 (record/twin.py)",
        ),
        "fix_checks": _t(
            "array",
            "written when the forward pass went non-finite (TensorFlow): each candidate fix "
            "re-run on the same batch and weights (record/fix_check.py), in order",
            items=_obj(
                {
                    "fix": _enum(
                        ["none", "float32_layers", "normalize_inputs"],
                        "none: the pass as it is (the first entry)",
                    ),
                    "layers": _t("array", "the layers kept float32", items=_str()),
                    "finite": _bool("the pass (activations, loss, scaled gradients) is finite"),
                    "in_range": _bool(
                        "finite, and the 16-bit activations stay 2^3 below float16's maximum"
                    ),
                    "first_nonfinite_layer": _str(
                        'where it is still not finite (a layer, "loss", "gradients"), or None',
                        nullable=True,
                    ),
                    "max_abs_activation_16bit": _num("max finite |activation| of 16-bit layers"),
                    "loss": _num("the loss with the fix (None: not finite)", nullable=True),
                },
                "one candidate fix and what it did",
            ),
        ),
        "grad_fix_checks": _t(
            "array",
            "written when a layer's gradient error stands out (float16): the pass re-run with "
            "that layer in float32 (record/fix_check.py: check_gradient_fixes)",
            items=_obj(
                {
                    "layer": _str("the layer kept in float32"),
                    "before": _num("its gradient relative error as it is"),
                    "after": _num("its gradient relative error in float32", nullable=True),
                },
                "one layer checked",
            ),
        ),
        "reliable": _bool(
            "the probe's loss agrees with the train step's loss on the same batch and weights "
            "(None: cannot be checked, e.g. a custom train_step); False: no finding rests on it",
            nullable=True,
        ),
        "unreliable_reason": _str("why the probe is not (known to be) reliable", nullable=True),
        "random_layers_off": _t(
            "array",
            "layers with random draws (Dropout, noise, augmentation) run as in inference in both "
            "passes; every other layer runs in training mode (BatchNormalization on batch "
            "statistics, its state restored afterwards)",
            items=_str(),
        ),
        "batch": _obj(
            {
                "size": _int("the probe batch's leading dimension", nullable=True),
                "source": _enum(
                    ["training", "probe_data"],
                    "training: the first batch the training loop fed (its size is the training "
                    "batch size); probe_data: given by the user",
                ),
            },
            "the probe batch",
        ),
        "inputs": _table_schema(
            PROBE_INPUT_COLUMNS,
            PROBE_INPUT_COLUMN_TYPES,
            "one row per float model input: integer ids a 16-bit cast rounds (record/inputs.py)",
        ),
        "reference_note": _str("how the reference was made, or why there is none", True),
        "model_kind": _enum(_MODEL_KIND, "how the model was built (a twin needs its config)"),
        "variables": _table_schema(
            PROBE_VARIABLE_COLUMNS, PROBE_VARIABLE_COLUMN_TYPES, "one row per trainable variable"
        ),
        "layers": _table_schema(PROBE_LAYER_COLUMNS, PROBE_LAYER_COLUMN_TYPES, "one row per layer"),
        "model": _PROBE_MODEL,
        "histogram": _obj(
            {
                "edges_log2": _t("array", "bin edges, log2 of |gradient|", items=_num()),
                "counts": _t("array", "elements per bin (len(edges_log2) - 1)", items=_int()),
                "zeros": _int("elements exactly 0"),
                "window_log2": _t(
                    "array",
                    "the format's window in log2 of the unscaled gradient (shifted by -log2 S)",
                    items=_num(),
                    minItems=2,
                    maxItems=2,
                ),
                "source": _enum(
                    ["reference", "mixed_unscaled"],
                    "whose gradients: the float32 reference's, or the mixed ones without one",
                ),
            },
            "log2 histogram of the gradients against the format's window",
        ),
        "sweep": _table_schema(
            PROBE_SWEEP_COLUMNS,
            PROBE_SWEEP_COLUMN_TYPES,
            "predicted underflow and overflow at each power-of-two scale (empty under bfloat16)",
        ),
        "recommended_scale": _num("a loss scale to use (None: bfloat16, or none fits)", True),
    },
    [
        "mode",
        "loss_scale",
        "reference",
        "reference_note",
        "model_kind",
        "variables",
        "layers",
        "model",
        "histogram",
        "sweep",
        "recommended_scale",
    ],
    {  # no reference: model.zero_fraction is what can be measured
        "if": {"required": ["reference"], "properties": {"reference": {"const": "none"}}},
        "then": {"properties": {"model": {"required": ["zero_fraction"]}}},
    },
    {  # a loss scale to recommend: what it was derived from
        "if": {"required": ["mode"], "properties": {"mode": {"enum": ["float16", "preflight"]}}},
        "then": {"properties": {"model": {"required": ["max_abs_ref_grad", "margin_bits"]}}},
    },
)

_PROFILE = _record_schema(
    KIND_PROFILE,
    "The profiler summary: per-layer time by precision and per-op-type time "
    "(mpwatch/profile.py: summarize; record/profile_capture.py writes it). On a trace with GPU "
    "kernels (source device_kernels) also each kernel's precision and Tensor Core use from its "
    "name, per layer and for the run, beside xprof's own Tensor Core flag.",
    {
        "steps": _t(
            ["array", "null"], "first and last profiled step", items=_int(), minItems=2, maxItems=2
        ),
        "device": _enum(["GPU", "CPU"], "where the profiled ops ran"),
        "total_us": _num("profiled time, microseconds"),
        "unattributed_us": _num("time of ops outside every layer"),
        "unattributed_by_category": _t(
            "object",
            "that time by category (input_pipeline, loss, ...)",
            additionalProperties=_num(),
        ),
        "cast_us": _num("time in Cast ops"),
        "cast_share": _num("cast_us / total_us"),
        "share_16bit": _num("share of the time in 16-bit ops"),
        "layers": _table_schema(
            PROFILE_LAYER_COLUMNS, PROFILE_LAYER_COLUMN_TYPES, "time per layer, by precision"
        ),
        "op_types": _table_schema(
            PROFILE_OP_TYPE_COLUMNS, PROFILE_OP_TYPE_COLUMN_TYPES, "time per op type"
        ),
        "trace_dir": _str("where the trace is (TensorBoard's Profile tab reads it too)"),
        "side": _str('"device" (GPU ops) or "host"'),
        "tool": _str("the converter's tool name"),
        "bits_rule": _str("how an op's precision was decided, in words"),
        "layers_dropped": _int("layers left out of the table to keep the record small"),
        "source": _enum(
            list(PROFILE_SOURCES),
            "where per-layer precision and time come from: device_kernels (the GPU kernels, "
            "kernel_* keys), host_ops (ops on the host counted in their layer's dtype: a CPU), "
            "device_ops (device ops without kernels); absent in older records: "
            "profile_source() derives it from side",
        ),
        "kernel_summary": _PROFILE_KERNEL_SUMMARY,
        "kernel_layers": _table_schema(
            PROFILE_KERNEL_LAYER_COLUMNS,
            PROFILE_KERNEL_LAYER_COLUMN_TYPES,
            "device_kernels: per layer, device time by pass, precision and Tensor Core use",
        ),
        "kernels": _table_schema(
            PROFILE_KERNEL_COLUMNS,
            PROFILE_KERNEL_COLUMN_TYPES,
            "device_kernels: the classified kernels, longest first",
        ),
        "kernels_dropped": _int("kernels left out of that table to keep the record small"),
        "kernel_tool": _str("the converter's tool for the kernels (kernel_stats)"),
        "kernel_rules": _str("how a kernel's precision and Tensor Core use were decided"),
        "precisions": _t("array", "the precisions a kernel is classified in", items=_str()),
        "kernel_note": _str("why a trace has no kernel figures (a failed conversion)"),
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

_NOTICE = _record_schema(
    KIND_NOTICE,
    "A recording part that stopped or is unavailable, and why (record/base.py: _notice).",
    {
        "part": _str('the recording part: "probe", "loss_scale", "gradient_health", ...'),
        "level": _enum(["error", "info"], "error: the part stopped; info: it is unavailable"),
        "message": _str("what happened"),
    },
    ["part", "level", "message"],
)

_OPTIMIZER = _obj(
    {
        "name": _str(
            'how the model holds it: "optimizer" (the compiled one) or the attribute name '
            '("d_optimizer")'
        ),
        "class": _str('its class: "Adam", "LossScaleOptimizer(Adam)"'),
        "compiled": _bool("it is the optimizer given to compile() (model.optimizer)"),
        "loss_scaled": _bool("a LossScaleOptimizer: it unscales and skips non-finite steps"),
        "iterations_start": _int("its iterations when the fit began"),
        "iterations": _int("its iterations when the record was written"),
        "loss_scale": _num("its dynamic scale now (None: not loss-scaled)", nullable=True),
    },
    "one optimizer the model holds",
)

_TRAIN_STEP = _record_schema(
    KIND_TRAIN_STEP,
    "The train step's contract (record/train_step.py): where train_step is defined, whether "
    "the model has a forward pass of its own, and every optimizer it holds with whether it "
    "stepped and whether it scales the loss. Written when each fit starts and at each epoch's "
    "end and the fit's end (the latest wins).",
    {
        "custom_train_step": _bool("train_step is the user's, not Keras' own"),
        "train_step_owner": _str(
            "the class defining train_step (module.QualName), None for Keras' own", nullable=True
        ),
        "has_call": _bool(
            "the model has a forward pass (Functional, Sequential, or a call() of its own); a "
            "GAN-style model whose train_step runs sub-models has none"
        ),
        "optimizers": _t("array", "every optimizer the model holds", items=_OPTIMIZER),
    },
    ["custom_train_step", "train_step_owner", "has_call", "optimizers"],
)

#: record kind -> JSON Schema (draft 2020-12) of its decoded payload
PAYLOAD_SCHEMAS: dict[str, dict[str, Any]] = {
    KIND_RUN_INFO: _RUN_INFO,
    KIND_LAYERS: _LAYERS,
    KIND_GRAD_VARIABLES: _GRAD_VARIABLES,
    KIND_PROBE: _PROBE,
    KIND_PROFILE: _PROFILE,
    KIND_NOTICE: _NOTICE,
    KIND_TRAIN_STEP: _TRAIN_STEP,
}


def required_keys(kind: str) -> list[str]:
    """The keys every (whole, or head) record of ``kind`` has.

    >>> required_keys(KIND_NOTICE)
    ['part', 'level', 'message']
    """
    schema = PAYLOAD_SCHEMAS[kind]
    if "required" in schema:
        return list(schema["required"])
    return list(schema["allOf"][0]["else"]["required"])


# --- encoding (pure Python: the reader and the plugin use these without TensorFlow) ---------------
def metadata_content(kind: str) -> bytes:
    """The plugin content of a record's summary metadata."""
    return json.dumps({"schema": SCHEMA_VERSION, "kind": kind, "encoding": ENCODING}).encode()


def parse_metadata_content(content: bytes) -> dict[str, Any]:
    """Parse a record's plugin content; raises ValueError when mpwatch cannot read the record."""
    try:
        meta = json.loads(content.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"mpwatch record metadata is not JSON: {e}") from e
    if not isinstance(meta, dict) or "schema" not in meta:
        raise ValueError("mpwatch record metadata has no schema version")
    if meta["schema"] > SCHEMA_VERSION:
        raise ValueError(
            f"record written with schema {meta['schema']}, this mpwatch reads up to "
            f"{SCHEMA_VERSION}: upgrade mpwatch"
        )
    if meta.get("encoding", ENCODING) != ENCODING:
        raise ValueError(f"unknown record encoding {meta.get('encoding')!r}")
    return meta


def encode_payload(payload: Mapping[str, Any]) -> bytes:
    """JSON + zlib. Numpy scalars and arrays are converted to plain Python first."""
    return encode_plain(json_safe(payload, nonfinite="keep"))


def encode_plain(payload: Mapping[str, Any]) -> bytes:
    """:func:`encode_payload` of a payload that is plain Python already (``json_safe``'d, with
    ``nonfinite="keep"``): no second walk over a large table."""
    text = json.dumps(payload, separators=(",", ":"), allow_nan=True)
    return zlib.compress(text.encode("utf-8"), 6)


def decode_payload(blob: bytes) -> dict[str, Any]:
    """Inverse of :func:`encode_payload`; raises ValueError on corrupt data."""
    try:
        return json.loads(zlib.decompress(blob).decode("utf-8"))
    except (zlib.error, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"corrupt mpwatch record payload: {e}") from e


def table(columns: list[str], rows: list[list[Any]]) -> dict[str, Any]:
    """A table in the record layout (pandas 'split' orient)."""
    return {"columns": list(columns), "data": [list(r) for r in rows]}


def finite_float(value: Any) -> float | None:
    """``float(value)`` when it is a finite number, else None (None, text, NaN, infinities).

    >>> finite_float("2"), finite_float(float("nan")), finite_float(None)
    (2.0, None, None)
    """
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def json_safe(value: Any, *, nonfinite: str = "null") -> Any:
    """Plain Python for JSON: numpy arrays and scalars become lists and numbers, keys strings.

    ``nonfinite="null"`` (browsers, reports) turns NaN and infinities into ``None``;
    ``nonfinite="keep"`` keeps them (the records on disk, which Python's ``json`` reads back).

    >>> json_safe({"a": float("nan"), 1: (2.0, float("inf"))})
    {'a': None, '1': [2.0, None]}
    """
    if isinstance(value, Mapping):
        return {str(k): json_safe(v, nonfinite=nonfinite) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v, nonfinite=nonfinite) for v in value]
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return json_safe(value.tolist(), nonfinite=nonfinite)
    if isinstance(value, float) and not math.isfinite(value) and nonfinite == "null":
        return None
    return value


# --- event files and the order of writes (the reader, the plugin and resume all apply these) ------
def is_event_file(name: str) -> bool:
    """Whether a file name is an event file TensorBoard reads (not a temporary or lock file)."""
    return "tfevents" in name and not name.endswith((".tmp", ".lock"))


def event_files(path: str) -> list[str]:
    """The event files directly in directory ``path``, in TensorBoard's order: by the timestamp in
    the name, then the name. Raises OSError when ``path`` cannot be listed."""
    names = [n for n in os.listdir(path) if is_event_file(n)]

    def key(n: str) -> tuple[int, str]:
        parts = n.split(".")
        try:
            i = parts.index("tfevents")
            return (int(parts[i + 1]), n)
        except (ValueError, IndexError):
            return (0, n)

    return [os.path.join(path, n) for n in sorted(names, key=key)]


def later_writes_win(seq: Any, step: Any, strict: bool = False) -> Any:
    """Indices (into arrays in write order) of the values that survive 'later writes win': a value
    is dropped when a later write has a step <= its step (< with strict: several records at one
    step are parts of one). A resumed run rewrites the steps after its checkpoint this way, as
    TensorBoard's purge of orphaned data does.

    >>> import numpy as np
    >>> later_writes_win(np.arange(5), np.array([1, 2, 3, 2, 3])).tolist()  # a resume at step 2
    [0, 3, 4]
    """
    import numpy as np

    n = len(step)
    if not n:
        return np.zeros(0, dtype=np.int64)
    rev_min = np.minimum.accumulate(step[::-1])[::-1]
    later_min = np.empty(n, dtype=step.dtype)
    later_min[:-1] = rev_min[1:]
    later_min[-1] = np.iinfo(np.int64).max
    keep = step < later_min if not strict else step <= later_min
    return np.nonzero(keep)[0]
