"""Assemble a :class:`~mpwatch.read.run.Run` from decoded events: scalars and records become
its tables.

The bytes (TFRecord framing, crcs, event decoding, the vectorized scalar path and what is skipped
with a warning) are :mod:`mpwatch.read.tfrecord`'s; here its columns become the Run's tables, the
same whether they come from event files (:mod:`mpwatch.read.logdir`) or from TensorBoard's data
provider (:func:`run_from_records`). Everything is read (no sampling, unlike TensorBoard's
reservoir).

- A step going backwards within a run for one tag (a restart or a resume from a checkpoint) means
  the later writes win: earlier values at that step or later are dropped, as TensorBoard's purge of
  orphaned data does (:func:`mpwatch.contract.later_writes_win`).
- Several records of one kind at one step are the parts of one split record (``part``/``parts``,
  see ``mpwatch/record/runtime/writer.py``): their tables are joined in order; a part missing (a
  writer killed mid-record) is a warning.
- The reader's warnings (skipped or cut records) are in :attr:`Run.warnings`.

Example:
    >>> run = run_from_records("r", scalars={"mpwatch/loss_scale": ([0, 1], [32768.0, 16384.0])},
    ...                        records={})
    >>> run.scalar("mpwatch/loss_scale").tolist()
    [32768.0, 16384.0]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from mpwatch import contract
from mpwatch.contract import later_writes_win
from mpwatch.read.problems import ReadProblem
from mpwatch.read.run import PROBE_TOP_KEYS, Run, empty_scalars, frame_of
from mpwatch.read.tfrecord import Events

__all__ = ["build_run", "run_from_records"]


def _scalars_frame(events: Events) -> pd.DataFrame:
    if not events.scalar_tags:
        return empty_scalars()
    tag = np.concatenate(events.scalar_tags)
    seq = np.concatenate(events.scalar_seqs)
    step = np.concatenate(events.scalar_steps)
    val = np.concatenate(events.scalar_values)
    if not len(tag):  # only empty series (run_from_records of a tag without points)
        return empty_scalars()
    order = np.lexsort((seq, tag))
    tag, seq, step, val = tag[order], seq[order], step[order], val[order]
    names = {i: t for t, i in events.tags.items()}
    bounds = np.nonzero(np.diff(tag))[0] + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [len(tag)]])
    series: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for a, b in zip(starts.tolist(), ends.tolist()):
        st, vv = step[a:b], val[a:b]
        keep = later_writes_win(seq[a:b], st)
        st, vv = st[keep], vv[keep]
        o = np.argsort(st, kind="stable")
        series[names[int(tag[a])]] = (st[o], vv[o])
    all_steps = np.sort(np.concatenate([s for s, _ in series.values()]), kind="stable")
    if len(all_steps) > 1:
        all_steps = all_steps[np.concatenate([[True], np.diff(all_steps) != 0])]
    cols: dict[str, np.ndarray] = {}
    for name in sorted(series):
        st, vv = series[name]
        col = np.full(len(all_steps), np.nan)
        col[np.searchsorted(all_steps, st)] = vv
        cols[name] = col
    return pd.DataFrame(cols, index=pd.Index(all_steps, dtype="int64", name="step"))


def _stack(parts: list[tuple[int, pd.DataFrame]]) -> pd.DataFrame:
    frames = []
    for step, df in parts:
        df = df.copy()
        df.insert(0, "step", step)
        frames.append(df)
    frames = [f for f in frames if len(f.columns)]
    if not frames:
        return pd.DataFrame({"step": pd.Series([], dtype="int64")})
    nonempty = [f for f in frames if len(f)]
    out = pd.concat(nonempty or frames[:1], ignore_index=True)
    out["step"] = out["step"].astype("int64")
    return out


def _stack_tables(items: list[tuple[int, Any]]) -> pd.DataFrame:
    """``step`` + the rows of each record's split table, built in one go when every table has the
    same columns (the usual case), else table by table."""
    cols: list[str] | None = None
    rows: list[list[Any]] = []
    steps: list[int] = []
    counts: list[int] = []
    for step, tbl in items:
        if not isinstance(tbl, dict) or "columns" not in tbl:
            continue
        c = list(tbl["columns"])
        if cols is None:
            cols = c
        elif c != cols:
            return _stack([(st, frame_of(t)) for st, t in items])
        data = tbl.get("data") or []
        if any(len(r) != len(c) for r in data):
            return _stack([(st, frame_of(t)) for st, t in items])
        rows += data
        steps.append(step)
        counts.append(len(data))
    if cols is None:
        return pd.DataFrame({"step": pd.Series([], dtype="int64")})
    out = pd.DataFrame(rows, columns=cols)
    out.insert(0, "step", np.repeat(np.asarray(steps, dtype=np.int64), counts))
    return out


def _merge_parts(payloads: list[dict[str, Any]]) -> tuple[dict[str, Any], str | None]:
    """Several records of one kind at one step, in write order -> (one payload, a problem or None).

    A record with ``"part" >= 1`` continues the one before it (a large table split into parts by
    the writer: its tables' rows are appended, in order); any other record (no ``part``, or part
    0: the head of a split record) replaces what came before (the later write wins). ``part`` and
    ``parts`` are removed from the result. The problem says so when the last write's parts are not
    all there (its ``parts`` says how many were written)."""
    out: dict[str, Any] = {}
    seen: list[int] = []
    for p in payloads:
        part = p.get("part")
        if not out or not isinstance(part, int) or part < 1:
            out = dict(p)
            seen = [part if isinstance(part, int) else 0]
            continue
        seen.append(part)
        for k, v in p.items():
            cur = out.get(k)
            if (
                isinstance(v, dict)
                and "columns" in v
                and isinstance(cur, dict)
                and list(cur.get("columns", [])) == list(v["columns"])
            ):
                out[k] = {"columns": v["columns"], "data": list(cur["data"]) + list(v["data"])}
            elif k not in out:
                out[k] = v
    parts = out.pop("parts", None)
    out.pop("part", None)
    problem = None
    if isinstance(parts, int) and seen != list(range(parts)):
        problem = f"has parts {seen} of {parts} (a split record cut short): tables incomplete"
    return out, problem


def _records(
    events: Events, warnings: list[str] | None = None
) -> dict[str, list[tuple[int, dict[str, Any]]]]:
    """Every record kind's (step, payload) list, parts merged, purges applied; a split record cut
    short is a warning in ``warnings`` (default: the events' own)."""
    warnings = events.warnings if warnings is None else warnings
    by_kind: dict[str, list[tuple[int, int, dict[str, Any]]]] = {}
    for seq, step, kind, payload in events.records:
        by_kind.setdefault(kind, []).append((seq, step, payload))
    out: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for kind, items in by_kind.items():
        items.sort(key=lambda t: t[0])
        steps = np.asarray([s for _, s, _ in items], dtype=np.int64)
        # records: a later record at a *smaller* step purges; several at one step are parts
        keep = later_writes_win(np.arange(len(items)), steps, strict=True)
        grouped: dict[int, list[dict[str, Any]]] = {}
        for i in keep.tolist():
            grouped.setdefault(int(steps[i]), []).append(items[i][2])
        if kind == contract.KIND_NOTICE:  # never split ("part" names the recording part)
            out[kind] = [(s, p) for s in sorted(grouped) for p in grouped[s]]
            continue
        merged = []
        for s in sorted(grouped):
            payload, problem = _merge_parts(grouped[s])
            if problem:
                warnings.append(f"{kind} record at step {s} {problem}")
            merged.append((s, payload))
        out[kind] = merged
    return out


def build_run(name: str, path: str, events: Events) -> Run:
    """The Run of decoded events (a run directory's, or :func:`run_from_records`'s): its scalar
    table, every record with its parts merged and purges applied, each kind's tables."""
    run = Run(name=name, path=path)
    run.scalars = _scalars_frame(events)
    recs = _records(events)
    run.warnings = events.warnings
    run.problems = events.problems
    run.records = recs
    if recs.get(contract.KIND_RUN_INFO):
        run.info = dict(recs[contract.KIND_RUN_INFO][-1][1])
    hist = [(s, frame_of(p.get("layers"))) for s, p in recs.get(contract.KIND_LAYERS, [])]
    run.layer_history = hist
    run.layers = hist[-1][1] if hist else pd.DataFrame()
    gv = recs.get(contract.KIND_GRAD_VARIABLES, [])
    run.grad_variables = _stack_tables([(s, p.get("variables")) for s, p in gv])
    if gv:
        run.grad_variables["loss_scale"] = run.grad_variables["step"].map(
            {s: p.get("loss_scale") for s, p in gv}
        )
    up = recs.get(contract.KIND_UPDATES, [])
    run.updates = _stack_tables([(s, p.get("variables")) for s, p in up])
    mem = recs.get(contract.KIND_MEMORY, [])
    run.memory = dict(mem[-1][1]) if mem else None
    probes = recs.get(contract.KIND_PROBE, [])
    run.probe_layers = _stack_tables([(s, p.get("layers")) for s, p in probes])
    run.probe_variables = _stack_tables([(s, p.get("variables")) for s, p in probes])
    run.probe_inputs = _stack_tables([(s, p.get("inputs")) for s, p in probes])
    run.probe_float8 = _stack_tables([(s, p.get("float8")) for s, p in probes])
    run.sweeps = _stack_tables([(s, p.get("sweep")) for s, p in probes])
    rows = []
    for s, p in probes:
        row: dict[str, Any] = {"step": s}
        model = p.get("model")
        if isinstance(model, dict):
            row.update(model)
        for k in PROBE_TOP_KEYS:
            row[k] = p.get(k)
        batch = p.get("batch") if isinstance(p.get("batch"), dict) else {}
        row["batch_size"] = batch.get("size")
        row["batch_source"] = batch.get("source")
        row["batch_sub_of"] = batch.get("sub_batch_of")
        memory = p.get("memory") if isinstance(p.get("memory"), dict) else {}
        row["memory_need_bytes"] = memory.get("need_bytes")
        row["memory_need_from"] = memory.get("need_from")
        rows.append(row)
        if isinstance(p.get("histogram"), dict):
            run.histograms[s] = p["histogram"]
    if rows:
        run.probe_model = pd.DataFrame(rows)
        run.probe_model["step"] = run.probe_model["step"].astype("int64")
    else:
        run.probe_model = pd.DataFrame(
            {
                "step": pd.Series([], dtype="int64"),
                "loss_scale": pd.Series([], dtype="float64"),
                "recommended_scale": pd.Series([], dtype="float64"),
                "mode": pd.Series([], dtype="object"),
                "reference": pd.Series([], dtype="object"),
            }
        )
    prof = recs.get(contract.KIND_PROFILE, [])
    run.profile = dict(prof[-1][1]) if prof else None
    run.notices = [{"step": s, **p} for s, p in recs.get(contract.KIND_NOTICE, [])]
    ts = recs.get(contract.KIND_TRAIN_STEP, [])
    run.train_step = dict(ts[-1][1]) if ts else {}
    run.budgets = [{"step": s, **p} for s, p in recs.get(contract.KIND_BUDGET, [])]
    return run


def run_from_records(
    name: str,
    *,
    scalars: Mapping[str, tuple[Sequence[int], Sequence[float]]],
    records: Mapping[str, Sequence[tuple[int, Mapping[str, Any]]]],
    path: str = "",
    warnings: Sequence[str] = (),
    problems: Sequence[ReadProblem] = (),
) -> Run:
    """A Run from already decoded data (the TensorBoard plugin reads through TensorBoard's data
    provider): ``scalars`` tag -> (steps, values); ``records`` kind -> [(step, payload)], each
    list in write order. The same tables, part merging and purges as :func:`load_run`.
    ``problems``: what could not be read of the run's files (their messages join ``warnings``)."""
    events = Events(warnings=list(warnings))
    for p in problems:
        events.problem(p)
    for tag, (steps, values) in sorted(scalars.items()):
        events.add_scalars(tag, steps, values)
    for kind, items in sorted(records.items()):
        for step, payload in items:
            events.add_record(step, kind, dict(payload))
    return build_run(name, path, events)
