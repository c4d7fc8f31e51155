"""The event files of RunWriter's two implementations carry the same events.

On Keras' TensorFlow backend mpwatch writes through ``tf.summary``; on the JAX backend (where
TensorFlow may be absent) through TensorBoard's own ``EventFileWriter``. The reader, the tab and
any user's parser must not see a difference: the same scalars and records are written with both,
and each event is compared field by field (tag, step, summary metadata, tensor dtype, shape and
value), parsed with TensorBoard's loader.
"""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest

from mpwatch import contract
from mpwatch.record.runtime.writer import RunWriter


def _events(logdir):
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util import tensor_util

    (path,) = glob.glob(os.path.join(logdir, "events.out.tfevents.*"))
    out = []
    for event in EventFileLoader(path).Load():
        for v in event.summary.value:
            arr = tensor_util.make_ndarray(v.tensor)
            out.append(
                (
                    v.tag,
                    event.step,
                    v.metadata.SerializeToString(deterministic=True),
                    v.tensor.dtype,
                    list(v.tensor.tensor_shape.dim),
                    arr.item() if arr.dtype == object else float(arr),
                )
            )
    return out


def _write(logdir, use_tensorflow):
    w = RunWriter(logdir, use_tensorflow=use_tensorflow)
    w.scalars(1, {contract.LOSS_SCALE: 32768.0, contract.STEP_SKIPPED: 1.0})
    w.scalar_series(contract.TRAIN_LOSS, [1, 2, 3, 4, 5], [0.5, 0.25, np.nan, 1e-30, 3.0])
    w.scalar_series(contract.LOSS_SCALE, [2, 3], [16384.0, 16384.0])
    w.record(contract.KIND_NOTICE, 3, {"part": "probe", "level": "info", "message": "é ok"})
    rows = [[f"layer_{i}/kernel", "layer", i] for i in range(3)]
    w.record(contract.KIND_GRAD_VARIABLES, 4, {"loss_scale": 2.0, "variables": contract.table(
        ["variable", "layer", "size"], rows)})  # fmt: skip
    w.close()
    return _events(logdir)


def test_tensorboard_writer_writes_what_tf_summary_writes(tmp_path):
    pytest.importorskip("tensorflow")
    with_tf = _write(str(tmp_path / "tf"), use_tensorflow=True)
    with_tb = _write(str(tmp_path / "tb"), use_tensorflow=False)
    assert len(with_tf) == 2 + 5 + 2 + 1 + 1
    assert [e[:5] for e in with_tb] == [e[:5] for e in with_tf]
    for a, b in zip(with_tb, with_tf):
        if isinstance(a[5], float):
            assert a[5] == b[5] or (np.isnan(a[5]) and np.isnan(b[5]))
        else:
            assert a[5] == b[5]


def test_mpwatch_reads_both_the_same(tmp_path, read_events):
    import mpwatch

    _write(str(tmp_path / "tb"), use_tensorflow=False)
    scalars, records = read_events(str(tmp_path / "tb"))
    assert scalars[contract.TRAIN_LOSS][0] == (1, 0.5)
    assert records["notice"] == [(3, {"part": "probe", "level": "info", "message": "é ok"})]
    run = mpwatch.load_run(str(tmp_path / "tb"))
    scale = run.scalar(contract.LOSS_SCALE)
    assert scale.index.tolist() == [1, 2, 3] and scale.tolist() == [32768.0, 16384.0, 16384.0]
    assert run.grad_variables["variable"].tolist() == [f"layer_{i}/kernel" for i in range(3)]


def test_series_of_later_writers_reuse_one_trace(tmp_path):
    """Each fit opens (and closes) a writer: the compiled series writer takes the writer as an
    argument, so the second and third writers' series are written without a new trace, each into
    its own directory, with the values given."""
    pytest.importorskip("tensorflow")
    from mpwatch.record.runtime import writer as writer_module

    for i in range(3):
        w = RunWriter(str(tmp_path / f"fit{i}"), use_tensorflow=True)
        w.scalar_series(contract.TRAIN_LOSS, [10 * i + s for s in range(6)], [i + 0.5] * 6)
        w.close()
        if i == 0:
            traces = writer_module._write_function("scalars").experimental_get_tracing_count()
        got = [(e[0], e[1], e[5]) for e in _events(str(tmp_path / f"fit{i}"))]
        assert got == [(contract.TRAIN_LOSS, 10 * i + s, i + 0.5) for s in range(6)]
    assert writer_module._write_function("scalars").experimental_get_tracing_count() == traces


def test_every_record_of_the_tensorboard_writer_is_framed_as_tensorboard_frames_it(tmp_path):
    """The JAX path frames records with mpwatch's crc (C when installed): each record's length
    and data checksums equal TensorBoard's own pure-Python masked crc32c, record by record, and
    the file holds exactly the events written (the file-version event, then one per value)."""
    import struct

    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    events = _write(str(tmp_path / "tb"), use_tensorflow=False)
    (path,) = glob.glob(os.path.join(tmp_path / "tb", "events.out.tfevents.*"))
    buf = open(path, "rb").read()
    i, n = 0, 0
    while i < len(buf):
        (length,) = struct.unpack_from("<Q", buf, i)
        (head_crc,) = struct.unpack_from("<I", buf, i + 8)
        data = buf[i + 12 : i + 12 + length]
        (data_crc,) = struct.unpack_from("<I", buf, i + 12 + length)
        assert head_crc == masked_crc32c(buf[i : i + 8])
        assert data_crc == masked_crc32c(data)
        i, n = i + 16 + length, n + 1
    assert i == len(buf)
    assert n == 1 + len(events)


def test_wire_crc_equals_tensorboards_on_any_bytes():
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    from mpwatch import wire

    rng = np.random.default_rng(0)
    for size in (0, 1, 7, 8, 64, 1000):
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        assert wire.masked_crc32c(data) == masked_crc32c(data)


def test_scalar_events_are_the_bytes_protobuf_serializes():
    """mpwatch serializes a scalar's event itself (``_ScalarEvents``): byte for byte what
    TensorBoard's message classes serialize for the Event tf.summary.scalar makes (its value as
    tensor_content; step 0 left out as proto3 does, negative and 64-bit steps, float32
    rounding, overflow to inf, NaN, non-ASCII tags)."""
    import time
    import warnings

    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2
    from tensorboard.plugins.scalar import metadata as scalar_metadata

    from mpwatch.record.runtime.writer import _ScalarEvents

    meta = scalar_metadata.create_summary_metadata(display_name=None, description=None)
    enc = _ScalarEvents(meta.SerializeToString())
    values = [0.0, -0.0, 1.5, 1 / 3, 65504.0, 1e-8, 1e-45, float("inf"), -float("inf"), 3.4e38,
              1e40, -1e40, np.float64(2.5), np.float32(0.1), 7, float("nan")]  # fmt: skip
    for tag in ("mpwatch/loss_scale", "x" * 300, "é/ü"):
        for step in (0, 1, 127, 128, 300, 2**40, -1):
            for value in values:
                now = time.time()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # numpy's overflow warning for 1e40
                    f32 = float(np.float32(value))
                    mine = enc.encode(tag, step, value, now)
                content = np.float32(f32).tobytes()
                tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, tensor_content=content)
                tensor.tensor_shape.SetInParent()
                summary = summary_pb2.Summary(
                    value=[summary_pb2.Summary.Value(tag=tag, tensor=tensor, metadata=meta)]
                )
                event = event_pb2.Event(wall_time=now, step=step, summary=summary)
                assert mine == event.SerializeToString(), (tag, step, value)


def test_many_records_are_framed_as_tensorboard_frames_each_without_a_c_crc(monkeypatch):
    """Without google_crc32c the crcs of a write are computed together, by length (numpy):
    each equals TensorBoard's own masked crc32c."""
    import struct

    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    from mpwatch import wire

    monkeypatch.setattr(wire, "_C_CRC", False)
    rng = np.random.default_rng(1)
    datas = [rng.integers(0, 256, int(n), dtype=np.uint8).tobytes()
             for n in rng.choice([0, 3, 80, 81, 200], 120)]  # fmt: skip
    assert wire.masked_crc32c_many(datas) == [masked_crc32c(d) for d in datas]
    buf, i = wire.frame_records(datas), 0
    for d in datas:
        assert struct.unpack_from("<Q", buf, i)[0] == len(d)
        assert struct.unpack_from("<I", buf, i + 8)[0] == masked_crc32c(buf[i : i + 8])
        assert buf[i + 12 : i + 12 + len(d)] == d
        assert struct.unpack_from("<I", buf, i + 12 + len(d))[0] == masked_crc32c(d)
        i += 16 + len(d)
    assert i == len(buf)


def test_a_local_logdir_is_written_by_mpwatchs_own_file_writer_on_every_backend(tmp_path):
    """On Keras' TensorFlow backend too, a local logdir takes the plain-file writer (its events
    are tf.summary's, above); only a remote one (``gs://``...) goes through ``tf.summary``."""
    import keras

    local = RunWriter(str(tmp_path))
    assert local.use_tensorflow is False
    remote = RunWriter("gs://bucket/run")  # nothing is opened before the first write
    assert remote.use_tensorflow is (keras.backend.backend() == "tensorflow")
