"""Read a logdir's event files into pandas tables: :func:`load_run`, :func:`load_runs`, ``Run``.

No TensorFlow: event files are TFRecord files (``u64 length, u32 masked crc32c(length), data,
u32 masked crc32c(data)``) of ``Event`` protos, read here with :mod:`struct`, :mod:`numpy` and
TensorBoard's ``event_pb2``. Everything is read (no sampling, unlike TensorBoard's reservoir).

Speed: scalar events (a few million for a long run) are decoded without a Python call per event.
Records of the same length and layout (same tag, same step width) are gathered into a numpy matrix
and their wall time, step and value read as columns; every record that does not match a known
layout (structured mpwatch records, histograms, anything unusual) is parsed with ``event_pb2``.

Robustness:

- a truncated last record (a run still being written, or killed) is skipped with a warning in
  :attr:`Run.warnings` that says which file, at which byte, and how much was missing;
- the crc of every record's length is verified (a bad one stops reading that file, with a warning);
  by default (``verify="all"``) the crc of every record's data is verified too, so a flipped bit
  never comes back as data (a record that fails is skipped with a warning); ``verify="lengths"``
  checks the data crc of structured records only (faster on huge scalar logs);
- a step going backwards within a run for one tag (a restart or a resume from a checkpoint) means
  the later writes win: earlier values at that step or later are dropped, as TensorBoard's purge of
  orphaned data does.

Example:
    >>> import mpwatch  # doctest: +SKIP
    >>> run = mpwatch.load_run("logs/run1")  # doctest: +SKIP
    >>> run.scalars["mpwatch/loss_scale"].tail()  # doctest: +SKIP
"""

from __future__ import annotations

import os
import struct
import warnings as _warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from mpwatch import contract

__all__ = [
    "Run",
    "ProbeResult",
    "load_run",
    "load_runs",
    "find_runs",
    "run_from_records",
    "ReadError",
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
        probe_model: one row per probe step: ``step``, the probe's ``model`` dict's keys,
            ``loss_scale``, ``recommended_scale``, ``mode``, ``reference``.
        histograms: probe step -> the probe's ``histogram`` dict.
        sweeps: ``step`` + the probe's ``sweep`` table columns.
        profile: the latest ``profile`` record, or None.
        notices: every ``notice`` record, each with its ``step``.
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
    probe_model: pd.DataFrame = field(default_factory=lambda: pd.DataFrame({"step": []}))
    histograms: dict[int, dict[str, Any]] = field(default_factory=dict)
    sweeps: pd.DataFrame = field(default_factory=lambda: pd.DataFrame({"step": []}))
    profile: dict[str, Any] | None = None
    notices: list[dict[str, Any]] = field(default_factory=list)
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

    def latest_probe(self, modes: Iterable[str] | None = None) -> ProbeResult | None:
        """The latest probe (of these ``modes``: "float16", "bfloat16", "preflight"), or None.

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
        )

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
    """

    step: int
    model: dict[str, Any]
    layers: pd.DataFrame
    variables: pd.DataFrame
    sweep: pd.DataFrame
    histogram: dict[str, Any] | None = None


def _empty_scalars() -> pd.DataFrame:
    return pd.DataFrame(index=pd.Index([], dtype="int64", name="step"))


# --- finding runs --------------------------------------------------------------------------------
def _is_event_file(name: str) -> bool:
    return "tfevents" in name and not name.endswith((".tmp", ".lock"))


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
        if any(_is_event_file(f) for f in filenames):
            rel = os.path.relpath(dirpath, root)
            runs[rel.replace(os.sep, "/")] = dirpath
    if errors and not runs and errors[0].filename == root:
        raise ReadError(f"logdir {root!r} cannot be read: {errors[0]}")
    return dict(sorted(runs.items()))


def _event_files(path: str) -> list[str]:
    names = [n for n in os.listdir(path) if _is_event_file(n)]

    # TensorBoard's order: by the timestamp in the name, then the name
    def key(n: str) -> tuple[int, str]:
        parts = n.split(".")
        try:
            i = parts.index("tfevents")
            return (int(parts[i + 1]), n)
        except (ValueError, IndexError):
            return (0, n)

    return [os.path.join(path, n) for n in sorted(names, key=key)]


# --- crc32c --------------------------------------------------------------------------------------
def _crc_table() -> np.ndarray:
    poly = 0x82F63B78
    table = np.zeros(256, dtype=np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        table[i] = c
    return table


_CRC_TABLE = _crc_table()


def _masked_crc32c_rows(rows: np.ndarray) -> np.ndarray:
    """Masked crc32c of each row of a uint8 matrix (vectorized over rows)."""
    crc = np.full(rows.shape[0], 0xFFFFFFFF, dtype=np.uint32)
    for k in range(rows.shape[1]):
        crc = _CRC_TABLE[(crc ^ rows[:, k]) & 0xFF] ^ (crc >> np.uint32(8))
    crc = crc ^ np.uint32(0xFFFFFFFF)
    return (((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(0xA282EAD8)).astype(
        np.uint32
    )


try:  # C implementation when installed (it comes with google-cloud libraries, often with TF)
    import google_crc32c as _gcrc

    def _crc32c(data: bytes) -> int:
        return _gcrc.value(data)

except ImportError:  # pragma: no cover - depends on the environment
    _gcrc = None

    def _crc32c(data: bytes) -> int:
        table = _CRC_TABLE
        crc = 0xFFFFFFFF
        for b in data:
            crc = int(table[(crc ^ b) & 0xFF]) ^ (crc >> 8)
        return crc ^ 0xFFFFFFFF


def _masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# --- framing -------------------------------------------------------------------------------------
def _frame_vectorized(arr: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Record starts found without a Python loop, or None when unsure (the caller then walks).

    Candidates: positions whose length's upper 32 bits are zero, whose data starts like an Event
    (0x09: wall_time) and whose length crc matches. The candidates must chain exactly from byte 0
    (each one's end is the next one's start) to the file's end; otherwise give up."""
    end = len(arr)
    if end < 16:
        return None
    c = np.nonzero(arr[12:] == 0x09)[0]
    c = c[c + 16 <= end]
    buf = arr.data
    u64 = np.ndarray(shape=(end - 7,), dtype="<u8", buffer=buf, strides=(1,))
    lens = u64[c]
    keep = lens < 2**32
    c, lens = c[keep], lens[keep].astype(np.int64)
    if not len(c) or c[0] != 0:
        return None
    u32 = np.ndarray(shape=(end - 3,), dtype="<u4", buffer=buf, strides=(1,))
    want = u32[c + 8]
    good = _masked_crc32c_rows(_gather_rows(buf, c, 8)) == want
    c, lens = c[good], lens[good]
    nxt = c + 16 + lens
    if not len(c) or not np.array_equal(nxt[:-1], c[1:]):
        return None
    if nxt[-1] != end:
        return None  # a truncated or odd tail: let the walk say exactly what is wrong
    return c + 12, lens


def _frame(buf: bytes, fname: str, warn: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Offsets and lengths of the records' data in one file's bytes. A truncated tail is skipped
    with a warning; a bad length crc stops the file there, with a warning."""
    arr = np.frombuffer(buf, dtype=np.uint8)
    fast = _frame_vectorized(arr)
    if fast is not None:
        return fast  # every length crc already verified
    offs: list[int] = []
    lens: list[int] = []
    append_o = offs.append
    append_l = lens.append
    unpack = struct.Struct("<Q").unpack_from
    pos = 0
    end = len(buf)
    while pos + 12 <= end:
        n = unpack(buf, pos)[0]
        nxt = pos + 16 + n
        if nxt > end:
            break
        append_o(pos + 12)
        append_l(n)
        pos = nxt
    if pos < end:
        missing = ""
        if pos + 8 <= end:
            n = unpack(buf, pos)[0]
            missing = f" of a {n + 16}-byte record"
        warn.append(
            f"{fname}: last record truncated at byte {pos} ({end - pos} bytes{missing}); skipped "
            "(the run may still be writing, or was killed)"
        )
    o = np.asarray(offs, dtype=np.int64)
    ln = np.asarray(lens, dtype=np.int64)
    if len(o):
        # verify every length's crc, vectorized: it guards the framing itself
        heads = arr[(o - 12)[:, None] + np.arange(8)]
        want = arr[(o - 4)[:, None] + np.arange(4)].copy().view("<u4").ravel()
        bad = np.nonzero(_masked_crc32c_rows(heads) != want)[0]
        if len(bad):
            first = int(bad[0])
            warn.append(
                f"{fname}: corrupt record header at byte {int(o[first]) - 12} (length crc "
                f"mismatch); skipped the rest of the file ({len(o) - first} records)"
            )
            o, ln = o[:first], ln[:first]
    return o, ln


# --- decoding ------------------------------------------------------------------------------------
def _varint(b: bytes, p: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if p >= len(b):
            raise IndexError
        c = b[p]
        result |= (c & 0x7F) << shift
        p += 1
        if not c & 0x80:
            return result, p
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


# one fast-path layout: which byte ranges vary between events of the same tag
@dataclass
class _Layout:
    tag: str
    step_pos: int  # start of the step varint (0 width when no step field: step 0)
    step_len: int
    value_pos: int
    value_dtype: str  # "<f4" or "<f8"
    template: bytes


def _scalar_layout(rec: bytes) -> _Layout | None:
    """The layout of a single-scalar event (``tf.summary.scalar`` in TF2 or a TF1
    ``simple_value``), or None for anything else."""
    try:
        p = 0
        n = len(rec)
        step_pos, step_len = 0, 0
        summary_span = None
        while p < n:
            key = rec[p]
            p += 1
            if key == 0x09:  # wall_time
                p += 8
            elif key == 0x10:  # step
                step_pos = p
                _, q = _varint(rec, p)
                step_len = q - p
                p = q
            elif key == 0x2A:  # summary
                ln, p = _varint(rec, p)
                summary_span = (p, p + ln)
                p += ln
            else:
                return None
        if summary_span is None or p != n:
            return None
        p, send = summary_span
        if rec[p] != 0x0A:
            return None
        ln, p = _varint(rec, p + 1)
        if p + ln != send:
            return None  # more than one value
        tag = None
        value_pos, value_dtype = None, None
        while p < send:
            key = rec[p]
            p += 1
            if key == 0x0A:  # tag
                ln, p = _varint(rec, p)
                tag = rec[p : p + ln].decode("utf-8")
                p += ln
            elif key == 0x15:  # simple_value
                value_pos, value_dtype = p, "<f4"
                p += 4
            elif key == 0x42:  # tensor
                ln, p = _varint(rec, p)
                tend = p + ln
                dtype = None
                while p < tend:
                    k = rec[p]
                    p += 1
                    if k == 0x08:
                        dtype, p = _varint(rec, p)
                    elif k == 0x12:  # shape: must be a scalar
                        sl, p = _varint(rec, p)
                        if sl:
                            return None
                    elif k in (0x22, 0x2A, 0x32):  # tensor_content / packed float / double
                        sl, p = _varint(rec, p)
                        want = {1: 4, 2: 8}.get(dtype or 0)
                        if want is None or sl != want:
                            return None
                        if k == 0x2A and dtype != 1 or k == 0x32 and dtype != 2:
                            return None
                        value_pos, value_dtype = p, ("<f4" if dtype == 1 else "<f8")
                        p += sl
                    else:
                        return None
                if p != tend:
                    return None
            elif key == 0x4A:  # metadata: any (plugin "scalars")
                ln, p = _varint(rec, p)
                p += ln
            else:
                return None
        if tag is None or value_pos is None or p != send:
            return None
        return _Layout(tag, step_pos, step_len, value_pos, value_dtype, rec)
    except (IndexError, ValueError, UnicodeDecodeError):
        return None


@dataclass
class _Acc:
    """Everything decoded from one run, in file order (seq = global order)."""

    sc_tag: list[np.ndarray] = field(default_factory=list)  # tag ids
    sc_seq: list[np.ndarray] = field(default_factory=list)
    sc_step: list[np.ndarray] = field(default_factory=list)
    sc_val: list[np.ndarray] = field(default_factory=list)
    tags: dict[str, int] = field(default_factory=dict)
    # (seq, step, kind, payload)
    recs: list[tuple[int, int, str, dict[str, Any]]] = field(default_factory=list)

    def tag_id(self, tag: str) -> int:
        i = self.tags.get(tag)
        if i is None:
            i = self.tags[tag] = len(self.tags)
        return i


_MAX_TEMPLATES_PER_LENGTH = 64
_CHUNK = 262144


def _gather_rows(buf: Any, offs: np.ndarray, length: int) -> np.ndarray:
    """The bytes buf[o : o + length] for each o, as an (n, length) uint8 matrix (one memcpy per
    row, through a strided view of the buffer as length-byte items)."""
    view = np.ndarray(
        shape=(len(buf) - length + 1,), dtype=np.dtype((np.void, length)), buffer=buf, strides=(1,)
    )
    return view[offs].view(np.uint8).reshape(len(offs), length)


_FAST_MAX_LEN = 400


def _decode_fast(
    arr: np.ndarray, offs: np.ndarray, lens: np.ndarray, seq: np.ndarray, acc: _Acc, buf: bytes
) -> np.ndarray:
    """Decode the scalar events whose layout repeats; returns a mask of the records done."""
    done = np.zeros(len(offs), dtype=bool)
    small = np.nonzero(lens <= _FAST_MAX_LEN)[0]
    if not len(small):
        return done
    order = small[np.argsort(lens[small], kind="stable")]
    sl = lens[order]
    starts = np.concatenate([[0], np.nonzero(np.diff(sl))[0] + 1])
    uniq = sl[starts]
    bounds = list(starts) + [len(order)]
    for gi, length in enumerate(uniq):
        group = order[bounds[gi] : bounds[gi + 1]]
        length = int(length)
        for c0 in range(0, len(group), _CHUNK):
            idx = group[c0 : c0 + _CHUNK]
            if length < 8 or len(idx) < 4:
                continue  # not worth it: the slow path takes them
            mat = _gather_rows(buf, offs[idx], length)
            l8 = (length + 7) // 8 * 8
            padded = np.zeros((len(idx), l8), dtype=np.uint8)
            padded[:, :length] = mat
            words = padded.view("<u8")  # compare 8 bytes at a time
            remaining = np.arange(len(idx))
            for _ in range(_MAX_TEMPLATES_PER_LENGTH):
                if not len(remaining):
                    break
                first = int(idx[remaining[0]])
                o = int(offs[first])
                lay = _scalar_layout(buf[o : o + length])
                if lay is None:
                    # drop every row identical in its first bytes: same kind of record, slow path
                    remaining = remaining[1:]
                    continue
                tmpl = np.frombuffer(lay.template, dtype=np.uint8)
                var = np.zeros(length, dtype=bool)
                if buf[o] == 0x09:
                    var[1:9] = True
                var[lay.step_pos : lay.step_pos + lay.step_len] = True
                width = 4 if lay.value_dtype == "<f4" else 8
                var[lay.value_pos : lay.value_pos + width] = True
                fixed = np.nonzero(~var)[0]
                sub = mat[remaining]
                tw = np.zeros(l8, dtype=np.uint8)
                tw[:length] = tmpl
                mw = np.zeros(l8, dtype=np.uint8)
                mw[fixed] = 0xFF
                ok = ~((words[remaining] ^ tw.view("<u8")) & mw.view("<u8")).any(axis=1)
                # the step varint must have exactly step_len bytes
                if lay.step_len:
                    sb = sub[:, lay.step_pos : lay.step_pos + lay.step_len]
                    cont = (sb & 0x80) != 0
                    ok &= cont[:, :-1].all(axis=1) & ~cont[:, -1]
                rows = remaining[ok]
                remaining = remaining[~ok]
                if not len(rows):
                    remaining = remaining[1:] if len(remaining) else remaining
                    continue
                m = mat[rows]
                step = np.zeros(len(rows), dtype=np.int64)
                if lay.step_len:
                    sb = m[:, lay.step_pos : lay.step_pos + lay.step_len].astype(np.int64)
                    for k in range(lay.step_len):
                        step |= (sb[:, k] & 0x7F) << (7 * k)
                vals = (
                    np.ascontiguousarray(m[:, lay.value_pos : lay.value_pos + width])
                    .view(lay.value_dtype)
                    .ravel()
                    .astype(np.float64)
                )
                tid = acc.tag_id(lay.tag)
                acc.sc_tag.append(np.full(len(rows), tid, dtype=np.int32))
                acc.sc_seq.append(seq[idx[rows]])
                acc.sc_step.append(step)
                acc.sc_val.append(vals)
                done[idx[rows]] = True
    return done


_NP_DTYPES = {1: "<f4", 2: "<f8", 19: "<f2", 3: "<i4", 9: "<i8", 14: None}


def _scalar_of_tensor(t: Any) -> float | None:
    if len(t.tensor_shape.dim):
        return None
    dt = t.dtype
    if dt == 1 and len(t.float_val):
        return float(t.float_val[0])
    if dt == 2 and len(t.double_val):
        return float(t.double_val[0])
    if dt == 19 and len(t.half_val):
        return float(np.array([t.half_val[0]], dtype=np.uint16).view(np.float16)[0])
    if dt in (3, 9) and (len(t.int_val) or len(t.int64_val)):
        return float(t.int_val[0] if dt == 3 else t.int64_val[0])
    npd = _NP_DTYPES.get(dt)
    if npd and t.tensor_content:
        return float(np.frombuffer(t.tensor_content, dtype=npd)[0])
    return None


def _decode_slow(
    buf: bytes,
    offs: np.ndarray,
    lens: np.ndarray,
    seq: np.ndarray,
    acc: _Acc,
    fname: str,
    warn: list[str],
    verify_all: bool,
) -> None:
    from tensorboard.compat.proto import event_pb2

    sc_tag: list[int] = []
    sc_seq: list[int] = []
    sc_step: list[int] = []
    sc_val: list[float] = []
    bad_crc = 0
    for o, n, s in zip(offs.tolist(), lens.tolist(), seq.tolist()):
        data = buf[o : o + n]
        is_big = n > _FAST_MAX_LEN
        if (verify_all or is_big) and _masked(_crc32c(data)) != struct.unpack_from(
            "<I", buf, o + n
        )[0]:
            bad_crc += 1
            continue
        try:
            ev = event_pb2.Event.FromString(data)
        except Exception:  # noqa: BLE001 - protobuf raises its own DecodeError
            warn.append(f"{fname}: record at byte {o - 12} is not an Event; skipped")
            continue
        if not ev.HasField("summary"):
            continue
        step = int(ev.step)
        for v in ev.summary.value:
            kind = contract.kind_of_tag(v.tag)
            plugin = v.metadata.plugin_data.plugin_name if v.HasField("metadata") else ""
            if kind is not None and (plugin in ("", contract.PLUGIN_NAME)):
                try:
                    if plugin:
                        contract.parse_metadata_content(v.metadata.plugin_data.content)
                    if not v.tensor.string_val:
                        raise ValueError("no payload")
                    payload = contract.decode_payload(v.tensor.string_val[0])
                except ValueError as e:
                    warn.append(f"{fname}: {v.tag} at step {step}: {e}; skipped")
                    continue
                acc.recs.append((s, step, kind, payload))
                continue
            which = v.WhichOneof("value")
            val: float | None = None
            if which == "simple_value":
                val = float(v.simple_value)
            elif which == "tensor" and plugin in ("", "scalars"):
                val = _scalar_of_tensor(v.tensor)
            if val is not None:
                sc_tag.append(acc.tag_id(v.tag))
                sc_seq.append(s)
                sc_step.append(step)
                sc_val.append(val)
    if bad_crc:
        warn.append(f"{fname}: {bad_crc} record(s) with a data crc mismatch; skipped")
    if sc_tag:
        acc.sc_tag.append(np.asarray(sc_tag, dtype=np.int32))
        acc.sc_seq.append(np.asarray(sc_seq, dtype=np.int64))
        acc.sc_step.append(np.asarray(sc_step, dtype=np.int64))
        acc.sc_val.append(np.asarray(sc_val, dtype=np.float64))


def _read_file(
    fname: str, acc: _Acc, seq0: int, warn: list[str], verify_all: bool
) -> tuple[int, int]:
    """Decode one event file into acc; returns (next seq, bytes read)."""
    try:
        with open(fname, "rb") as f:
            buf = f.read()
    except OSError as e:
        warn.append(f"{fname}: cannot be read ({e}); skipped")
        return seq0, 0
    offs, lens = _frame(buf, fname, warn)
    seq = np.arange(seq0, seq0 + len(offs), dtype=np.int64)
    if verify_all and len(offs):
        ok = _data_crc_ok(buf, offs, lens)
        if not ok.all():
            warn.append(
                f"{fname}: {int((~ok).sum())} record(s) with a data crc mismatch; skipped"
            )
            offs, lens, seq = offs[ok], lens[ok], seq[ok]
    arr = np.frombuffer(buf, dtype=np.uint8)
    done = _decode_fast(arr, offs, lens, seq, acc, buf)
    rest = ~done
    # crcs are checked above (verify_all) or, for structured records, by the slow path itself
    _decode_slow(buf, offs[rest], lens[rest], seq[rest], acc, fname, warn, False)
    return seq0 + len(offs), len(buf)


def _data_crc_ok(buf: bytes, offs: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Whether each record's data matches its stored crc; records of one length are checked
    together (a table-driven crc32c vectorized over rows), rare lengths one by one in C."""
    ok = np.ones(len(offs), dtype=bool)
    stored = _gather_rows(buf, offs + lens, 4).copy().view("<u4").ravel()
    order = np.argsort(lens, kind="stable")
    sl = lens[order]
    starts = np.concatenate([[0], np.nonzero(np.diff(sl))[0] + 1, [len(order)]])
    for a, b in zip(starts[:-1].tolist(), starts[1:].tolist()):
        group = order[a:b]
        length = int(sl[a])
        if b - a >= 32 and length <= _FAST_MAX_LEN:
            for c0 in range(0, len(group), _CHUNK):
                idx = group[c0 : c0 + _CHUNK]
                rows = _gather_rows(buf, offs[idx], length)
                ok[idx] = _masked_crc32c_rows(rows) == stored[idx]
        else:
            for i in group.tolist():
                o = int(offs[i])
                ok[i] = _masked(_crc32c(buf[o : o + length])) == int(stored[i])
    return ok


def later_writes_win(seq: np.ndarray, step: np.ndarray, strict: bool = False) -> np.ndarray:
    """Indices (into arrays in write order) of the values that survive 'later writes win': a value
    is dropped when a later write has a step <= its step (< with strict: several records at one
    step are parts of one). The TensorBoard plugin applies the same rule.

    >>> later_writes_win(np.arange(5), np.array([1, 2, 3, 2, 3])).tolist()  # a resume at step 2
    [0, 3, 4]
    """
    n = len(step)
    if not n:
        return np.zeros(0, dtype=np.int64)
    rev_min = np.minimum.accumulate(step[::-1])[::-1]
    later_min = np.empty(n, dtype=step.dtype)
    later_min[:-1] = rev_min[1:]
    later_min[-1] = np.iinfo(np.int64).max
    keep = step < later_min if not strict else step <= later_min
    return np.nonzero(keep)[0]


def _scalars_frame(acc: _Acc) -> pd.DataFrame:
    if not acc.sc_tag:
        return _empty_scalars()
    tag = np.concatenate(acc.sc_tag)
    seq = np.concatenate(acc.sc_seq)
    step = np.concatenate(acc.sc_step)
    val = np.concatenate(acc.sc_val)
    order = np.lexsort((seq, tag))
    tag, seq, step, val = tag[order], seq[order], step[order], val[order]
    names = {i: t for t, i in acc.tags.items()}
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


def _merge_parts(payloads: list[dict[str, Any]]) -> dict[str, Any]:
    """Several records of one kind at one step. A record with ``"part" >= 1`` continues the one
    before it (a large table split into parts: its tables are appended); any other record replaces
    what came before (the later write wins)."""
    out: dict[str, Any] = {}
    for p in payloads:
        part = p.get("part")
        if not out or not isinstance(part, int) or part < 1:
            out = dict(p)
            continue
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
    out.pop("part", None)
    return out


def _records(acc: _Acc) -> dict[str, list[tuple[int, dict[str, Any]]]]:
    by_kind: dict[str, list[tuple[int, int, dict[str, Any]]]] = {}
    for seq, step, kind, payload in acc.recs:
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
        if kind == contract.KIND_NOTICE:
            out[kind] = [(s, p) for s in sorted(grouped) for p in grouped[s]]
        else:
            out[kind] = [(s, _merge_parts(grouped[s])) for s in sorted(grouped)]
    return out


def _build_run(name: str, path: str, acc: _Acc, warn: list[str]) -> Run:
    run = Run(name=name, path=path, warnings=warn)
    run.scalars = _scalars_frame(acc)
    recs = _records(acc)
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
    run.sweeps = _stack_tables([(s, p.get("sweep")) for s, p in probes])
    rows = []
    for s, p in probes:
        row: dict[str, Any] = {"step": s}
        model = p.get("model")
        if isinstance(model, dict):
            row.update(model)
        for k in ("loss_scale", "recommended_scale", "mode", "reference", "reference_note"):
            row[k] = p.get(k)
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
    acc = _Acc()
    seq = 0
    for tag, (steps, values) in sorted(scalars.items()):
        n = len(steps)
        acc.sc_tag.append(np.full(n, acc.tag_id(tag), dtype=np.int32))
        acc.sc_seq.append(np.arange(seq, seq + n, dtype=np.int64))
        acc.sc_step.append(np.asarray(steps, dtype=np.int64))
        acc.sc_val.append(np.asarray(values, dtype=np.float64))
        seq += n
    for kind, items in sorted(records.items()):
        for step, payload in items:
            acc.recs.append((seq, int(step), kind, dict(payload)))
            seq += 1
    return _build_run(name, path, acc, list(warnings))


def _read_run(
    name: str,
    path: str,
    verify: str,
    progress: ProgressFn | None,
    done_total: list[int],
) -> Run:
    acc = _Acc()
    warn: list[str] = []
    seq = 0
    try:
        files = _event_files(path)
    except OSError as e:
        raise ReadError(f"run directory {path!r} cannot be read: {e}") from e
    for fname in files:
        seq, nbytes = _read_file(fname, acc, seq, warn, verify == "all")
        if progress is not None:
            done_total[0] += nbytes
            progress(done_total[0], done_total[1])
    return _build_run(name, path, acc, warn)


def _sizes(paths: Iterable[str]) -> int:
    total = 0
    for p in paths:
        try:
            for f in _event_files(p):
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
