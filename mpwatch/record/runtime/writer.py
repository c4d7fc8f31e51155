"""The only code that writes mpwatch events: :class:`RunWriter` (TensorFlow imported lazily).

Tags, record kinds and the payload encoding come from :mod:`mpwatch.contract`.

Large records: :meth:`RunWriter.record` writes a payload whose compressed size would exceed
``contract.MAX_RECORD_BYTES`` as several records at the same step (:func:`split_payload`), each
under the limit, so no table is ever too large to record (a model with tens of thousands of
variables); ``mpwatch.read`` joins the parts back.
"""

from __future__ import annotations

import itertools
import math
import os
import socket
import struct
import threading
import time
from collections.abc import Mapping
from typing import Any

from mpwatch import contract, wire

_PLACEHOLDER = 10**9  # "part"/"parts" while sizing parts: never shorter than the final numbers


def _is_table(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("columns"), list)
        and isinstance(value.get("data"), list)
    )


def split_payload(
    payload: Mapping[str, Any], limit: int | None = None
) -> list[tuple[dict[str, Any], bytes]]:
    """The records a payload is written as, each ``(payload, compressed blob)`` under ``limit``
    bytes (default ``contract.MAX_RECORD_BYTES``).

    A payload that fits is one record. Otherwise its tables (split-layout values: ``{"columns",
    "data"}``) are moved out, largest first, until the rest fits: the head record keeps every key,
    with ``"part": 0``, ``"parts": N`` and the moved tables emptied (their columns kept); then come
    continuation records ``{"part": i, "parts": N, key: {"columns", "data": next rows}}``, each
    holding the next rows of one moved table, rows in order, as many as fit. Joining them
    (``mpwatch.read``: a ``part >= 1`` appends its tables' rows to the record before it) gives the
    payload back.

    Raises:
        ValueError: the payload cannot be split under the limit (no tables, a head too large
            without its tables' rows, or a single row over the limit).

    Example:
        >>> rows = [[i, "x" * 50 + str(i)] for i in range(400)]
        >>> parts = split_payload({"a": 1, "t": contract.table(["i", "s"], rows)}, limit=2000)
        >>> [p.get("part") for p, _ in parts][:3], parts[0][0]["parts"] == len(parts)
        ([0, 1, 2], True)
        >>> [r for p, _ in parts for r in p["t"]["data"]] == rows
        True
    """
    limit = contract.MAX_RECORD_BYTES if limit is None else int(limit)
    plain = contract.json_safe(payload, nonfinite="keep")
    blob = contract.encode_plain(plain)
    if len(blob) <= limit:
        return [(plain, blob)]
    # Parts are sized with placeholder part numbers; compressed sizes are not monotonic in the
    # content, so the real numbers can add a byte or two: then split again with a tighter budget.
    budget = limit
    for _ in range(8):
        out = _split(plain, blob, budget)
        blobs = [contract.encode_plain(p) for p in out]
        over = max(len(b) for b in blobs) - limit
        if over <= 0:
            return list(zip(out, blobs))
        budget -= max(8, over)
    raise ValueError(f"record could not be split under the {limit}-byte limit")


def _split(plain: dict[str, Any], blob: bytes, limit: int) -> list[dict[str, Any]]:
    """The head and continuation payloads of :func:`split_payload`, each sized under ``limit``
    with placeholder part numbers."""
    tables = [k for k, v in plain.items() if _is_table(v)]
    if not tables:
        raise ValueError(
            f"record is {len(blob)} bytes compressed, over the {limit}-byte limit, with no "
            "table to split"
        )
    size = {k: len(contract.encode_plain(plain[k])) for k in tables}
    head = dict(plain, part=0, parts=_PLACEHOLDER)
    moved: list[str] = []
    for k in sorted(tables, key=lambda k: -size[k]):
        if len(contract.encode_plain(head)) <= limit:
            break
        head[k] = {"columns": plain[k]["columns"], "data": []}
        moved.append(k)
    if len(contract.encode_plain(head)) > limit:
        raise ValueError(
            f"record over the {limit}-byte limit even without its tables' rows: cannot be split"
        )
    pieces = []
    for k in sorted(moved, key=tables.index):  # the payload's own order of tables
        columns = plain[k]["columns"]
        for rows in _row_chunks(k, columns, plain[k]["data"], limit):
            pieces.append({k: {"columns": columns, "data": rows}})
    parts = 1 + len(pieces)
    head["parts"] = parts
    return [head] + [{"part": i, "parts": parts, **p} for i, p in enumerate(pieces, start=1)]


def _row_chunks(key: str, columns: list[str], rows: list[Any], limit: int) -> list[list[Any]]:
    """Consecutive runs of ``rows``, each small enough for one continuation record."""

    def fits(chunk: list[Any]) -> bool:
        part = {
            "part": _PLACEHOLDER,
            "parts": _PLACEHOLDER,
            key: {"columns": columns, "data": chunk},
        }
        return len(contract.encode_plain(part)) <= limit

    def fit(chunk: list[Any]) -> list[list[Any]]:
        if fits(chunk):
            return [chunk]
        if len(chunk) <= 1:
            raise ValueError(f"one row of table {key!r} is over the {limit}-byte record limit")
        mid = len(chunk) // 2
        return fit(chunk[:mid]) + fit(chunk[mid:])

    if not rows:
        return []
    # a first guess from the compressed size of the whole table (then halve what does not fit)
    whole = len(contract.encode_plain({key: {"columns": columns, "data": rows}}))
    n = max(1, math.ceil(whole / (0.85 * limit)))
    step = max(1, math.ceil(len(rows) / n))
    return [c for i in range(0, len(rows), step) for c in fit(rows[i : i + step])]


class _TensorBoardEvents:
    """Event files written with TensorBoard's own writer, for processes without TensorFlow (Keras'
    JAX backend). The events are those ``tf.summary.scalar`` and ``tf.summary.write`` write: a
    float32 scalar tensor under the scalar plugin's metadata, and a string tensor under mpwatch's
    (tests/record/test_writer_backends.py compares the two writers' events field by field).

    Scalars are written every step, so their cost is training's: the tensor is built directly
    (``make_tensor_proto`` checks and converts, ~4x the time), and each record's checksum comes
    from :func:`mpwatch.wire.masked_crc32c` (C when ``google_crc32c`` is installed; TensorBoard's
    own is pure Python, two per event) through this writer's own record framing."""

    def __init__(self, logdir: str) -> None:
        self._scalar_events: _ScalarEvents | None = None
        if "://" not in str(logdir):  # a local folder: no tf.io.gfile (see _LocalEventFile)
            self._writer: Any = _LocalEventFile(logdir)
            return
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._writer = EventFileWriter(logdir)
        _frame_with_fast_crc(self._writer)

    def add_scalars(self, scalars: list[tuple[str, int, float]], metadata: Any) -> None:
        """Float32 scalar events (``tf.summary.scalar``'s), serialized by :class:`_ScalarEvents`
        into a local file in one write; through TensorBoard's writer elsewhere."""
        if isinstance(self._writer, _LocalEventFile):
            if self._scalar_events is None:
                self._scalar_events = _ScalarEvents(metadata.SerializeToString())
            enc, now = self._scalar_events.encode, time.time()
            self._writer.add_serialized(
                [enc(tag, step, value, now) for tag, step, value in scalars]
            )
            return
        for tag, step, value in scalars:
            self.add(tag, step, _float32_scalar(value), metadata)

    def add(self, tag: str, step: int, tensor: Any, metadata: Any) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2

        value = summary_pb2.Summary.Value(tag=tag, tensor=tensor, metadata=metadata)
        event = event_pb2.Event(
            wall_time=time.time(), step=int(step), summary=summary_pb2.Summary(value=[value])
        )
        self._writer.add_event(event)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class _LocalEventFile:
    """An event file in a local folder, written as TensorBoard's ``EventFileWriter`` writes one
    (its file name, a first event with ``file_version: "brain.Event:2"``, TFRecord framing) with
    plain file I/O. TensorBoard's writer goes through ``tf.io.gfile``, which imports TensorFlow
    when it is installed: 2.7 s of a JAX process' first monitored fit on a CPU, and its memory,
    for a ``makedirs`` and an ``open`` (remote logdirs, ``gs://`` and the like, still take
    TensorBoard's writer). The file is flushed at :meth:`flush` and at least every
    :data:`FLUSH_SECONDS` while events are added, so a running TensorBoard sees them."""

    FLUSH_SECONDS = 10.0

    def __init__(self, logdir: str) -> None:
        os.makedirs(logdir, exist_ok=True)
        stamp, host, pid = int(time.time()), socket.gethostname(), os.getpid()
        name = f"events.out.tfevents.{stamp:010d}.{host}.{pid}.{_next_uid()}"
        self.path = os.path.join(logdir, name)
        self._file = open(self.path, "xb")  # never another writer's file
        self._flushed = time.monotonic()
        from tensorboard.compat.proto import event_pb2

        self.add_event(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))
        self.flush()

    def add_event(self, event: Any) -> None:
        self.add_serialized([event.SerializeToString()])

    def add_serialized(self, events: list[bytes]) -> None:
        """Serialized events, framed and written in one call."""
        self._file.write(wire.frame_records(events))
        if time.monotonic() - self._flushed > self.FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        self._file.flush()
        self._flushed = time.monotonic()

    def close(self) -> None:
        self._file.close()


def _next_uid() -> int:
    """The next number of TensorBoard's own per-process writer counter (the last part of an
    event file's name), so this process' TensorBoard writers and mpwatch's never share a name."""
    try:
        from tensorboard.summary.writer import event_file_writer

        return int(event_file_writer._global_uid.get())
    except Exception:  # noqa: BLE001 - another TensorBoard: a number of mpwatch's own
        return next(_uids)


_uids = itertools.count(1 << 20)


def _frame_with_fast_crc(events: Any) -> None:
    """Have this EventFileWriter's record writer (only this one: an instance attribute) frame
    records with :func:`mpwatch.wire.masked_crc32c`; the bytes are the same. Left as it is where
    TensorBoard's writer is built differently."""
    record_writer = getattr(getattr(events, "_async_writer", None), "_writer", None)
    out = getattr(record_writer, "_writer", None)
    if out is None or not callable(getattr(record_writer, "write", None)):
        return

    def write(data: bytes) -> None:
        out.write(wire.frame_record(data))

    record_writer.write = write


class _ScalarEvents:
    """A float32 scalar's event serialized directly: the bytes ``tf.summary.scalar`` writes (its
    tensor's value as ``tensor_content``; tested byte for byte against protobuf's serialization
    of that ``Event``, and against TensorFlow's own file), at a fifth of the cost of building
    the messages: a run writes every step's scalars (loss scale, skips, input health...),
    70 us a step through the message classes on a small model. The tag's and the metadata's
    bytes are made once."""

    # dtype DT_FLOAT, shape {}, tensor_content of 4 bytes: tf.summary.scalar's own layout
    _TENSOR = b"\x08\x01\x12\x00\x22\x04"

    def __init__(self, metadata: bytes) -> None:
        self._meta = b"\x4a" + wire.put_varint(len(metadata)) + metadata
        # per tag: the event's bytes from the summary's field tag to the float's (all constant:
        # the summary's length does not depend on the step, the value or the time)
        self._tags: dict[str, bytes] = {}
        self._pack_f, self._pack_d = struct.Struct("<f").pack, struct.Struct("<d").pack
        self._steps: dict[int, bytes] = {}  # recent steps' bytes (field 2, varint)

    def _prefix(self, tag: str) -> bytes:
        raw = tag.encode("utf-8")
        head = b"\x0a" + wire.put_varint(len(raw)) + raw
        v_len = len(head) + 2 + len(self._TENSOR) + 4 + len(self._meta)
        v_head = head + b"\x42\x0a" + self._TENSOR
        summary_len = 1 + len(wire.put_varint(v_len)) + v_len
        prefix = b"\x2a" + wire.put_varint(summary_len) + b"\x0a" + wire.put_varint(v_len) + v_head
        self._tags[tag] = prefix
        return prefix

    def encode(self, tag: str, step: int, value: float, wall_time: float) -> bytes:
        prefix = self._tags.get(tag) or self._prefix(tag)
        try:
            f = self._pack_f(value)
        except (OverflowError, TypeError):  # beyond float32 (inf, as numpy rounds it), not a float
            import numpy as np

            f = np.float32(value).tobytes()
        at = self._steps.get(step)
        if at is None:
            step = int(step)  # proto3 leaves a 0 out
            at = b"\x10" + wire.put_varint(step & 0xFFFFFFFFFFFFFFFF) if step else b""
            if len(self._steps) >= 4096:  # the steps of the last few writes
                self._steps.clear()
            self._steps[step] = at
        return b"\x09" + self._pack_d(wall_time) + at + prefix + f + self._meta


def _float32_scalar(value: float) -> Any:
    """The TensorProto ``make_tensor_proto(np.float32(value))`` makes (a float32 scalar)."""
    import numpy as np
    from tensorboard.compat.proto import tensor_pb2, tensor_shape_pb2, types_pb2

    return tensor_pb2.TensorProto(
        dtype=types_pb2.DT_FLOAT,
        tensor_shape=tensor_shape_pb2.TensorShapeProto(),
        float_val=[float(np.float32(value))],
    )


def _scalar_metadata() -> Any:
    from tensorboard.plugins.scalar import metadata as scalar_metadata

    return scalar_metadata.create_summary_metadata(display_name=None, description=None)


_write_fns: dict[str, Any] = {}


def _write_function(kind: str) -> Any:
    """One compiled function (per process) writing many summaries through the writer passed to
    it: ``"scalars"`` (float32 values under the scalar plugin's metadata) or ``"records"``
    (string tensors, each with its own serialized metadata).

    The writer's resource is an argument, not a capture, so the writer each ``fit`` opens reuses
    the trace (``tf.summary.write`` inside a function would capture the writer and retrace per
    fit); an input signature makes every length share it. One call costs about what one eager
    ``tf.summary.scalar`` costs (~0.3-1 ms on a CPU), for any number of values.
    """
    fn = _write_fns.get(kind)
    if fn is None:
        import tensorflow as tf

        writer = tf.TensorSpec([], tf.resource)
        tags, steps = tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.int64)

        def write_all(writer, tags, steps, values, metas):  # noqa: ANN001, ANN202
            def body(i):  # noqa: ANN001, ANN202
                meta = metas if metas.shape.rank == 0 else metas[i]
                write = tf.raw_ops.WriteSummary(
                    writer=writer, step=steps[i], tensor=values[i], tag=tags[i],
                    summary_metadata=meta,
                )  # fmt: skip
                with tf.control_dependencies([write]):
                    return i + 1

            with tf.device("/cpu:0"):  # where tf.summary.write puts it: WriteSummary is CPU-only
                tf.while_loop(lambda i: i < tf.size(steps), body, [tf.constant(0)])

        # autograph off: an explicit loop traces in milliseconds (autograph's conversion: ~0.1 s)
        if kind == "scalars":
            meta = _scalar_metadata().SerializeToString()
            signature = [writer, tags, steps, tf.TensorSpec([None], tf.float32)]

            def fn(writer, tags, steps, values):  # noqa: ANN001, ANN202
                write_all(writer, tags, steps, values, tf.constant(meta))
        else:
            strings = tf.TensorSpec([None], tf.string)
            signature = [writer, tags, steps, strings, strings]
            fn = write_all
        fn = _write_fns[kind] = tf.function(fn, input_signature=signature, autograph=False)
    return fn


def _record_metadata(kind: str) -> Any:
    from tensorboard.compat.proto import summary_pb2

    return summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name=contract.PLUGIN_NAME, content=contract.metadata_content(kind)
        ),
        data_class=summary_pb2.DATA_CLASS_TENSOR,
        summary_description=f"mpwatch {kind} record",
    )


class RunWriter:
    """Writes mpwatch scalars and records into one run directory.

    ``enabled=False`` makes every call a no-op (a non-chief worker under ``tf.distribute``).
    Several writers may share a logdir: TensorFlow shares one file writer per directory.
    A local logdir is written by mpwatch's own event file writer (:class:`_LocalEventFile`, on
    every backend: a scalar's event costs ~1.5 us, against ~20 us a value through
    ``tf.summary``'s compiled write on TensorFlow); a remote one (``gs://``...) through
    ``tf.summary``'s file writer on Keras' TensorFlow backend and TensorBoard's own writer
    elsewhere. The events are the same (tests/record/test_writer_backends.py), in the same
    on-disk contract.

    Between :meth:`hold` and the matching :meth:`release`, what is written is kept and written
    at the outermost release, all of it in one call per kind (a callback's batch end writes its
    interval this way: one compiled call instead of one eager op per value).

    Example:
        >>> import tempfile
        >>> from mpwatch import contract
        >>> w = RunWriter(tempfile.mkdtemp())
        >>> w.scalars(3, {contract.LOSS_SCALE: 1024.0, contract.STEP_SKIPPED: 0.0})
        >>> w.hold()
        >>> w.scalar_series(contract.TRAIN_LOSS, [1, 2, 3], [0.5, 0.4, 0.3])  # kept ...
        >>> w.release()  # ... and written here
        >>> w.flush()
    """

    def __init__(
        self, logdir: str, enabled: bool = True, use_tensorflow: bool | None = None
    ) -> None:
        self.logdir = str(logdir)
        self.enabled = enabled
        if use_tensorflow is None:
            from mpwatch.record.runtime import backend

            remote = "://" in self.logdir
            use_tensorflow = remote and backend.name() == backend.TENSORFLOW
        self.use_tensorflow = bool(use_tensorflow)
        self._writer = None
        self._lock = threading.Lock()  # the kept events and the holds
        self._io = threading.RLock()  # the file writer: opened, written and closed by one at a time
        self._holds = 0
        self._scalars: list[tuple[str, int, float]] = []
        self._records: list[tuple[str, int, bytes, str]] = []  # tag, step, blob, kind

    def _get(self):  # noqa: ANN202
        if self._writer is None:
            if self.use_tensorflow:
                import tensorflow as tf

                self._writer = tf.summary.create_file_writer(self.logdir)
            else:
                self._writer = _TensorBoardEvents(self.logdir)
        return self._writer

    # --- holding writes for one call -------------------------------------------------------------
    @property
    def held(self) -> bool:
        """Whether a :meth:`hold` is open (what is written now waits for its release)."""
        return self._holds > 0

    def hold(self) -> None:
        """Keep what is written until the matching :meth:`release` (holds nest)."""
        with self._lock:
            self._holds += 1

    def release(self) -> None:
        """End a hold; the outermost writes everything kept (raises what the write raises; what
        was kept is dropped then, never written twice)."""
        with self._lock:
            self._holds = max(0, self._holds - 1)
            outer = self._holds == 0
        if outer:
            self._write_pending()

    def _write_pending(self) -> None:
        if not (self._scalars or self._records):  # the common case: nothing kept
            return
        with self._io:
            with self._lock:
                scalars, self._scalars = self._scalars, []
                records, self._records = self._records, []
            if scalars or records:  # (only _add keeps events, and not when disabled)
                self._write(scalars, records)

    def _write(self, scalars: list[Any], records: list[Any]) -> None:
        if not self.use_tensorflow:
            import numpy as np
            from tensorboard.util import tensor_util

            events, meta = self._get(), _scalar_metadata()
            if scalars:
                events.add_scalars(scalars, meta)
            for tag, step, blob, kind in records:
                proto = tensor_util.make_tensor_proto(np.array(blob, dtype=object))
                events.add(tag, step, proto, _record_metadata(kind))
            return
        import tensorflow as tf

        writer = self._get()
        resource = getattr(writer, "_resource", None)
        if resource is None:  # a TensorFlow whose writer hides its resource: one op a value
            with writer.as_default():
                for tag, step, value in scalars:
                    tf.summary.scalar(tag, value, step=step)
                for tag, step, blob, kind in records:
                    tf.summary.write(tag, blob, step=step, metadata=_record_metadata(kind))
            return
        if scalars:
            tags, steps, values = zip(*scalars)
            _write_function("scalars")(
                resource,
                tf.constant(tags, tf.string),
                tf.constant(steps, tf.int64),
                tf.constant(values, tf.float32),
            )
        if records:
            tags, steps, blobs, kinds = zip(*records)
            metas = [_record_metadata(k).SerializeToString() for k in kinds]
            _write_function("records")(
                resource,
                tf.constant(tags, tf.string),
                tf.constant(steps, tf.int64),
                tf.constant(blobs, tf.string),
                tf.constant(metas, tf.string),
            )

    def _add(self, scalars: list[tuple[str, int, float]], records: list[Any]) -> None:
        if not self.enabled:
            return
        with self._lock:
            self._scalars.extend(scalars)
            self._records.extend(records)
            held = self._holds > 0
        if not held:
            self._write_pending()

    # --- what callbacks write ---------------------------------------------------------------
    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        """Write several scalars at one step (tags from :mod:`mpwatch.contract`)."""
        self._add([(tag, int(step), float(v)) for tag, v in values.items()], [])

    def scalar_series(self, tag: str, steps: list[int], values: list[float]) -> None:
        """Write one scalar at several steps (e.g. per-step values gathered over an interval)."""
        self._add([(tag, int(s), float(v)) for s, v in zip(steps, values)], [])

    def record(self, kind: str, step: int, payload: Mapping[str, Any]) -> int:
        """Write one structured record at ``step``; returns the compressed bytes written.

        A payload over ``contract.MAX_RECORD_BYTES`` compressed is written as several records of
        ``kind`` at ``step`` (:func:`split_payload`); one that cannot be split raises ValueError.
        """
        tag = contract.record_tag(kind)  # an unknown kind fails before anything is written
        try:
            records = split_payload(payload)
        except ValueError as e:
            raise ValueError(f"mpwatch {kind} record: {e}") from None
        self._add([], [(tag, int(step), blob, kind) for _, blob in records])
        return sum(len(blob) for _, blob in records)

    def flush(self) -> None:
        """Write what is kept (held or not) and flush the event file."""
        with self._io:
            self._write_pending()
            if self._writer is not None:
                self._writer.flush()

    def close(self) -> None:
        with self._io:
            try:
                self._write_pending()
            finally:
                if self._writer is not None:
                    self._writer.flush()
                    self._writer.close()
                    self._writer = None
