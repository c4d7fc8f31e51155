"""The memory table of a run, in words and rows: the ``memory`` record
(:mod:`mpwatch.record.model.memory`) beside the peak the run measured and what mpwatch itself adds
to it (its probe's need, :func:`own_memory`), for the text and Markdown reports, the HTML report,
the JSON report and the TensorBoard tab.

Example:
    >>> from mpwatch.read.run import Run
    >>> memory_view(Run(name=".", path="")) is None
    True
"""

from __future__ import annotations

from html import escape
from typing import Any

import pandas as pd

from mpwatch import contract
from mpwatch.read.run import Run
from mpwatch.show.views.series import last_value
from mpwatch.words import percent

KIND_WORDS = {
    "weights": "weights",
    "gradients": "gradients",
    "optimizer_state": "optimizer state",
    "activations": "activations",
}


def mib(n: float) -> str:
    """Bytes in MiB (KiB below one MiB, bytes below one KiB), for a person."""
    if n < 2**10:
        return f"{int(n)} B"
    if n < 2**20:
        return f"{n / 2**10:.1f} KiB"
    return f"{n / 2**20:,.1f} MiB"


def _peak(run: Run) -> tuple[float | None, str]:
    peak = last_value(run, contract.PEAK_MEMORY_MB)
    device = (run.info.get("device") or {}).get("type") or ""
    if str(device).upper() == "GPU":
        return peak, "the device's measured peak"
    return peak, "the process' peak resident memory (on a CPU: the framework and the data too)"


def own_memory(run: Run) -> dict[str, Any] | None:
    """What mpwatch itself added to the run's memory: the largest need its probes recorded
    (bytes beyond the training's state, and how it was found), or None (no probe recorded one)."""
    pm = run.probe_model
    if "memory_need_bytes" not in pm or not len(pm):
        return None
    need = pd.to_numeric(pm["memory_need_bytes"], errors="coerce")
    if not need.notna().any():
        return None
    i = need.idxmax()
    out = {
        "probe_need_bytes": int(need[i]),
        "probe_need_from": str(pm.loc[i, "memory_need_from"] or ""),
        "probes": int(need.notna().sum()),
        "sub_batch": None,
    }
    if "batch_sub_of" in pm:
        subs = pm[pd.to_numeric(pm["batch_sub_of"], errors="coerce").notna()]
        if len(subs):
            last = subs.iloc[-1]
            out["sub_batch"] = {"size": int(last["batch_size"]), "of": int(last["batch_sub_of"])}
    return out


def own_memory_line(own: dict[str, Any] | None, peak: float | None) -> str | None:
    """The words of :func:`own_memory`, beside the measured peak."""
    if own is None:
        return None
    n = own["probe_need_bytes"]
    share = f", {percent(n / (peak * 2**20))} of the measured peak" if peak else ""
    line = (
        f"mpwatch's own: its probe needs up to {mib(n)} beyond the training's memory{share} "
        f"({own['probe_need_from']}; {own['probes']} probe(s)); the measured peak includes it"
    )
    sub = own.get("sub_batch")
    if sub:
        line += (
            f"; it ran on the first {sub['size']} of the batch's {sub['of']} examples (the whole "
            "batch would not fit the device's free memory): each example's gradients are the "
            "train step's, the weight gradients those examples' part of the batch's, so their "
            "underflow reads higher"
        )
    return line


def memory_view(run: Run) -> dict[str, Any] | None:
    """The memory table as plain data: ``policy``, ``batch_size``, ``by_dtype`` and ``by_policy``
    (lists of row dicts), ``peak_mb`` and what it measures, and ``lines`` (the same in words);
    None without a record."""
    if not run.memory:
        return None
    by_dtype = run.memory_by_dtype.to_dict("records")
    by_policy = run.memory_by_policy.to_dict("records")
    peak, peak_is = _peak(run)
    own = own_memory(run)
    lines = _lines(run.memory, by_dtype, by_policy, peak, peak_is)
    own_line = own_memory_line(own, peak)
    if own_line:
        lines.append(own_line)
    return {
        "policy": run.memory.get("policy"),
        "batch_size": run.memory.get("batch_size"),
        "by_dtype": by_dtype,
        "by_policy": by_policy,
        "peak_mb": peak,
        "peak_is": peak_is,
        "mpwatch_own": own,
        "lines": lines,
        # the same as a person reads them: column names and rows of text (the tab shows these)
        "dtype_table": {
            "columns": ["kind", "dtype", "elements", "size"],
            "rows": [
                [
                    KIND_WORDS.get(r["kind"], r["kind"]),
                    str(r["dtype"]),
                    f"{int(r['elements']):,}",
                    mib(r["bytes"]),
                ]
                for r in by_dtype
            ],
        },
        "policy_table": {
            "columns": ["policy", *(KIND_WORDS[k] for k in contract.MEMORY_KINDS), "total"],
            "rows": [
                [str(r["policy"]), *(mib(r[k]) for k in contract.MEMORY_KINDS), mib(r["total"])]
                for r in by_policy
            ],
        },
    }


def _lines(
    memory: dict[str, Any],
    by_dtype: list[dict[str, Any]],
    by_policy: list[dict[str, Any]],
    peak: float | None,
    peak_is: str,
) -> list[str]:
    if not by_policy:
        return []
    own = by_policy[0]
    batch = memory.get("batch_size")
    per = f"batch {batch}" if batch else "per example: the batch size was not known"
    parts = []
    for kind in contract.MEMORY_KINDS:
        dtypes = [r for r in by_dtype if r["kind"] == kind and r["bytes"]]
        inner = ", ".join(f"{r['dtype']} {mib(r['bytes'])}" for r in dtypes)
        parts.append(f"{KIND_WORDS[kind]} {mib(own[kind])}" + (f" ({inner})" if inner else ""))
    lines = [f"{mib(own['total'])} under {own['policy']} ({per}): " + "; ".join(parts)]
    others = []
    for r in by_policy[1:]:
        ratio = r["total"] / own["total"] if own["total"] else float("nan")
        others.append(f"{r['policy']} {mib(r['total'])} ({percent(ratio)} of it)")
    if others:
        lines.append("would need: " + ", ".join(others))
    if peak is not None:
        lines.append(f"measured peak {mib(peak * 2**20)}: {peak_is}")
    return lines


def memory_html(run: Run) -> str:
    """The HTML report's memory section (empty without a record): bytes by kind and dtype, and
    under each policy, with the measured peak."""
    mv = memory_view(run)
    if mv is None:
        return ""
    out = ['<section class="memory"><h3>Memory</h3>']
    out += [f"<p>{escape(x)}</p>" for x in mv["lines"]]
    for cls, table in (("memory-by-dtype", mv["dtype_table"]),
                       ("memory-by-policy", mv["policy_table"])):  # fmt: skip
        head = "".join(f"<th>{escape(c)}</th>" for c in table["columns"])
        out.append(f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>')
        for row in table["rows"]:
            out.append("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>")
        out.append("</tbody></table>")
    out.append("</section>")
    return "\n".join(out)
