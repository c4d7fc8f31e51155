"""The ``memory`` record: training memory by kind and dtype, and what other policies would need."""

from __future__ import annotations

from typing import Any

from mpwatch.contract import schema as s
from mpwatch.contract.tags import KIND_MEMORY

#: what is counted, in the table's order
MEMORY_KINDS = ["weights", "gradients", "optimizer_state", "activations"]
#: the policies every record compares (besides the run's own)
MEMORY_POLICIES = ["float32", "mixed_float16", "mixed_bfloat16"]

MEMORY_COLUMNS = ["kind", "dtype", "elements", "bytes"]
MEMORY_COLUMN_TYPES: dict[str, Any] = {
    "kind": s._enum(MEMORY_KINDS, "weights, gradients, optimizer_state or activations"),
    "dtype": s._str(s._DTYPE),
    "elements": s._int("elements of this kind stored in this dtype"),
    "bytes": s._int("elements x the dtype's size"),
}
POLICY_COLUMNS = ["policy", *MEMORY_KINDS, "total"]
POLICY_COLUMN_TYPES: dict[str, Any] = {
    "policy": s._str("a global dtype policy (the run's own first)"),
    **{k: s._int(f"bytes of {k.replace('_', ' ')} under this policy") for k in MEMORY_KINDS},
    "total": s._int("the four together"),
}

#: the ``memory`` record's payload schema
SCHEMA = s._record_schema(
    KIND_MEMORY,
    "Training memory by kind and dtype under the run's policy, and what float32, mixed_float16 "
    "and mixed_bfloat16 would need (record/model/memory.py). Weights: every variable of the model; "
    "gradients: one per trainable variable, in its dtype; optimizer state: the optimizer's "
    "variables; activations: the outputs of every leaf layer for one batch (what the backward "
    "pass keeps, estimated: XLA may fuse or recompute some, and a layer's own intermediates are "
    "not counted).",
    {
        "policy": s._str("the run's global policy"),
        "batch_size": s._int("the batch the activations are counted for", nullable=True),
        "by_dtype": s._table_schema(MEMORY_COLUMNS, MEMORY_COLUMN_TYPES, "kind x dtype"),
        "by_policy": s._table_schema(
            POLICY_COLUMNS,
            POLICY_COLUMN_TYPES,
            "bytes under each policy (layers that keep their own policy keep it)",
        ),
    },
    ["policy", "by_dtype", "by_policy"],
)
