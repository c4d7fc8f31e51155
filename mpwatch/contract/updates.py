"""The ``updates`` record: updates lost to rounding in 16-bit variables, per variable."""

from __future__ import annotations

from typing import Any

from mpwatch.contract import schema as s
from mpwatch.contract.tags import KIND_UPDATES

# Column names of the record's table, in order (the writer builds rows in this order).
UPDATE_COLUMNS = ["variable", "layer", "dtype", "size", "updates", "unchanged", "lost_fraction"]
UPDATE_COLUMN_TYPES: dict[str, Any] = {
    "variable": s._str("the variable's path"),
    "layer": s._str("the layer-table path of the layer owning it"),
    "dtype": s._str("the variable's dtype (float16 or bfloat16: only 16-bit variables are rows)"),
    "size": s._int("elements"),
    "updates": s._num(
        "elements with a nonzero, finite gradient on this step (0 when the step was skipped)"
    ),
    "unchanged": s._num("of those, elements whose value the step left unchanged"),
    "lost_fraction": s._num("unchanged / updates (NaN when updates is 0)"),
}

#: the ``updates`` record's payload schema
SCHEMA = s._record_schema(
    KIND_UPDATES,
    "Updates lost to rounding: per 16-bit trainable variable, how many of the elements the step "
    "meant to move kept their value, every log_every steps (record/tap/lost_updates.py, written by "
    "record/callbacks/gradient_health.py).",
    {
        "variables": s._table_schema(
            UPDATE_COLUMNS, UPDATE_COLUMN_TYPES, "one row per 16-bit trainable variable"
        ),
    },
    ["variables"],
)
