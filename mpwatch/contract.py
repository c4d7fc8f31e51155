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
has run, 1 for the first batch, continued across ``fit`` calls (see ``callbacks/_state.py``). This
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

# A record's compressed payload above this many bytes is refused by the writer: callers split large
# tables. The probe splits its per-variable table into further ``probe`` records at the same step
# marked ``part``/``parts`` (callbacks/probe.py: write_probe_record; reader.py joins them). A 1,000-
# layer model's probe stays far below the limit, so the split is rare; note that TensorBoard's data
# provider keeps one value per tag and step, so the tab sees only the last part of a split record.
MAX_RECORD_BYTES = 512 * 1024

# --- scalar tags -------------------------------------------------------------------------------
# loss scale and skipped steps (callbacks/loss_scale.py)
LOSS_SCALE = "mpwatch/loss_scale"  # LossScaleOptimizer.dynamic_scale after each step
STEP_SKIPPED = "mpwatch/step_skipped"  # 1.0 at a step whose update was dropped, else 0.0
SKIPPED_STEPS = "mpwatch/skipped_steps"  # skipped steps in the log interval ending here
SKIPPED_STEPS_TOTAL = "mpwatch/skipped_steps_total"  # cumulative, across fit calls
# gradient health of the real (scaled) training gradients (callbacks/gradient_health.py)
GRAD_ZERO_FRACTION = "mpwatch/grad/zero_fraction"  # share of elements of g*S exactly 0
GRAD_SUBNORMAL_FRACTION = "mpwatch/grad/subnormal_fraction"  # 0 < |g*S| < 2**-14
GRAD_NONFINITE_COUNT = "mpwatch/grad/nonfinite_count"  # elements inf or nan
GRAD_MAX_ABS = "mpwatch/grad/max_abs"  # max |g*S| over finite elements
GRAD_HEADROOM_BITS = "mpwatch/grad/headroom_bits"  # log2(65504 / max|g*S|)
# speed and memory (callbacks/step_time.py)
STEP_TIME_MS = "mpwatch/perf/step_time_ms"  # median step time over the interval, ms per batch
PEAK_MEMORY_MB = "mpwatch/perf/peak_memory_mb"  # device peak (GPU) or process peak RSS (CPU), MiB
# training loss as Keras reports it (for comparing a mixed run with a float32 run)
TRAIN_LOSS = "mpwatch/train/loss"
# the probe against a float32 reference (callbacks/probe.py)
PROBE_UNDERFLOW_FRACTION = "mpwatch/probe/underflow_fraction"
PROBE_GRAD_REL_ERROR = "mpwatch/probe/grad_rel_error"
PROBE_RECOMMENDED_SCALE = "mpwatch/probe/recommended_scale"
PROBE_ACTIVATION_HEADROOM_BITS = "mpwatch/probe/activation_headroom_bits"

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
)

# --- record kinds (tag = "mpwatch/record/" + kind) ------------------------------------------------
KIND_RUN_INFO = "run_info"  # policy, loss-scale facts, versions, device, strategy (dict)
KIND_LAYERS = "layers"  # the per-layer dtype table (split table)
KIND_GRAD_VARIABLES = "grad_variables"  # per-variable gradient health (split table)
KIND_PROBE = "probe"  # probe results at one step (dict of tables, histogram, sweep)
KIND_PROFILE = "profile"  # profiler summary: per-layer time by dtype, op types (dict)
KIND_NOTICE = "notice"  # a recording part that stopped or is unavailable, and why (dict)

# Payload schemas (schema 1). Writers may add keys; readers ignore keys they do not know. "table"
# means the split layout of :func:`table`. Non-finite floats are allowed.
#
# run_info  {policy, compute_dtype, variable_dtype,
#            loss_scale: {kind: "dynamic"|"none", reason: str|None, initial: float|None,
#                         growth_interval: int|None},
#            model: {name, class, kind: "sequential"|"functional"|"subclassed", params: int},
#            optimizer: str, strategy: str, num_replicas: int, steps_per_execution: int,
#            batch_size: int|None, log_every: int, chief: bool,
#            start: {iterations: int, loss_scale: float|None}  (the optimizer's state before the
#                   fit's first batch; the record's step is the step before it: how a resumed
#                   run finds its step, see mpwatch/callbacks/_resume.py),
#            device: {type: "GPU"|"CPU", name: str, compute_capability: str|None,
#                     tensor_cores: bool},
#            versions: {mpwatch, tensorflow, keras}}
# layers    {layers: table[name, path, class, depth, policy, compute_dtype, variable_dtype,
#                          output_dtype, effective_dtype, params, trainable_params,
#                          tc_dims (dict name->int), tc_aligned (bool|None), is_output (bool),
#                          note (str|None)]}
#           effective_dtype is what the layer really computes in (LayerNormalization under
#           mixed_float16 computes in float32 inside: effective_dtype "float32", note says why).
# grad_variables {loss_scale: float,
#            variables: table[variable, layer, size, zero_fraction, subnormal_fraction,
#                             nonfinite_count, max_abs, headroom_bits]}
# probe     {mode: "float16"|"bfloat16"|"preflight", loss_scale: float|None,
#            reference: "float32_twin"|"none", reference_note: str|None,
#            variables: table[variable, layer, size, ref_nonzero, underflow_count,
#                             underflow_fraction, grad_rel_error],
#            layers: table[layer, ref_nonzero, underflow_count, underflow_fraction,
#                          grad_rel_error, output_rel_error, max_abs_activation,
#                          activation_headroom_bits, act_grad_underflow_fraction, nonfinite],
#            model: {ref_nonzero, underflow_count, underflow_fraction, grad_rel_error,
#                    max_abs_activation, first_nonfinite_layer: str|None},
#            histogram: {edges_log2: [..], counts: [..], zeros: int,
#                        window_log2: [lo, hi]}   # float16 window shifted by -log2(S)
#            sweep: table[scale_log2, scale, predicted_underflow_fraction,
#                         predicted_overflow_fraction],
#            recommended_scale: float|None}
# profile   {steps: [first, last], device: str, total_us: float, unattributed_us: float,
#            cast_us: float, cast_share: float, share_16bit: float,
#            layers: table[layer, time_us, time_16bit_us, time_32bit_us, ops, share],
#            op_types: table[op_type, time_us, bits, count, kept_float32_by_amp (bool)],
#            trace_dir: str}
# notice    {part: str, level: "error"|"info", message: str}

# Column names of the tables above, in order (writers build rows in this order).
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
PROBE_VARIABLE_COLUMNS = [
    "variable",
    "layer",
    "size",
    "ref_nonzero",
    "underflow_count",
    "underflow_fraction",
    "grad_rel_error",
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
PROBE_SWEEP_COLUMNS = [
    "scale_log2",
    "scale",
    "predicted_underflow_fraction",
    "predicted_overflow_fraction",
]

RECORD_KINDS = (
    KIND_RUN_INFO,
    KIND_LAYERS,
    KIND_GRAD_VARIABLES,
    KIND_PROBE,
    KIND_PROFILE,
    KIND_NOTICE,
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
    text = json.dumps(json_safe(payload, nonfinite="keep"), separators=(",", ":"), allow_nan=True)
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
