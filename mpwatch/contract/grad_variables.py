"""The ``grad_variables`` record: per-variable health of the scaled training gradients."""

from __future__ import annotations

from typing import Any

from mpwatch.contract.schema import _int, _num, _record_schema, _str, _table_schema
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
    "variable": _str("the variable's path"),
    "layer": _str("the layer-table path of the layer owning it"),
    "size": _int("elements"),
    "zero_fraction": _num("share of the elements of g*S exactly 0 (NaN when empty)"),
    "subnormal_fraction": _num("share with 0 < |g*S| < 2**-14 (NaN when empty)"),
    "nonfinite_count": _num("elements inf or nan"),
    "max_abs": _num("max |g*S| over the finite elements"),
    "headroom_bits": _num("log2(65504 / max_abs); Infinity when max_abs is 0"),
}

#: the ``grad_variables`` record's payload schema
SCHEMA = _record_schema(
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
