"""The generated documents in ``docs/``: the on-disk contract, the rules, the kernel patterns.

Each is rendered from the code that defines it, so it cannot drift (a test compares):

- ``docs/contract.md`` from :mod:`mpwatch.contract` (tags, record kinds, payload schemas);
- ``docs/rules.md`` from the rule files (:mod:`mpwatch.judge.docs`);
- ``docs/kernels.md`` from :mod:`mpwatch.profile.kernel_classes` (GPU kernel name patterns).

Run ``python -m mpwatch.show.docs`` in the repository root to rewrite all three.

Example:
    >>> from mpwatch.show.docs import render_contract
    >>> render_contract().splitlines()[0]
    '# The on-disk contract'
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mpwatch import contract
from mpwatch.judge import docs as rule_docs
from mpwatch.profile import kernel_classes


def _type(schema: dict[str, Any]) -> str:
    if "const" in schema:
        return json.dumps(schema["const"])
    if "enum" in schema:
        return " \\| ".join(json.dumps(v) for v in schema["enum"])
    if "anyOf" in schema or "oneOf" in schema:
        return " or ".join(_type(s) for s in schema.get("anyOf", schema.get("oneOf", [])))
    t = schema.get("type", "any")
    if isinstance(t, list):
        return " or ".join(t)
    if t == "array" and isinstance(schema.get("items"), dict) and schema["items"]:
        return f"array of {_type(schema['items'])}"
    return str(t)


def _is_table(schema: dict[str, Any]) -> bool:
    props = schema.get("properties", {})
    return set(props) >= {"columns", "data"}


def _table_columns(schema: dict[str, Any]) -> list[str]:
    cols = schema["properties"]["columns"]
    return list(cols.get("const") or cols.get("prefixItems") and [] or [])


def _properties(schema: dict[str, Any], depth: int, required: list[str] | None = None) -> list[str]:
    out: list[str] = []
    required = set(schema.get("required", []) if required is None else required)
    pad = "  " * depth
    for name, sub in schema.get("properties", {}).items():
        req = "" if name in required else " (optional)"
        desc = f": {sub['description']}" if sub.get("description") else ""
        if _is_table(sub):
            cols = _table_columns(sub)
            out.append(
                f"{pad}- `{name}`{req}: table, columns {', '.join(f'`{c}`' for c in cols)}{desc}"
            )
        elif sub.get("type") == "object" and sub.get("properties"):
            out.append(f"{pad}- `{name}`{req}: object{desc}")
            out += _properties(sub, depth + 1)
        else:
            out.append(f"{pad}- `{name}`{req}: {_type(sub)}{desc}")
    return out


def render_contract() -> str:
    """``docs/contract.md``: every scalar tag and record kind with its payload schema."""
    lines = [
        "# The on-disk contract",
        "",
        "Generated from `mpwatch/contract/` by `python -m mpwatch.show.docs`; do not edit.",
        "",
        f"- Plugin name `{contract.PLUGIN_NAME}`, schema version {contract.SCHEMA_VERSION}, "
        f"record encoding `{contract.ENCODING}` (zlib-compressed UTF-8 JSON; NaN and Infinity "
        "allowed).",
        f"- A record's compressed payload is at most {contract.MAX_RECORD_BYTES:,} bytes; a larger "
        "one is written as parts at the same step (`part`, `parts`) and joined on read.",
        "- Every value is written at mpwatch's batch step (1 for the first batch, continued across "
        "`fit` calls); a later write at a step at or before an earlier one wins "
        "(`contract.later_writes_win`).",
        "",
        "## Scalars",
        "",
        "Ordinary float32 scalar summaries: TensorBoard's Scalars and Time Series tabs show them.",
        "",
        "| tag | meaning |",
        "| --- | --- |",
    ]
    for tag in contract.SCALAR_TAGS:
        lines.append(f"| `{tag}` | {contract.SCALAR_DOCS[tag]} |")
    lines += [
        "",
        "## Records",
        "",
        "`DATA_CLASS_TENSOR` summaries with plugin name `mpwatch` under the tag "
        f"`{contract.RECORD_PREFIX}<kind>`; the summary metadata's content is "
        '`{"schema": N, "kind": KIND, "encoding": "json+zlib"}`. Writers may add keys; readers '
        "ignore keys they do not know.",
    ]
    for kind in contract.RECORD_KINDS:
        schema = contract.PAYLOAD_SCHEMAS[kind]
        lines += ["", f"### `{kind}`", "", schema.get("description", ""), ""]
        lines += _properties(schema, 0, contract.required_keys(kind))
    return "\n".join(lines).rstrip() + "\n"


#: docs file name -> its renderer
DOCUMENTS: dict[str, Callable[[], str]] = {
    "contract.md": render_contract,
    "rules.md": rule_docs.render_rules_markdown,
    "kernels.md": kernel_classes.render_markdown,
}


def write_all(docs_dir: str | Path = "docs") -> list[Path]:
    """Rewrite every generated document in ``docs_dir``; returns the paths written."""
    out = []
    for name, render in DOCUMENTS.items():
        path = Path(docs_dir) / name
        path.write_text(render())
        out.append(path)
    return out


if __name__ == "__main__":  # pragma: no cover
    for written in write_all(sys.argv[1] if len(sys.argv) > 1 else "docs"):
        print(written)
