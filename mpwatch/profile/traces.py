"""Profiler trace → tables: a run's ``*.xplane.pb`` files, xprof's converter, op and kernel tables.

A trace captured by ``tf.profiler`` (``record/callbacks/profile_capture.py``, or Keras' own
TensorBoard callback) or ``jax.profiler`` lies at
``<logdir>/plugins/profile/<run>/<host>.xplane.pb`` (:func:`find_traces`). :func:`op_table` converts
a *copy* of it with xprof's own converter (tool ``framework_op_stats``, the table of TensorBoard's
Profile tab; the converter writes cache files beside its input, so the original run directory is
left alone) into a pandas table, one row per TensorFlow op. With a GPU the table holds the device
rows (GPU kernels grouped by TensorFlow op); on a CPU the host rows. :func:`kernel_table` does the
same with xprof's ``kernel_stats`` tool: one row per GPU kernel (name, op name, duration, launch
shape, xprof's Tensor Core flags).

Where xprof has no rows the trace itself has them, read with :mod:`mpwatch.profile.xplane` (no
TensorFlow): XLA's CPU ops (``jax.profiler`` on a CPU, :func:`xla_op_table`), and the op names of
GPU kernels XLA launched from a CUDA graph (xprof's ``XlaModule``), both from the trace's HLO
metadata (:class:`HloIndex`). :func:`trace_ops` picks the op table of a trace.

Example (needs xprof):
    >>> from mpwatch.profile import traces  # doctest: +SKIP
    >>> ops = traces.op_table("logs/run1")  # doctest: +SKIP
    >>> gpu = traces.kernel_table("logs/run1")  # doctest: +SKIP
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from mpwatch.profile import xplane
from mpwatch.profile.attribution import split_op_name
from mpwatch.profile.hlo_cpu import cpu_readings
from mpwatch.profile.hlo_kernels import hlo_columns
from mpwatch.profile.step_parts import INPUT

TOOL = "framework_op_stats"

# Rows the converter adds that are no ops.
NON_OP_TYPES = frozenset({"IDLE"})

OP_COLUMNS = [
    "host_or_device",
    "op_type",
    "op_name",
    "occurrences",
    "total_time_us",
    "self_time_us",
    "execution_mode",
]


class ProfileError(RuntimeError):
    """A trace could not be found, converted or read; the message says which and why."""


# --- finding and converting traces ---------------------------------------------------------------
def find_traces(path: str | os.PathLike) -> list[str]:
    """The ``*.xplane.pb`` files of one profile run.

    ``path`` is a ``.xplane.pb`` file, a run directory holding them, or a logdir whose
    ``plugins/profile/<run>/`` directories hold them (then the newest run is taken).
    """
    path = os.fspath(path)
    if os.path.isfile(path):
        if not path.endswith(".xplane.pb"):
            raise ProfileError(f"{path} is no profiler trace (expected a *.xplane.pb file)")
        return [path]
    if not os.path.isdir(path):
        raise ProfileError(f"no profiler trace at {path}: no such file or directory")
    here = sorted(glob.glob(os.path.join(glob.escape(path), "*.xplane.pb")))
    if here:
        return here
    runs = sorted(
        d
        for d in glob.glob(os.path.join(glob.escape(path), "plugins", "profile", "*"))
        if glob.glob(os.path.join(glob.escape(d), "*.xplane.pb"))
    )
    if not runs:
        raise ProfileError(
            f"no profiler trace under {path}: expected "
            "<logdir>/plugins/profile/<run>/<host>.xplane.pb"
        )
    return sorted(glob.glob(os.path.join(glob.escape(runs[-1]), "*.xplane.pb")))


def convert(traces: Sequence[str], tool: str = TOOL) -> Any:
    """Run xprof's converter for ``tool`` on copies of ``traces``; returns the parsed JSON.

    The copies live in a temporary directory that is removed afterwards, together with the cache
    files the converter writes beside them.
    """
    try:
        from xprof.convert import raw_to_tool_data
    except ImportError as e:  # pragma: no cover - xprof is a dependency
        raise ProfileError(
            f"xprof's converter is not importable ({e}): pip install tensorboard-plugin-profile"
        ) from e
    with tempfile.TemporaryDirectory(prefix="mpwatch-profile-") as tmp:
        copies = []
        for i, src in enumerate(traces):
            if not os.path.isfile(src) or os.path.getsize(src) == 0:
                raise ProfileError(f"profiler trace {src} is missing or empty")
            dst = os.path.join(tmp, f"{i}_{os.path.basename(src)}")
            shutil.copyfile(src, dst)
            copies.append(dst)
        try:
            data, _ = raw_to_tool_data.xspace_to_tool_data(copies, tool, {})
        except Exception as e:  # noqa: BLE001 - the converter raises whatever its C++ layer gives
            why = _unreadable(traces)
            raise ProfileError(why or f"xprof could not convert {traces[0]} ({tool}): {e}") from e
    if not data:
        why = _unreadable(traces)
        if why:
            raise ProfileError(why)
        raise ProfileError(
            f"xprof returned no {tool} data for {traces[0]}: the trace is empty or unreadable"
        )
    if isinstance(data, bytes):
        data = data.decode("utf-8", errors="replace")
    try:
        return json.loads(data)
    except json.JSONDecodeError as e:
        raise ProfileError(f"xprof's {tool} output is not JSON: {e}") from e


def _unreadable(traces: Sequence[str]) -> str | None:
    """Why a trace is no XSpace at all (None when it parses). Read with
    :mod:`mpwatch.profile.xplane`, so no TensorFlow is imported."""
    for path in traces:
        try:
            space = xplane.read_xspace(path, planes=lambda name: False)
        except (xplane.XSpaceError, OSError) as e:
            return f"{path} is not a readable profiler trace (XSpace): {e}"
        if not space.planes:
            return f"{path} is not a profiler trace: it holds no planes"
    return None


def has_gpu_planes(traces: Sequence[str]) -> bool:
    """Whether any trace holds a ``/device:GPU:*`` plane (GPU kernels). A trace that cannot be
    read counts as having one, so the converter says what is wrong with it."""
    for path in traces:
        try:
            space = xplane.read_xspace(path, planes=lambda name: False)
        except (xplane.XSpaceError, OSError):
            return True
        if any(p.name.startswith("/device:GPU") for p in space.planes):
            return True
    return False


def _datatable_frame(table: Mapping[str, Any]) -> pd.DataFrame:
    cols = [c["id"] for c in table.get("cols", [])]
    rows = [[cell.get("v") if cell else None for cell in r.get("c", [])] for r in table["rows"]]
    return pd.DataFrame(rows, columns=cols)


def op_table(path: str | os.PathLike | Sequence[str], side: str = "auto") -> pd.DataFrame:
    """The framework op table of a trace: one row per TensorFlow op (the Profile tab's table).

    Columns: ``host_or_device, op_type, op_name, occurrences, total_time_us, self_time_us,
    execution_mode``. IDLE rows are dropped. ``side``: ``"device"`` (GPU rows), ``"host"`` (CPU
    rows) or ``"auto"`` (device rows when the trace has device time, else host rows); ``"all"``
    keeps both. ``df.attrs["side"]`` says which. Raises :class:`ProfileError` when the trace has no
    ops.
    """
    traces = list(path) if isinstance(path, (list, tuple)) else find_traces(path)
    data = convert(traces)
    tables = data if isinstance(data, list) else [data]
    tables = [t for t in tables if isinstance(t, Mapping) and "rows" in t]
    if not tables:
        raise ProfileError(f"xprof's {TOOL} output for {traces[0]} has no table")
    # The converter returns the table with IDLE rows and the one without; take the one without.
    frames = [_datatable_frame(t) for t in tables]
    frame = frames[-1]
    for f in frames:
        if "type" in f and not f["type"].isin(NON_OP_TYPES).any():
            frame = f
            break
    needed = {"host_or_device", "type", "operation", "occurrences", "total_time", "total_self_time"}
    missing = needed - set(frame.columns)
    if missing:
        raise ProfileError(f"xprof's {TOOL} table lacks columns {sorted(missing)}")
    df = pd.DataFrame(
        {
            "host_or_device": frame["host_or_device"].astype(str),
            "op_type": frame["type"].astype(str),
            "op_name": frame["operation"].astype(str),
            "occurrences": pd.to_numeric(frame["occurrences"]).fillna(0).astype("int64"),
            "total_time_us": pd.to_numeric(frame["total_time"]).astype(float),
            "self_time_us": pd.to_numeric(frame["total_self_time"]).astype(float),
            "execution_mode": frame["eager"].astype(str) if "eager" in frame else "",
        }
    )
    df = df[~df["op_type"].isin(NON_OP_TYPES)]
    is_device = df["host_or_device"].str.lower().eq("device")
    if side == "auto":
        side = "device" if (df.loc[is_device, "self_time_us"] > 0).any() else "host"
    if side == "device":
        df = df[is_device]
    elif side == "host":
        df = df[~is_device]
    elif side != "all":
        raise ValueError(f"side must be 'auto', 'device', 'host' or 'all', not {side!r}")
    df = df.reset_index(drop=True)
    if df.empty or df["self_time_us"].sum() <= 0:
        unreadable = _unreadable(traces)
        if unreadable:
            raise ProfileError(unreadable)
        raise ProfileError(
            f"the trace {traces[0]} holds no TensorFlow ops ({side} side): was the profiler "
            "started and stopped around training steps?"
        )
    df.attrs["side"] = side
    df.attrs["traces"] = traces
    return df


# --- GPU kernels: xprof's kernel_stats table ----------------------------------------------------
KERNEL_TOOL = "kernel_stats"

KERNEL_COLUMNS = [
    "kernel_name",
    "op_name",
    "op_name_from",
    "total_duration_us",
    "occurrences",
    "avg_duration_us",
    "min_duration_us",
    "max_duration_us",
    "xprof_tensor_core_eligible",
    "xprof_tensor_core",
    "grid_dim",
    "block_dim",
    "registers_per_thread",
    "shmem_bytes",
    "occupancy_pct",
]
# xprof's column id -> ours
_KERNEL_SOURCE_COLUMNS = {
    "kernel_name": "kernel_name",
    "op_name": "op_name",
    "total_duration_us": "total_duration_us",
    "occurrences": "occurrences",
    "avg_duration_us": "avg_duration_us",
    "min_duration_us": "min_duration_us",
    "max_duration_us": "max_duration_us",
    "is_op_tensor_core_eligible": "xprof_tensor_core_eligible",
    "is_kernel_using_tensor_core": "xprof_tensor_core",
    "grid_dim": "grid_dim",
    "block_dim": "block_dim",
    "registers_per_thread": "registers_per_thread",
    "shmem_bytes": "shmem_bytes",
    "occupancy_pct": "occupancy_pct",
}
_KERNEL_NUMERIC = (
    "total_duration_us",
    "avg_duration_us",
    "min_duration_us",
    "max_duration_us",
    "registers_per_thread",
    "shmem_bytes",
    "occupancy_pct",
)


def kernel_table(path: str | os.PathLike | Sequence[str]) -> pd.DataFrame:
    """The GPU kernel table of a trace (xprof's ``kernel_stats`` tool): one row per kernel and op.

    Columns (:data:`KERNEL_COLUMNS`): ``kernel_name, op_name, op_name_from, total_duration_us,
    occurrences, avg_duration_us, min_duration_us, max_duration_us, xprof_tensor_core_eligible``
    (xprof's "Op is TensorCore eligible"), ``xprof_tensor_core`` (xprof's "Kernel uses
    TensorCore"), ``grid_dim, block_dim, registers_per_thread, shmem_bytes, occupancy_pct``.
    Columns xprof does not give are empty. ``op_name_from``: ``"xprof"``; ``"hlo"`` for kernels
    xprof gave no op (``XlaModule``: XLA launched them from a CUDA graph) whose HLO instruction in
    the trace's metadata names one (:class:`HloIndex`); ``""`` where neither does. A trace without
    GPU kernels gives an empty table. The HLO instruction each kernel runs, and what it says of
    its precision, Tensor Core use and owner, are added by
    :func:`mpwatch.profile.hlo_kernels.hlo_columns` (``hlo_*`` columns). Like :func:`op_table`
    the converter runs on a copy of the trace (it writes cache files beside its input).
    """
    traces = list(path) if isinstance(path, (list, tuple)) else find_traces(path)
    data = convert(traces, KERNEL_TOOL)
    tables = data if isinstance(data, list) else [data]
    tables = [t for t in tables if isinstance(t, Mapping) and "rows" in t]
    if not tables:
        raise ProfileError(f"xprof's {KERNEL_TOOL} output for {traces[0]} has no table")
    frames = [_datatable_frame(t) for t in tables]
    frame = next((f for f in frames if "kernel_name" in f.columns), frames[0])
    if len(frame) and not {"kernel_name", "total_duration_us"} <= set(frame.columns):
        raise ProfileError(
            f"xprof's {KERNEL_TOOL} table lacks columns "
            f"{sorted({'kernel_name', 'total_duration_us'} - set(frame.columns))}"
        )
    out = pd.DataFrame(index=range(len(frame)))
    for src, dst in _KERNEL_SOURCE_COLUMNS.items():
        out[dst] = frame[src].values if src in frame.columns else None
    for col in _KERNEL_NUMERIC:
        out[col] = pd.to_numeric(out[col], errors="coerce").astype(float)
    out["occurrences"] = pd.to_numeric(out["occurrences"], errors="coerce").fillna(0)
    out["occurrences"] = out["occurrences"].astype("int64")
    for col in ("kernel_name", "op_name", "grid_dim", "block_dim"):
        out[col] = out[col].fillna("").astype(str)
    for col in ("xprof_tensor_core_eligible", "xprof_tensor_core"):
        out[col] = out[col].map(xprof_flag)
    out["op_name_from"] = ["" if n in _NO_OP_NAMES else "xprof" for n in out["op_name"]]
    if len(out) and out["op_name_from"].eq("").any():
        _op_names_from_hlo(out, traces)
    out = out[KERNEL_COLUMNS]
    if len(out):
        out = hlo_columns(out, traces)
    out.attrs["tool"] = KERNEL_TOOL
    out.attrs["trace"] = traces[0]
    return out


def _op_names_from_hlo(table: pd.DataFrame, traces: Sequence[str]) -> None:
    """Give kernels without an op name (xprof's ``XlaModule``: XLA launched them from a CUDA graph)
    the op name of the HLO instruction they are named after (:class:`HloIndex`); ``op_name_from``
    says ``"hlo"`` for those. A trace that cannot be decoded leaves the names as they are."""
    try:
        index, spaces = HloIndex.of_traces(traces, xplane.metadata_and_devices)
    except (xplane.XSpaceError, OSError):
        return
    if not index:
        return
    modules: dict[str, dict[str, int]] = {}
    for space in spaces:
        for kernel, per in xplane.kernel_modules(space).items():
            modules.setdefault(kernel, {}).update(per)
    for i in table.index[table["op_name_from"].eq("")]:
        kernel = str(table.at[i, "kernel_name"])
        name = index.kernel_op_name(kernel, modules.get(kernel, {}))
        if name:
            table.at[i, "op_name"] = name
            table.at[i, "op_name_from"] = "hlo"


def xprof_flag(value: Any) -> bool | None:
    """A boolean cell of xprof's tables (``True``, ``"true"``, ``1``...) as a bool (None: empty)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value)


# --- XLA: op names from the trace's HLO metadata -------------------------------------------------
#: op names xprof gives kernels it could not map to a framework op (XLA launched them from a CUDA
#: graph, or outside any op)
_NO_OP_NAMES = frozenset({"", "XlaModule", "XlaModule:"})
_NON_WORD = re.compile(r"[^A-Za-z0-9_]")


class HloIndex:
    """HLO instructions of the traces' compiled programs, by name: the framework op each came from.

    Built from the metadata plane of each trace (:func:`mpwatch.profile.xplane.hlo_ops`). An
    instruction's op name is its own metadata's; a fusion without one takes its fused instructions'
    op name when they all have the same. Where several programs (or instructions whose names differ
    only in punctuation) give different op names, the name is left empty: never guessed.
    """

    def __init__(self, programs: Mapping[str, Mapping[str, xplane.HloOp]]) -> None:
        self.programs = {str(k): dict(v) for k, v in programs.items()}
        self._by_base: dict[str, list[str]] = {}
        for key in self.programs:
            self._by_base.setdefault(xplane.module_base(key), []).append(key)
        self._kernel_names: dict[str, dict[str, list[xplane.HloOp]]] = {}

    @classmethod
    def of_traces(cls, traces: Sequence[str], planes: Any = None) -> tuple[HloIndex, list[Any]]:
        """``(index, spaces)`` of traces (spaces: the decoded
        :class:`mpwatch.profile.xplane.XSpace` s)."""
        spaces = [xplane.read_xspace(t, planes) for t in traces]
        return cls.of_spaces(spaces), spaces

    @classmethod
    def of_spaces(cls, spaces: Sequence[Any], programs: Any = None) -> HloIndex:
        """The index of decoded traces' programs (those ``programs(name)`` accepts, where
        given: :func:`mpwatch.profile.xplane.ran_programs`)."""
        found: dict[str, dict[str, xplane.HloOp]] = {}
        for space in spaces:
            found.update(xplane.hlo_ops(space, programs))
        return cls(found)

    def __bool__(self) -> bool:
        return bool(self.programs)

    @staticmethod
    def own_op_name(op: xplane.HloOp) -> str:
        """The op name an instruction stands for (its own, else its fused ops' common one)."""
        if op.op_name:
            return op.op_name
        fused = set(op.fused_op_names)
        return next(iter(fused)) if len(fused) == 1 else ""

    def _candidates(self, module: str) -> list[str]:
        if module in self.programs:
            return [module]
        return self._by_base.get(xplane.module_base(module), [])

    def op_name(self, module: str, instruction: str) -> tuple[str, str]:
        """``(op name, HLO opcode)`` of an instruction of a program (``""`` where unknown);
        ``module`` with or without its program id."""
        names, codes = set(), set()
        for key in self._candidates(module):
            op = self.programs[key].get(instruction)
            if op is not None:
                names.add(self.own_op_name(op))
                codes.add(op.opcode)
        name = next(iter(names)) if len(names) == 1 else ""
        return name, next(iter(codes)) if len(codes) == 1 else ""

    def kernel_op_name(self, kernel_name: str, modules: Iterable[str] = ()) -> str:
        """The op name of a GPU kernel XLA named after its HLO instruction
        (``input_reduce_fusion_4`` for ``input_reduce_fusion.4``), searched in ``modules`` (the
        programs the device plane ran it in) or in every program; ``""`` when unknown or
        ambiguous."""
        keys = [k for m in modules for k in self._candidates(m)] or list(self.programs)
        names = set()
        for key in dict.fromkeys(keys):
            table = self._kernel_names.get(key)
            if table is None:
                table = {}
                for op in self.programs[key].values():
                    table.setdefault(_NON_WORD.sub("_", op.name), []).append(op)
                self._kernel_names[key] = table
            for op in table.get(_NON_WORD.sub("_", kernel_name), []):
                names.add(self.own_op_name(op))
        return next(iter(names)) if len(names) == 1 else ""


def xla_op_table(path: str | os.PathLike | Sequence[str]) -> pd.DataFrame:
    """The op table of a trace of XLA's CPU runtime (``jax.profiler`` on a CPU), where xprof's
    ``framework_op_stats`` has no rows: one row per framework op, from the host plane's events
    that carry ``hlo_module``/``hlo_op`` stats, their op names from the trace's HLO metadata
    (:class:`HloIndex`).

    Columns as :func:`op_table` (:data:`OP_COLUMNS`) and, from the instruction each op runs
    (:mod:`mpwatch.profile.hlo_cpu`), ``hlo_precision`` (``float16``, ``mixed``, ``float32``,
    ...; ``""`` where the HLO lacks it) and ``hlo_is_cast``; a fusion without an op name of its
    own is named after those fused into it. ``op_type`` is the op name's last component
    (the JAX primitive: ``conv_general_dilated``, ``dot_general``, ``convert_element_type``), or
    the HLO opcode where the metadata names no op (then ``op_name`` is ``<program>/<instruction>``).
    ``self_time_us`` leaves out HLO events nested inside (a conditional's branches).
    ``df.attrs["side"]`` is ``"host"``, ``df.attrs["source"]`` ``"xla_host"``. Raises
    :class:`ProfileError` when the trace holds no XLA op.
    """
    traces = list(path) if isinstance(path, (list, tuple)) else find_traces(path)
    try:
        spaces = [xplane.read_xspace(t, xplane.metadata_and_host) for t in traces]
    except (xplane.XSpaceError, OSError) as e:
        raise ProfileError(f"{traces[0]} is not a readable profiler trace (XSpace): {e}") from e
    events = [ev for space in spaces for ev in xplane.xla_host_events(space)]
    ran = xplane.ran_programs(ev.module for ev in events)  # the programs the trace ran, only
    index = HloIndex.of_spaces(spaces, ran)
    hlo = cpu_readings(spaces, ran)
    rows: dict[tuple[str, str, str, bool], list[float]] = {}
    for ev in events:
        op_name, opcode = index.op_name(ev.module, ev.hlo_op)
        found = hlo.reading(ev.module, ev.hlo_op)
        precision, is_cast = "", False
        if found is not None:
            reading, owner, opcode = found[0], found[1] or op_name, found[2] or opcode
            precision, is_cast = reading.precision, reading.is_cast
            op_name = owner or op_name
        if op_name:
            op_type = split_op_name(op_name)[-1] or opcode or ev.hlo_op
        else:
            op_name = f"{xplane.module_base(ev.module)}/{ev.hlo_op}"
            op_type = opcode or ev.hlo_op
        row = rows.setdefault((op_name, op_type, precision, is_cast), [0, 0.0, 0.0])
        row[0] += 1
        row[1] += ev.duration_ps / 1e6
        row[2] += ev.self_ps / 1e6
    if not rows:
        raise ProfileError(
            f"the trace {traces[0]} holds no XLA ops (no host events with hlo_op stats): was the "
            "profiler started and stopped around training steps? (On a CPU, while Keras runs "
            "its batch ends on a worker thread, jax.profiler records no XLA op events: keep "
            "MixedPrecisionMonitor's async_batch_end off there, its default)"
        )
    df = pd.DataFrame(
        [
            ("Host", op_type, op_name, int(n), total, own, "XLA", precision, is_cast)
            for (op_name, op_type, precision, is_cast), (n, total, own) in rows.items()
        ],
        columns=[*OP_COLUMNS, "hlo_precision", "hlo_is_cast"],
    )
    df = df.sort_values("self_time_us", ascending=False, kind="stable").reset_index(drop=True)
    df.attrs["side"] = "host"
    df.attrs["source"] = "xla_host"
    df.attrs["traces"] = traces
    return df


#: where the op table of :func:`summarize` comes from
OP_SOURCES = ("framework", "xla", "auto")


def trace_ops(traces: Sequence[str], ops: str = "framework") -> pd.DataFrame:
    """The op table of a trace: ``"framework"`` xprof's (:func:`op_table`: TensorFlow's ops),
    ``"xla"`` XLA's host ops (:func:`xla_op_table`: JAX on a CPU), ``"auto"`` XLA's (with the
    framework ops outside XLA's programs, e.g. the input pipeline) where they hold more time than
    xprof's (TensorFlow's ``jit_compile`` on a CPU), else xprof's (the first error is raised when
    neither has ops)."""
    if ops not in OP_SOURCES:
        raise ValueError(f"ops must be one of {OP_SOURCES}, not {ops!r}")
    if ops == "xla":
        return xla_op_table(traces)
    try:
        framework = op_table(traces)
    except ProfileError:
        if ops == "framework":
            raise
        first = sys.exc_info()[1]
        try:
            return xla_op_table(traces)
        except ProfileError:
            raise first from None
    if ops == "framework":
        return framework
    try:
        xla = xla_op_table(traces)
    except ProfileError:
        return framework
    if xla["self_time_us"].sum() <= framework["self_time_us"].sum():
        return framework
    # XLA ran the step (TensorFlow's jit_compile on a CPU): its ops, with the framework's ops
    # that ran outside it (the input pipeline, ``part`` "input") but not the launch of the XLA
    # program itself
    outside = framework[
        ~framework["op_type"].astype(str).str.contains(r"^_?Xla|PartitionedCall", regex=True)
        & ~framework["op_name"].astype(str).str.contains("__inference", regex=False)
    ]
    # what TensorFlow ran on the host beside the XLA step: the tf.data pipeline feeding it
    outside = outside.assign(part=INPUT)
    merged = pd.concat([xla.assign(part=""), outside], ignore_index=True)
    merged = merged.sort_values("self_time_us", ascending=False, kind="stable")
    merged = merged.reset_index(drop=True)
    merged.attrs.update(xla.attrs)
    return merged
