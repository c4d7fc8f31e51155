"""Read a logdir's event files into pandas tables: :func:`load_run`, :func:`load_runs`, ``Run``.

No TensorFlow. The bytes (TFRecord framing, crcs, event decoding, the vectorized scalar path and
what is skipped with a warning) are :mod:`mpwatch.read.tfrecord`'s; here its columns become the
:class:`Run`'s tables. Everything is read (no sampling, unlike TensorBoard's reservoir).

- A step going backwards within a run for one tag (a restart or a resume from a checkpoint) means
  the later writes win: earlier values at that step or later are dropped, as TensorBoard's purge of
  orphaned data does (:func:`later_writes_win`).
- Several records of one kind at one step are the parts of one split record (``part``/``parts``,
  see ``mpwatch/record/writer.py``): their tables are joined in order; a part missing (a writer
  killed mid-record) is a warning.
- The reader's warnings (skipped or cut records) are in :attr:`Run.warnings`.

Example:
    >>> import mpwatch  # doctest: +SKIP
    >>> run = mpwatch.load_run("logs/run1")  # doctest: +SKIP
    >>> run.scalars["mpwatch/loss_scale"].tail()  # doctest: +SKIP
"""

from __future__ import annotations

import os
import warnings as _warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from mpwatch import contract
from mpwatch.contract import later_writes_win
from mpwatch.read.tfrecord import Events, read_events

__all__ = [
    "Run",
    "ProbeResult",
    "load_run",
    "load_runs",
    "find_runs",
    "run_from_records",
    "ReadError",
    "later_writes_win",
]

ProgressFn = Callable[[int, int], None]


class ReadError(OSError):
    """The logdir (or run) cannot be read at all: missing, not a directory, no permission."""


# --- the Run -------------------------------------------------------------------------------------
@dataclass
class Run:
    """Everything mpwatch recorded in one run directory, as pandas tables.

    Attributes:
        name: the run's path relative to the logdir (``"."`` for the logdir itself).
        path: the run directory.
        info: the latest ``run_info`` record (``{}`` when none).
        scalars: indexed by int ``step``; one column per full scalar tag (``"mpwatch/loss_scale"``,
            and any other scalar in the run, such as Keras' own); NaN where absent; sorted by step.
        layers: the latest ``layers`` record's table (empty when none).
        layer_history: every ``layers`` record as ``(step, table)``.
        grad_variables: ``step`` + the ``grad_variables`` table's columns, every record.
        probe_layers: one row per probe step and layer: ``step`` + the probe's layers-table
            columns (``probes`` is the old name of this table).
        probe_variables: the same for the probe's variables table.
        probe_inputs: the same for the probe's inputs table (float model inputs: integer ids a
            16-bit cast rounds).
        probe_model: one row per probe step: ``step``, the probe's ``model`` dict's keys,
            ``loss_scale``, ``recommended_scale``, ``mode``, ``reference``, ``reliable`` (False:
            the probe's loss disagreed with the train step's; :meth:`latest_probe` skips it),
            ``batch_size`` and ``batch_source``.
        histograms: probe step -> the probe's ``histogram`` dict.
        sweeps: ``step`` + the probe's ``sweep`` table columns.
        profile: the latest ``profile`` record, or None. Its tables as DataFrames:
            :attr:`profile_layers` (op time per layer), :attr:`profile_kernel_layers` and
            :attr:`profile_kernel_table` (a GPU trace's kernels); :attr:`profile_kernels` (the
            GPU kernel figures of the run), :attr:`profile_source` (where the figures come from).
        notices: every ``notice`` record, each with its ``step``.
        train_step: the latest ``train_step`` record (the train step's contract: who defines
            ``train_step``, every optimizer, whether it stepped and scales the loss), ``{}``
            when none.
        warnings: what the reader skipped, and why.
    """

    name: str
    path: str
    info: dict[str, Any] = field(default_factory=dict)
    scalars: pd.DataFrame = field(default_factory=lambda: _empty_scalars())
    layers: pd.DataFrame = field(default_factory=pd.DataFrame)
    layer_history: list[tuple[int, pd.DataFrame]] = field(default_factory=list)
    grad_variables: pd.DataFrame = field(default_factory=lambda: pd.DataFrame({"step": []}))
    probe_layers: pd.DataFrame = field(default_factory=lambda: pd.DataFrame({"step": []}))
    probe_variables: pd.DataFrame = field(default_factory=lambda: pd.DataFrame({"step": []}))
    probe_inputs: pd.DataFrame = field(default_factory=lambda: pd.DataFrame({"step": []}))
    probe_model: pd.DataFrame = field(default_factory=lambda: pd.DataFrame({"step": []}))
    histograms: dict[int, dict[str, Any]] = field(default_factory=dict)
    sweeps: pd.DataFrame = field(default_factory=lambda: pd.DataFrame({"step": []}))
    profile: dict[str, Any] | None = None
    notices: list[dict[str, Any]] = field(default_factory=list)
    train_step: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    #: every structured record read, by kind: list of (step, payload) in step order
    records: dict[str, list[tuple[int, dict[str, Any]]]] = field(default_factory=dict)

    @property
    def has_data(self) -> bool:
        """Whether the run holds any mpwatch data (an ``mpwatch/`` scalar or any record)."""
        if any(str(c).startswith(contract.PREFIX) for c in self.scalars.columns):
            return True
        return any(self.records.values())

    def scalar(self, tag: str) -> pd.Series:
        """One scalar series without its NaNs (empty float Series when the tag is absent)."""
        if tag not in self.scalars.columns:
            return pd.Series([], dtype="float64", index=pd.Index([], dtype="int64", name="step"))
        return self.scalars[tag].dropna()

    @property
    def probes(self) -> pd.DataFrame:
        """The old name of :attr:`probe_layers` (the probe's per-layer table)."""
        return self.probe_layers

    def latest_probe(
        self, modes: Iterable[str] | None = None, reliable_only: bool = True
    ) -> ProbeResult | None:
        """The latest probe (of these ``modes``: "float16", "bfloat16", "preflight"), or None.
        Probes marked unreliable (their loss disagreed with the train step's on the same batch
        and weights) are skipped unless ``reliable_only=False``: no finding rests on them.

        Example:
            >>> Run(name=".", path="").latest_probe() is None
            True
        """
        pm = self.probe_model
        if not len(pm):
            return None
        if modes is not None and "mode" in pm:
            pm = pm[pm["mode"].isin(list(modes))]
            if not len(pm):
                return None
        if reliable_only and "reliable" in pm:
            pm = pm[~pm["reliable"].map(_marked_unreliable)]
            if not len(pm):
                return None
        row = pm.sort_values("step", kind="stable").iloc[-1].to_dict()
        step = int(row["step"])

        def at(table: pd.DataFrame) -> pd.DataFrame:
            if not len(table) or "step" not in table:
                return pd.DataFrame()
            return table[table["step"] == step].reset_index(drop=True)

        return ProbeResult(
            step=step,
            model=row,
            layers=at(self.probe_layers),
            variables=at(self.probe_variables),
            sweep=at(self.sweeps),
            histogram=self.histograms.get(step),
            inputs=at(self.probe_inputs),
        )

    def unreliable_probe_steps(self) -> list[int]:
        """The steps of the probes marked unreliable (their loss disagreed with the train step's
        on the same batch and weights), sorted.

        Example:
            >>> Run(name=".", path="").unreliable_probe_steps()
            []
        """
        pm = self.probe_model
        if not len(pm) or "reliable" not in pm:
            return []
        hit = pm[pm["reliable"].map(_marked_unreliable)]
        return sorted({int(s) for s in hit["step"]})

    @property
    def batch_size(self) -> int | None:
        """The training batch size: ``run_info``'s where Keras gave it (Keras 2), else the size of
        the first training batch the probe captured (Keras 3 does not tell callbacks the batch
        size); None when neither was recorded (no probe, or a user-given probe batch).

        Example:
            >>> Run(name=".", path="").batch_size is None
            True
        """
        size = self.info.get("batch_size")
        if isinstance(size, (int, float)) and size > 0:
            return int(size)
        pm = self.probe_model
        if len(pm) and "batch_source" in pm and "batch_size" in pm:
            got = pm[(pm["batch_source"] == "training") & pm["batch_size"].notna()]
            if len(got):
                return int(got.sort_values("step", kind="stable")["batch_size"].iloc[0])
        return None

    def skipped_steps(self) -> pd.Series:
        """Updates the optimizer dropped, by step: ``step -> count`` (int64), skipped steps only.

        From the per-step flag ``mpwatch/step_skipped`` where it was recorded (each skipped step
        counts 1). Without it (a run recorded by a sampling reader, or an older run), from the rises
        of the cumulative ``mpwatch/skipped_steps_total``: a rise between two recorded points counts
        at the later one. ``skipped_steps().sum()`` is the run's total.

        Example:
            >>> len(Run(name=".", path="").skipped_steps())
            0
        """
        empty = pd.Series([], dtype="int64", index=pd.Index([], dtype="int64", name="step"))
        flags = self.scalar(contract.STEP_SKIPPED)
        if len(flags):
            hit = flags[flags > 0.5]
            return pd.Series(1, index=hit.index, dtype="int64") if len(hit) else empty
        total = self.scalar(contract.SKIPPED_STEPS_TOTAL)
        total = total[np.isfinite(total)]
        if not len(total):
            return empty
        rise = np.diff(total.to_numpy(), prepend=0.0)
        out = pd.Series(np.round(rise).astype("int64"), index=total.index)
        return out[out > 0]

    @property
    def profile_source(self) -> str | None:
        """Where the profile's per-layer precision and time come from (``contract.
        PROFILE_SOURCES``): ``"device_kernels"`` (a GPU trace: what each kernel ran in, from its
        name), ``"host_ops"`` (a CPU trace: ops counted in their layer's dtype), ``"device_ops"``
        (device ops without kernels: older GPU records); None without a profile.

        Example:
            >>> Run(name=".", path="").profile_source is None
            True
        """
        return contract.profile_source(self.profile)

    @property
    def profile_kernels(self) -> dict[str, Any] | None:
        """A GPU trace's run-level kernel figures (the record's ``kernel_summary``: device time by
        precision, ``tensor_core_share`` by mpwatch's reading of the kernel names beside xprof's
        ``xprof_tensor_core_share``, ``unknown_share``, eligible time not on Tensor Cores, ...);
        None on a CPU trace or without a profile.

        Example:
            >>> Run(name=".", path="").profile_kernels is None
            True
        """
        prof = self.profile or {}
        summary = prof.get("kernel_summary")
        return dict(summary) if isinstance(summary, dict) else None

    @property
    def profile_kernel_layers(self) -> pd.DataFrame:
        """A GPU trace's per-layer kernel figures (``contract.PROFILE_KERNEL_LAYER_COLUMNS``: time
        forward and backward, by precision, on Tensor Cores, eligible but not on Tensor Cores, the
        layer's Tensor Core dims), longest first; empty without one."""
        return _profile_table(self.profile, "kernel_layers", contract.PROFILE_KERNEL_LAYER_COLUMNS)

    @property
    def profile_kernel_table(self) -> pd.DataFrame:
        """A GPU trace's kernels, classified (``contract.PROFILE_KERNEL_COLUMNS``), longest first
        (the record may leave the shortest out: ``profile["kernels_dropped"]``); empty without."""
        return _profile_table(self.profile, "kernels", contract.PROFILE_KERNEL_COLUMNS)

    @property
    def profile_layers(self) -> pd.DataFrame:
        """The profile's op time per layer (``contract.PROFILE_LAYER_COLUMNS``: 16- and 32-bit op
        time, casts; on a CPU the host ops); empty without a profile."""
        return _profile_table(self.profile, "layers", contract.PROFILE_LAYER_COLUMNS)

    def __repr__(self) -> str:  # the default would print every table
        return (
            f"Run(name={self.name!r}, path={self.path!r}, steps={len(self.scalars)}, "
            f"scalar_tags={len(self.scalars.columns)}, layers={len(self.layers)}, "
            f"probes={len(self.probe_model)}, profile={self.profile is not None}, "
            f"warnings={len(self.warnings)})"
        )


@dataclass
class ProbeResult:
    """One probe, as :meth:`Run.latest_probe` gives it.

    Attributes:
        step: the probe's step.
        model: the model-wide row (``probe_model`` at that step: underflow_fraction, loss_scale,
            recommended_scale, mode, reference, ...).
        layers: the probe's per-layer table at that step.
        variables: the probe's per-variable table at that step.
        sweep: predicted underflow and overflow at each power-of-two scale.
        histogram: the log2 histogram of the reference gradients, or None.
        inputs: the probe's inputs table (float model inputs and what a 16-bit cast changes).
    """

    step: int
    model: dict[str, Any]
    layers: pd.DataFrame
    variables: pd.DataFrame
    sweep: pd.DataFrame
    histogram: dict[str, Any] | None = None
    inputs: pd.DataFrame = field(default_factory=pd.DataFrame)


#: the probe record's top-level keys that ``probe_model`` carries beside its ``model`` dict
PROBE_TOP_KEYS = (
    "loss_scale",
    "recommended_scale",
    "mode",
    "reference",
    "reference_note",
    "reliable",
    "unreliable_reason",
)


def _marked_unreliable(value: Any) -> bool:
    """Whether a probe's ``reliable`` flag is False (numpy's too); None or NaN (not checked, or an
    older record) is not."""
    return isinstance(value, (bool, np.bool_)) and not bool(value)


def _profile_table(profile: Mapping[str, Any] | None, key: str, columns: list[str]) -> pd.DataFrame:
    """One table of a profile record as a DataFrame (empty, with ``columns``, when absent)."""
    frame = _frame_of((profile or {}).get(key))
    return frame if len(frame.columns) else pd.DataFrame(columns=list(columns))


def _empty_scalars() -> pd.DataFrame:
    return pd.DataFrame(index=pd.Index([], dtype="int64", name="step"))


# --- finding runs --------------------------------------------------------------------------------
def find_runs(logdir: str | os.PathLike[str]) -> dict[str, str]:
    """Run name (relative path, ``"."`` for the root) -> directory, for every directory under
    ``logdir`` that holds event files. Raises :class:`ReadError` when logdir cannot be read."""
    root = os.fspath(logdir)
    if not os.path.exists(root):
        raise ReadError(f"logdir {root!r} does not exist")
    if not os.path.isdir(root):
        raise ReadError(f"logdir {root!r} is not a directory")
    if not os.access(root, os.R_OK | os.X_OK):
        raise ReadError(f"logdir {root!r} cannot be read (permission denied)")
    runs: dict[str, str] = {}
    errors: list[OSError] = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=errors.append):
        dirnames.sort()
        if any(contract.is_event_file(f) for f in filenames):
            rel = os.path.relpath(dirpath, root)
            runs[rel.replace(os.sep, "/")] = dirpath
    if errors and not runs and errors[0].filename == root:
        raise ReadError(f"logdir {root!r} cannot be read: {errors[0]}")
    return dict(sorted(runs.items()))


# --- tables --------------------------------------------------------------------------------------
def _scalars_frame(events: Events) -> pd.DataFrame:
    if not events.scalar_tags:
        return _empty_scalars()
    tag = np.concatenate(events.scalar_tags)
    seq = np.concatenate(events.scalar_seqs)
    step = np.concatenate(events.scalar_steps)
    val = np.concatenate(events.scalar_values)
    if not len(tag):  # only empty series (run_from_records of a tag without points)
        return _empty_scalars()
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


def _frame_of(tbl: Any) -> pd.DataFrame:
    """A record's split table as a DataFrame (empty when missing or malformed)."""
    if not isinstance(tbl, dict) or "columns" not in tbl:
        return pd.DataFrame()
    try:
        return pd.DataFrame(tbl.get("data") or [], columns=list(tbl["columns"]))
    except (ValueError, TypeError):
        return pd.DataFrame(columns=list(tbl["columns"]))


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
            return _stack([(st, _frame_of(t)) for st, t in items])
        data = tbl.get("data") or []
        if any(len(r) != len(c) for r in data):
            return _stack([(st, _frame_of(t)) for st, t in items])
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


def _records(events: Events) -> dict[str, list[tuple[int, dict[str, Any]]]]:
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
                events.warnings.append(f"{kind} record at step {s} {problem}")
            merged.append((s, payload))
        out[kind] = merged
    return out


def _build_run(name: str, path: str, events: Events) -> Run:
    run = Run(name=name, path=path)
    run.scalars = _scalars_frame(events)
    recs = _records(events)
    run.warnings = events.warnings
    run.records = recs
    if recs.get(contract.KIND_RUN_INFO):
        run.info = dict(recs[contract.KIND_RUN_INFO][-1][1])
    hist = [(s, _frame_of(p.get("layers"))) for s, p in recs.get(contract.KIND_LAYERS, [])]
    run.layer_history = hist
    run.layers = hist[-1][1] if hist else pd.DataFrame()
    gv = recs.get(contract.KIND_GRAD_VARIABLES, [])
    run.grad_variables = _stack_tables([(s, p.get("variables")) for s, p in gv])
    if gv:
        run.grad_variables["loss_scale"] = run.grad_variables["step"].map(
            {s: p.get("loss_scale") for s, p in gv}
        )
    probes = recs.get(contract.KIND_PROBE, [])
    run.probe_layers = _stack_tables([(s, p.get("layers")) for s, p in probes])
    run.probe_variables = _stack_tables([(s, p.get("variables")) for s, p in probes])
    run.probe_inputs = _stack_tables([(s, p.get("inputs")) for s, p in probes])
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
    return run


def run_from_records(
    name: str,
    *,
    scalars: Mapping[str, tuple[Sequence[int], Sequence[float]]],
    records: Mapping[str, Sequence[tuple[int, Mapping[str, Any]]]],
    path: str = "",
    warnings: Sequence[str] = (),
) -> Run:
    """A Run from already decoded data (the TensorBoard plugin reads through TensorBoard's data
    provider): ``scalars`` tag -> (steps, values); ``records`` kind -> [(step, payload)], each
    list in write order. The same tables, part merging and purges as :func:`load_run`."""
    events = Events(warnings=list(warnings))
    for tag, (steps, values) in sorted(scalars.items()):
        events.add_scalars(tag, steps, values)
    for kind, items in sorted(records.items()):
        for step, payload in items:
            events.add_record(step, kind, dict(payload))
    return _build_run(name, path, events)


def _read_run(
    name: str,
    path: str,
    verify: str,
    progress: ProgressFn | None,
    done_total: list[int],
) -> Run:
    events = Events()
    try:
        files = contract.event_files(path)
    except OSError as e:
        raise ReadError(f"run directory {path!r} cannot be read: {e}") from e
    for fname in files:
        nbytes = read_events(fname, events, verify=verify)
        if progress is not None:
            done_total[0] += nbytes
            progress(done_total[0], done_total[1])
    return _build_run(name, path, events)


def _sizes(paths: Iterable[str]) -> int:
    total = 0
    for p in paths:
        try:
            for f in contract.event_files(p):
                total += os.path.getsize(f)
        except OSError:
            pass
    return total


def load_runs(
    logdir: str | os.PathLike[str],
    *,
    verify: str = "all",
    progress: ProgressFn | None = None,
    warn: bool = False,
) -> dict[str, Run]:
    """Every run under ``logdir`` (a run = a directory holding event files), by name (its path
    relative to logdir, ``"."`` for logdir itself), in name order.

    Args:
        logdir: the directory given to the callbacks (or to ``tensorboard --logdir``).
        verify: ``"all"`` (default) checks every record's length and data crc; ``"lengths"``
            checks the data crc of structured records only (faster, but a flipped bit in a
            scalar event can come back as a wrong value).
        progress: called as ``progress(bytes_read, bytes_total)`` after each event file.
        warn: also emit each reader warning as a Python ``UserWarning``.

    Raises:
        ReadError: logdir is missing, not a directory, or cannot be read.
    """
    if verify not in ("lengths", "all"):
        raise ValueError(f"verify must be 'lengths' or 'all', not {verify!r}")
    runs = find_runs(logdir)
    totals = [0, _sizes(runs.values()) if progress is not None else 0]
    out = {name: _read_run(name, path, verify, progress, totals) for name, path in runs.items()}
    if warn:
        for run in out.values():
            for w in run.warnings:
                _warnings.warn(f"mpwatch reader: run {run.name!r}: {w}", stacklevel=2)
    return out


def load_run(
    logdir: str | os.PathLike[str],
    run: str | None = None,
    *,
    verify: str = "all",
    progress: ProgressFn | None = None,
    warn: bool = True,
) -> Run:
    """One run of a logdir as a :class:`Run`.

    ``run`` names the run (its path relative to ``logdir``, as :func:`load_runs` names them).
    Without it: ``logdir`` itself when it holds event files, else its only run, else the only run
    with mpwatch data; several candidates raise ``ValueError`` listing them. A logdir without event
    files gives an empty Run (``has_data`` False) rather than an error. Warnings about skipped
    records are in ``Run.warnings`` and, with ``warn=True``, emitted as ``UserWarning``.

    Example:
        >>> run = load_run("logs/run1")  # doctest: +SKIP
        >>> run.has_data, run.info.get("policy")  # doctest: +SKIP
        (True, 'mixed_float16')
    """
    if verify not in ("lengths", "all"):
        raise ValueError(f"verify must be 'lengths' or 'all', not {verify!r}")
    runs = find_runs(logdir)
    root = os.fspath(logdir)
    if run is None:
        if not runs:
            return Run(name=".", path=root)
        if "." in runs:
            run = "."
        elif len(runs) == 1:
            run = next(iter(runs))
        else:
            totals = [0, _sizes(runs.values()) if progress is not None else 0]
            loaded = {n: _read_run(n, p, verify, progress, totals) for n, p in runs.items()}
            with_data = [r for r in loaded.values() if r.has_data]
            if len(with_data) == 1:
                chosen = with_data[0]
            else:
                raise ValueError(
                    f"logdir {root!r} holds {len(runs)} runs ({', '.join(runs)}): name one with "
                    "run=..., or use load_runs"
                )
            _emit(chosen, warn)
            return chosen
    name = run.strip("/") or "."
    if name not in runs:
        path = os.path.join(root, name)
        if not os.path.isdir(path):
            raise ReadError(
                f"no run {name!r} in {root!r}; runs: {', '.join(runs) if runs else '(none)'}"
            )
        runs = {name: path}
    totals = [0, _sizes([runs[name]]) if progress is not None else 0]
    result = _read_run(name, runs[name], verify, progress, totals)
    _emit(result, warn)
    return result


def _emit(run: Run, warn: bool) -> None:
    if warn:
        for w in run.warnings:
            _warnings.warn(f"mpwatch reader: run {run.name!r}: {w}", stacklevel=3)
