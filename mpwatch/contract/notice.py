"""The ``notice`` record: a recording part that stopped or is unavailable, and why."""

from __future__ import annotations

from mpwatch.contract import schema as s
from mpwatch.contract.tags import KIND_NOTICE

#: the ``notice`` record's payload schema
SCHEMA = s._record_schema(
    KIND_NOTICE,
    "A recording part that stopped or is unavailable, and why (record/callbacks/base.py: _notice).",
    {
        "part": s._str('the recording part: "probe", "loss_scale", "gradient_health", ...'),
        "level": s._enum(["error", "info"], "error: the part stopped; info: it is unavailable"),
        "message": s._str("what happened"),
    },
    ["part", "level", "message"],
)
