"""The payload schemas' machinery: typed fields, split tables, and a record kind's schema.

Each record kind's module (``layers``, ``probe``, ``profile``, ...) describes its payload with these
builders; :mod:`mpwatch.contract.payloads` gathers the schemas by kind.
"""

from __future__ import annotations

from typing import Any

from mpwatch.contract.tags import SCHEMA_VERSION

# No record's compressed payload is larger than this. A payload with tables that would be is
# written by ``RunWriter.record`` (record/runtime/writer.py) as several records of its kind at the
# same step: the head (``part`` 0, every key, its large tables' rows moved out), then continuation
# parts
# (``part`` 1, 2, ..., each with ``parts`` and the next rows of one table, in order); ``parts``
# counts the records in all. ``mpwatch.read`` joins them back (a part missing is a reader warning).
# A 1,000-layer model's records stay far below the limit; a model with tens of thousands of
# variables splits its ``grad_variables`` and probe records. TensorBoard's fast data provider
# (RustBoard) keeps one value per tag and step (a later write at a step preempts the earlier ones),
# so the tab, which reads through it, sees only the last part of a split record.
MAX_RECORD_BYTES = 512 * 1024

# --- payload schemas (JSON Schema, draft 2020-12) ------------------------------------------------
# What each writer writes, as data: PAYLOAD_SCHEMAS[kind] (contract/payloads.py) validates one
# record's decoded payload (``jsonschema.validate(payload, PAYLOAD_SCHEMAS[kind])``; jsonschema is a
# test dependency only, mpwatch never imports it). Rules: every key a writer writes is listed with
# its type and a description; the keys always written are required (``required_keys``); other keys
# are allowed (forward compatibility: readers ignore keys they do not know). Numbers may be NaN or
# +-Infinity (a JSON "number" here; Python's ``json`` reads and writes them). Tables are
# ``{"columns": <the kind's column list, exactly>, "data": [[one value per column, typed], ...]}``.
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


# descriptions several kinds share
_DTYPE = "a Keras dtype name: float16, bfloat16, float32, ..."
_MODEL_KIND = ["sequential", "functional", "subclassed"]
