"""Float8 readiness per layer, as a person reads it: the latest probe's ``float8`` table
(:mod:`mpwatch.record.probe.float8`) for the HTML report and the TensorBoard tab.

Example:
    >>> from mpwatch.read.run import Run
    >>> float8_view(Run(name=".", path="")) is None
    True
"""

from __future__ import annotations

from html import escape
from typing import Any

from mpwatch.read.run import Run
from mpwatch.words import percent

COLUMNS = ["layer", "class", "ready", "output float8", "output 16-bit", "dx float8", "dx 16-bit",
           "dW float8", "dW 16-bit", "flushed (x / W / g)", "why not"]  # fmt: skip


def float8_view(run: Run) -> dict[str, Any] | None:
    """``{"step", "mode", "columns", "rows", "ready", "total"}`` from the latest reliable probe
    with a float8 table (rows of text), or None."""
    probe = run.latest_float8()
    if probe is None or not len(probe.float8):
        return None
    low = "bfloat16" if probe.model.get("mode") == "bfloat16" else "float16"
    rows = []
    for r in probe.float8.to_dict("records"):
        rows.append(
            [str(r["layer"]), str(r["class"]), "yes" if r["ready"] else "no",
             percent(r["out_error_8"]), percent(r["out_error_16"]), percent(r["dx_error_8"]),
             percent(r["dx_error_16"]), percent(r["dw_error_8"]), percent(r["dw_error_16"]),
             " / ".join(percent(r[k]) for k in ("x_flush", "w_flush", "g_flush")),
             str(r["reason"] or "")]
        )  # fmt: skip
    columns = [c.replace("16-bit", low) for c in COLUMNS]
    ready = int(probe.float8["ready"].astype(bool).sum())
    return {"step": probe.step, "mode": low, "columns": columns, "rows": rows, "ready": ready,
            "total": len(rows)}  # fmt: skip


def float8_html(run: Run) -> str:
    """The HTML report's float8 readiness section (empty without a float8 table)."""
    view = float8_view(run)
    if view is None:
        return ""
    head = "".join(f"<th>{escape(c)}</th>" for c in view["columns"])
    out = [
        '<section class="float8"><h3>Float8 readiness</h3>',
        f"<p>probe at step {view['step']}: {view['ready']} of {view['total']} Dense/EinsumDense "
        "layers keep their output and gradients within the readiness bounds in Keras' float8 "
        f"(errors against float32, beside {escape(view['mode'])})</p>",
        f'<table class="float8-layers"><thead><tr>{head}</tr></thead><tbody>',
    ]
    for row in view["rows"]:
        out.append("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>")
    out.append("</tbody></table></section>")
    return "\n".join(out)
