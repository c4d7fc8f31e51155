"""The on-disk contract: every tag, every record kind, the column lists and the payload schemas.

Pure data and pure functions, no TensorFlow: ``mpwatch/record/runtime/writer.py`` (the only code
that writes events) encodes with it, ``mpwatch/read/`` and the TensorBoard plugin decode with it.

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
has run, 1 for the first batch, continued across ``fit`` calls (see ``record/runtime/state.py``).
This is not ``optimizer.iterations``, which does not advance on a skipped step.

The package, one module per job:

- ``tags``: the plugin name, the schema version, every scalar tag, every record kind and its tag;
- ``schema``: the payload schemas' machinery (typed fields, split tables, a kind's schema; the
  record size limit a split record keeps to);
- one module per record kind: ``run_info``, ``layers``, ``grad_variables``, ``probe``,
  ``profile``, ``notice``, ``train_step``, ``budget``, ``updates``, ``memory`` (its table
  columns, their types, its payload schema);
- ``payloads``: ``PAYLOAD_SCHEMAS`` by kind and ``required_keys``;
- ``encoding``: a record's bytes (metadata, JSON + zlib, tables, plain-Python values);
- ``events``: event files and the order of writes ("later writes win").

Everything is imported from here: ``contract.X``.

Example:
    >>> from mpwatch import contract
    >>> contract.record_tag(contract.KIND_PROBE)
    'mpwatch/record/probe'
    >>> contract.decode_payload(contract.encode_payload({"a": 1}))
    {'a': 1}
"""

from __future__ import annotations

from mpwatch.contract.encoding import (
    decode_payload,
    encode_payload,
    encode_plain,
    finite_float,
    json_safe,
    metadata_content,
    parse_metadata_content,
    table,
)
from mpwatch.contract.events import (
    event_files,
    is_event_file,
    later_writes_win,
)
from mpwatch.contract.grad_variables import (
    GRAD_VARIABLE_COLUMN_TYPES,
    GRAD_VARIABLE_COLUMNS,
)
from mpwatch.contract.layers import (
    LAYERS_COLUMN_TYPES,
    LAYERS_COLUMNS,
    LAYERS_GRAPH_COLUMN_TYPES,
    LAYERS_GRAPH_COLUMNS,
)
from mpwatch.contract.memory import (
    MEMORY_COLUMN_TYPES,
    MEMORY_COLUMNS,
    MEMORY_KINDS,
    MEMORY_POLICIES,
    POLICY_COLUMN_TYPES,
    POLICY_COLUMNS,
)
from mpwatch.contract.payloads import (
    PAYLOAD_SCHEMAS,
    required_keys,
)
from mpwatch.contract.probe import (
    PROBE_FLOAT8_COLUMN_TYPES,
    PROBE_FLOAT8_COLUMNS,
    PROBE_INPUT_COLUMN_TYPES,
    PROBE_INPUT_COLUMNS,
    PROBE_LAYER_COLUMN_TYPES,
    PROBE_LAYER_COLUMNS,
    PROBE_SWEEP_COLUMN_TYPES,
    PROBE_SWEEP_COLUMNS,
    PROBE_VARIABLE_COLUMN_TYPES,
    PROBE_VARIABLE_COLUMNS,
)
from mpwatch.contract.profile import (
    PROFILE_KERNEL_COLUMN_TYPES,
    PROFILE_KERNEL_COLUMNS,
    PROFILE_KERNEL_LAYER_COLUMN_TYPES,
    PROFILE_KERNEL_LAYER_COLUMNS,
    PROFILE_LAYER_COLUMN_TYPES,
    PROFILE_LAYER_COLUMNS,
    PROFILE_OP_TYPE_COLUMN_TYPES,
    PROFILE_OP_TYPE_COLUMNS,
    PROFILE_PRECISIONS,
    PROFILE_SOURCES,
    PROFILE_UNJOINED_MATH,
    profile_source,
)
from mpwatch.contract.schema import (
    JSON_SCHEMA_DIALECT,
    MAX_RECORD_BYTES,
)
from mpwatch.contract.tags import (
    ENCODING,
    GRAD_HEADROOM_BITS,
    GRAD_MAX_ABS,
    GRAD_NONFINITE_COUNT,
    GRAD_SUBNORMAL_FRACTION,
    GRAD_ZERO_FRACTION,
    INPUT_MAX_ABS,
    INPUT_NONFINITE_COUNT,
    KIND_BUDGET,
    KIND_GRAD_VARIABLES,
    KIND_LAYERS,
    KIND_MEMORY,
    KIND_NOTICE,
    KIND_PROBE,
    KIND_PROFILE,
    KIND_RUN_INFO,
    KIND_TRAIN_STEP,
    KIND_UPDATES,
    LOSS_SCALE,
    PEAK_MEMORY_MB,
    PLUGIN_NAME,
    PREFIX,
    PROBE_ACTIVATION_HEADROOM_BITS,
    PROBE_GRAD_REL_ERROR,
    PROBE_RECOMMENDED_SCALE,
    PROBE_UNDERFLOW_FRACTION,
    RECORD_KINDS,
    RECORD_PREFIX,
    SCALAR_DOCS,
    SCALAR_TAGS,
    SCHEMA_VERSION,
    SKIPPED_STEPS,
    SKIPPED_STEPS_TOTAL,
    STEP_SKIPPED,
    STEP_TIME_MS,
    TRAIN_LOSS,
    UPDATES_LOST_FRACTION,
    kind_of_tag,
    record_tag,
)
from mpwatch.contract.updates import UPDATE_COLUMN_TYPES, UPDATE_COLUMNS

__all__ = [
    "ENCODING",
    "GRAD_HEADROOM_BITS",
    "GRAD_MAX_ABS",
    "GRAD_NONFINITE_COUNT",
    "GRAD_SUBNORMAL_FRACTION",
    "GRAD_VARIABLE_COLUMNS",
    "GRAD_VARIABLE_COLUMN_TYPES",
    "GRAD_ZERO_FRACTION",
    "INPUT_MAX_ABS",
    "INPUT_NONFINITE_COUNT",
    "JSON_SCHEMA_DIALECT",
    "KIND_BUDGET",
    "KIND_GRAD_VARIABLES",
    "KIND_LAYERS",
    "KIND_MEMORY",
    "KIND_NOTICE",
    "KIND_PROBE",
    "KIND_PROFILE",
    "KIND_RUN_INFO",
    "KIND_TRAIN_STEP",
    "KIND_UPDATES",
    "LAYERS_COLUMNS",
    "LAYERS_COLUMN_TYPES",
    "LAYERS_GRAPH_COLUMNS",
    "LAYERS_GRAPH_COLUMN_TYPES",
    "LOSS_SCALE",
    "MAX_RECORD_BYTES",
    "MEMORY_COLUMNS",
    "MEMORY_COLUMN_TYPES",
    "MEMORY_KINDS",
    "MEMORY_POLICIES",
    "PAYLOAD_SCHEMAS",
    "PEAK_MEMORY_MB",
    "PLUGIN_NAME",
    "POLICY_COLUMNS",
    "POLICY_COLUMN_TYPES",
    "PREFIX",
    "PROBE_ACTIVATION_HEADROOM_BITS",
    "PROBE_FLOAT8_COLUMNS",
    "PROBE_FLOAT8_COLUMN_TYPES",
    "PROBE_GRAD_REL_ERROR",
    "PROBE_INPUT_COLUMNS",
    "PROBE_INPUT_COLUMN_TYPES",
    "PROBE_LAYER_COLUMNS",
    "PROBE_LAYER_COLUMN_TYPES",
    "PROBE_RECOMMENDED_SCALE",
    "PROBE_SWEEP_COLUMNS",
    "PROBE_SWEEP_COLUMN_TYPES",
    "PROBE_UNDERFLOW_FRACTION",
    "PROBE_VARIABLE_COLUMNS",
    "PROBE_VARIABLE_COLUMN_TYPES",
    "PROFILE_KERNEL_COLUMNS",
    "PROFILE_KERNEL_COLUMN_TYPES",
    "PROFILE_KERNEL_LAYER_COLUMNS",
    "PROFILE_KERNEL_LAYER_COLUMN_TYPES",
    "PROFILE_LAYER_COLUMNS",
    "PROFILE_LAYER_COLUMN_TYPES",
    "PROFILE_OP_TYPE_COLUMNS",
    "PROFILE_OP_TYPE_COLUMN_TYPES",
    "PROFILE_PRECISIONS",
    "PROFILE_SOURCES",
    "PROFILE_UNJOINED_MATH",
    "RECORD_KINDS",
    "RECORD_PREFIX",
    "SCALAR_DOCS",
    "SCALAR_TAGS",
    "SCHEMA_VERSION",
    "SKIPPED_STEPS",
    "SKIPPED_STEPS_TOTAL",
    "STEP_SKIPPED",
    "STEP_TIME_MS",
    "TRAIN_LOSS",
    "UPDATES_LOST_FRACTION",
    "UPDATE_COLUMNS",
    "UPDATE_COLUMN_TYPES",
    "decode_payload",
    "encode_payload",
    "encode_plain",
    "event_files",
    "finite_float",
    "is_event_file",
    "json_safe",
    "kind_of_tag",
    "later_writes_win",
    "metadata_content",
    "parse_metadata_content",
    "profile_source",
    "record_tag",
    "required_keys",
    "table",
]
