"""A record's bytes: the summary metadata's plugin content, the payload's JSON + zlib, tables and
plain-Python values.

Pure Python: the reader and the plugin use these without TensorFlow.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Mapping
from typing import Any

from mpwatch.contract.tags import ENCODING, SCHEMA_VERSION


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
