"""The ``grad_variables`` record: per-variable health of the scaled training gradients."""

from __future__ import annotations

from typing import Any

from mpwatch.contract import schema as s
from mpwatch.contract.tags import KIND_GRAD_VARIABLES

# Column names of the record's table, in order (the writer builds rows in this order).
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
GRAD_VARIABLE_COLUMN_TYPES: dict[str, Any] = {
    "variable": s._str("the variable's path"),
    "layer": s._str("the layer-table path of the layer owning it"),
    "size": s._int("elements"),
    "zero_fraction": s._num("share of the elements of g*S exactly 0 (NaN when empty)"),
    "subnormal_fraction": s._num("share with 0 < |g*S| < 2**-14 (NaN when empty)"),
    "nonfinite_count": s._num("elements inf or nan"),
    "max_abs": s._num("max |g*S| over the finite elements"),
    "headroom_bits": s._num("log2(65504 / max_abs); Infinity when max_abs is 0"),
}

#: the ``grad_variables`` record's payload schema
SCHEMA = s._record_schema(
    KIND_GRAD_VARIABLES,
    "Per-variable health of the scaled training gradients g*S, every log_every steps "
    "(record/callbacks/gradient_health.py).",
    {
        "loss_scale": s._num("S, the scale of these gradients (1.0 without a loss scale)"),
        "variables": s._table_schema(
            GRAD_VARIABLE_COLUMNS, GRAD_VARIABLE_COLUMN_TYPES, "one row per trainable variable"
        ),
    },
    ["loss_scale", "variables"],
)
