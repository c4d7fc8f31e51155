"""Every record kind's payload schema by kind, and the keys each kind always has."""

from __future__ import annotations

from typing import Any

from mpwatch.contract import (
    budget,
    grad_variables,
    layers,
    memory,
    notice,
    probe,
    profile,
    run_info,
    tags,
    train_step,
    updates,
)

#: record kind -> JSON Schema (draft 2020-12) of its decoded payload
PAYLOAD_SCHEMAS: dict[str, dict[str, Any]] = {
    tags.KIND_RUN_INFO: run_info.SCHEMA,
    tags.KIND_LAYERS: layers.SCHEMA,
    tags.KIND_GRAD_VARIABLES: grad_variables.SCHEMA,
    tags.KIND_PROBE: probe.SCHEMA,
    tags.KIND_PROFILE: profile.SCHEMA,
    tags.KIND_NOTICE: notice.SCHEMA,
    tags.KIND_TRAIN_STEP: train_step.SCHEMA,
    tags.KIND_BUDGET: budget.SCHEMA,
    tags.KIND_UPDATES: updates.SCHEMA,
    tags.KIND_MEMORY: memory.SCHEMA,
}


def required_keys(kind: str) -> list[str]:
    """The keys every (whole, or head) record of ``kind`` has.

    >>> required_keys(tags.KIND_NOTICE)
    ['part', 'level', 'message']
    """
    schema = PAYLOAD_SCHEMAS[kind]
    if "required" in schema:
        return list(schema["required"])
    return list(schema["allOf"][0]["else"]["required"])
