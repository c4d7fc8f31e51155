"""mpwatch.read.run: event files -> Run, checked against what the contract's writer wrote."""

from __future__ import annotations

import math
import os
import struct

import numpy as np
import pandas as pd
import pytest
from builders import (
    event_files,
    write_float32_run,
    write_mixed_run,
    write_plain_scalars,
)
from repo_scripts import load_script

from mpwatch import contract
from mpwatch import read as reader
from mpwatch.record.runtime.writer import RunWriter


@pytest.fixture(scope="module")
def mixed_logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixed")
    truth = write_mixed_run(str(root))
    return str(root), truth


def test_scalars_match_what_was_written(mixed_logdir):
    path, truth = mixed_logdir
    run = reader.load_run(path)
    assert run.name == "." and run.has_data and run.warnings == []
    sc = run.scalars
    assert sc.index.name == "step" and sc.index.dtype == np.int64
    assert sc.index.is_monotonic_increasing
    steps = np.arange(1, truth["steps"] + 1)
    np.testing.assert_array_equal(run.scalar(contract.LOSS_SCALE).index, steps)
    np.testing.assert_array_equal(
        run.scalar(contract.LOSS_SCALE).to_numpy(), truth["scale"].astype(np.float32)
    )
    np.testing.assert_array_equal(run.scalar(contract.STEP_SKIPPED).to_numpy(), truth["skipped"])
    loss = run.scalar(contract.TRAIN_LOSS)
    assert list(loss.index) == sorted(truth["loss"])
    np.testing.assert_allclose(loss.to_numpy(), [truth["loss"][s] for s in loss.index], rtol=1e-6)
    # absent values are NaN, not 0
    assert math.isnan(sc.loc[1, contract.TRAIN_LOSS])


def test_records_become_tables(mixed_logdir):
    path, truth = mixed_logdir
    run = reader.load_run(path)
    assert run.info["policy"] == "mixed_float16" and run.info["batch_size"] == 30
    assert list(run.layers["name"]) == ["conv2d", "dense", "layer_norm", "predictions"]
    assert run.layers.loc[3, "is_output"] == True  # noqa: E712
    assert run.layers.loc[0, "tc_dims"] == {"filters": 30, "input_channels": 3}
    assert len(run.layer_history) == 1 and run.layer_history[0][0] == 1
    # probes: one row per probe step x layer
    steps = truth["steps"]
    assert sorted(set(run.probe_layers["step"])) == [steps // 2, steps]
    assert len(run.probe_layers) == 8 and "output_rel_error" in run.probe_layers
    assert len(run.probe_variables) == 4
    pm = run.probe_model
    assert list(pm["step"]) == [steps // 2, steps]
    assert pm["loss_scale"].tolist() == [1024.0, 1024.0]
    assert pm["recommended_scale"].tolist() == [131072.0, 131072.0]
    assert set(pm["mode"]) == {"float16"} and set(pm["reference"]) == {"float32_twin"}
    assert pm["underflow_fraction"].iloc[0] == pytest.approx(328 / 5500)
    assert set(run.histograms) == {steps // 2, steps}
    assert run.histograms[steps]["zeros"] == 4
    assert len(run.sweeps) == 50 and list(run.sweeps.columns)[0] == "step"
    assert run.profile["cast_share"] == 0.2
    assert run.notices == [{"step": 3, "part": "memory", "level": "info", "message": "CPU RSS"}]
    gv = run.grad_variables
    assert list(gv["step"]) == [steps] and gv["variable"].tolist() == ["dense/kernel"]


def test_fast_path_equals_protobuf_path(mixed_logdir, monkeypatch):
    from mpwatch.read import tfrecord

    path, _ = mixed_logdir
    fast = reader.load_run(path)
    lengths = reader.load_run(path, verify="lengths")  # data crcs of structured records only
    monkeypatch.setattr(tfrecord, "_FAST_MAX_LEN", 0)  # every record through event_pb2
    slow = reader.load_run(path)
    for other in (lengths, slow):
        pd.testing.assert_frame_equal(fast.scalars, other.scalars)
        pd.testing.assert_frame_equal(fast.probe_layers, other.probe_layers)


def test_truncated_last_record_is_skipped_with_a_warning(tmp_path):
    w = RunWriter(str(tmp_path))
    w.scalar_series(contract.LOSS_SCALE, list(range(1, 11)), [float(i) for i in range(1, 11)])
    w.close()
    (f,) = event_files(str(tmp_path))
    size = os.path.getsize(f)
    with open(f, "r+b") as fh:
        fh.truncate(size - 7)  # cut into the last record (step 10)
    with pytest.warns(UserWarning, match="truncated"):
        run = reader.load_run(str(tmp_path))
    assert list(run.scalar(contract.LOSS_SCALE).index) == list(range(1, 10))
    assert len(run.warnings) == 1 and "truncated at byte" in run.warnings[0]
    assert os.path.basename(f) in run.warnings[0]
    # a cut inside the 12-byte header too
    with open(f, "r+b") as fh:
        data = fh.read()
    off = 0
    ends = []
    while off + 12 <= len(data):
        (n,) = struct.unpack_from("<Q", data, off)
        if off + 16 + n > len(data):
            break
        off += 16 + n
        ends.append(off)
    with open(f, "wb") as fh:
        fh.write(data[: ends[-1] + 5])
    run = reader.load_run(str(tmp_path), warn=False)
    assert len(run.scalar(contract.LOSS_SCALE)) == 9
    assert "truncated" in run.warnings[0]


def test_corrupt_length_crc_stops_the_file(tmp_path):
    w = RunWriter(str(tmp_path))
    w.scalar_series(contract.LOSS_SCALE, list(range(1, 6)), [1.0] * 5)
    w.close()
    (f,) = event_files(str(tmp_path))
    data = bytearray(open(f, "rb").read())
    # find the 4th record and corrupt its length crc
    off = 0
    for _ in range(3):
        (n,) = struct.unpack_from("<Q", data, off)
        off += 16 + n
    data[off + 8] ^= 0xFF
    open(f, "wb").write(bytes(data))
    run = reader.load_run(str(tmp_path), warn=False)
    # records: file_version, steps 1, 2 then the corrupt one
    assert list(run.scalar(contract.LOSS_SCALE).index) == [1, 2]
    assert "crc" in run.warnings[0]


def test_data_crc_checked_with_verify_all(tmp_path):
    w = RunWriter(str(tmp_path))
    w.scalar_series(contract.LOSS_SCALE, [1, 2, 3], [1.0, 2.0, 3.0])
    w.close()
    (f,) = event_files(str(tmp_path))
    data = bytearray(open(f, "rb").read())
    data[-10] ^= 0x01  # inside the last record's value
    open(f, "wb").write(bytes(data))
    run = reader.load_run(str(tmp_path), verify="all", warn=False)
    assert list(run.scalar(contract.LOSS_SCALE).index) == [1, 2]
    assert "crc mismatch" in run.warnings[0]


def test_empty_logdir(tmp_path):
    run = reader.load_run(str(tmp_path))
    assert not run.has_data and run.scalars.empty and run.layers.empty and run.info == {}
    assert reader.load_runs(str(tmp_path)) == {}


def test_missing_logdir_raises(tmp_path):
    with pytest.raises(reader.ReadError, match="does not exist"):
        reader.load_run(str(tmp_path / "nope"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(reader.ReadError, match="not a directory"):
        reader.load_runs(str(tmp_path / "file"))


def test_several_runs(tmp_path):
    write_mixed_run(str(tmp_path / "mixed"), steps=40)
    write_float32_run(str(tmp_path / "sub" / "fp32"), steps=40)
    write_plain_scalars(str(tmp_path))
    runs = reader.load_runs(str(tmp_path))
    assert list(runs) == [".", "mixed", "sub/fp32"]
    assert [r.has_data for r in runs.values()] == [False, True, True]
    assert runs["sub/fp32"].info["policy"] == "float32"
    assert runs["."].scalar("epoch_loss").tolist() == pytest.approx([1.0, 0.5, 1 / 3])
    assert reader.load_run(str(tmp_path), "sub/fp32").info["policy"] == "float32"
    # the root holds event files: it is the default run
    assert reader.load_run(str(tmp_path)).name == "."
    with pytest.raises(reader.ReadError, match="no run"):
        reader.load_run(str(tmp_path), "nothere")


def test_only_run_with_data_is_chosen(tmp_path):
    write_mixed_run(str(tmp_path / "a"), steps=20)
    write_plain_scalars(str(tmp_path / "b"))
    assert reader.load_run(str(tmp_path)).name == "a"
    write_mixed_run(str(tmp_path / "c"), steps=20)
    with pytest.raises(ValueError, match="3 runs"):
        reader.load_run(str(tmp_path))


def test_restart_later_writes_win(tmp_path):
    w = RunWriter(str(tmp_path))
    w.scalar_series(contract.LOSS_SCALE, list(range(1, 11)), [1.0] * 10)
    w.record(contract.KIND_PROBE, 8, {"mode": "float16", "loss_scale": 1.0})
    w.close()
    # resumed from a checkpoint at step 5, by a new writer (a new event file)
    import time

    time.sleep(1.1)  # event file names carry a timestamp in seconds
    w = RunWriter(str(tmp_path))
    w.scalar_series(contract.LOSS_SCALE, list(range(5, 8)), [2.0] * 3)
    w.record(contract.KIND_PROBE, 6, {"mode": "float16", "loss_scale": 2.0})
    w.close()
    run = reader.load_run(str(tmp_path))
    ls = run.scalar(contract.LOSS_SCALE)
    assert list(ls.index) == [1, 2, 3, 4, 5, 6, 7]
    assert ls.tolist() == [1.0] * 4 + [2.0] * 3
    assert run.probe_model["step"].tolist() == [6]
    assert run.probe_model["loss_scale"].tolist() == [2.0]


def test_steps_of_every_varint_width_and_nonfinite_values(tmp_path):
    steps = [0, 1, 127, 128, 16383, 16384, 2**21, 2**28, 2**35, 2**42]
    vals = [float("nan"), float("inf"), -float("inf"), 1e-8, 65504.0, -3.5, 0.0, 1.0, 2.0, 3.0]
    w = RunWriter(str(tmp_path))
    for _ in range(3):  # enough of each layout for the vectorized path
        w.scalar_series("mpwatch/x", steps, vals)
    w.close()
    run = reader.load_run(str(tmp_path))
    s = run.scalar("mpwatch/x")
    # NaN is dropped by scalar(); check the frame itself
    col = run.scalars["mpwatch/x"]
    assert list(col.index) == steps
    np.testing.assert_array_equal(col.to_numpy(), np.asarray(vals, dtype=np.float32))
    assert len(s) == len(steps) - 1


def test_split_probe_parts_are_joined(tmp_path):
    w = RunWriter(str(tmp_path))
    cols = ["variable", "layer", "size", "ref_nonzero", "underflow_count", "underflow_fraction",
            "grad_rel_error"]  # fmt: skip
    head = {"mode": "float16", "loss_scale": 8.0, "parts": 3,
            "variables": contract.table(cols, []), "model": {"underflow_fraction": 0.5},
            "layers": contract.table(["layer", "underflow_fraction"], [["a", 0.5]])}  # fmt: skip
    w.record(contract.KIND_PROBE, 4, head)
    for i in (1, 2):
        rows = [[f"v{i}", "a", 1, 1, 0, 0.0, 0.0]]
        w.record(contract.KIND_PROBE, 4, {"mode": "float16", "part": i, "parts": 3,
                                         "variables": contract.table(cols, rows)})  # fmt: skip
    w.close()
    run = reader.load_run(str(tmp_path))
    assert run.probe_variables["variable"].tolist() == ["v1", "v2"]
    assert run.probe_layers["layer"].tolist() == ["a"]
    assert run.probe_model["underflow_fraction"].tolist() == [0.5]


def test_plain_keras_tensorboard_logdir_has_no_mpwatch_data(tmp_path):
    keras = pytest.importorskip("keras")
    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    model.fit(x, y, epochs=2, verbose=0, validation_split=0.25,
              callbacks=[keras.callbacks.TensorBoard(str(tmp_path))])  # fmt: skip
    runs = reader.load_runs(str(tmp_path))
    assert {"train", "validation"} <= set(runs)
    assert not any(r.has_data for r in runs.values())
    assert len(runs["train"].scalar("epoch_loss")) == 2


def test_benchmark_events_are_what_tf_writes(tmp_path):
    """The benchmark writes events directly: they must be the bytes tf.summary.scalar writes."""
    bench = load_script("benchmarks/reader.py")

    w = RunWriter(str(tmp_path))
    w.scalars(300, {contract.LOSS_SCALE: 3.0})
    w.close()
    (f,) = event_files(str(tmp_path))
    tf_bytes = open(f, "rb").read()
    ((_, mat),) = bench.scalar_events(contract.LOSS_SCALE, np.array([300]), np.array([3.0]), 0.0)
    ours = mat[0].tobytes()
    # same length, identical except the wall time (bytes 13..21 of the framed record)
    i = tf_bytes.find(ours[:12])
    assert i >= 0
    theirs = tf_bytes[i : i + len(ours)]
    assert theirs[:13] == ours[:13] and theirs[21:-4] == ours[21:-4]


def test_run_from_records_matches_load_run(mixed_logdir):
    path, _ = mixed_logdir
    run = reader.load_run(path)
    scalars = {t: (run.scalar(t).index.tolist(), run.scalar(t).tolist()) for t in run.scalars}
    again = reader.run_from_records(".", scalars=scalars, records=run.records)
    pd.testing.assert_frame_equal(again.scalars, run.scalars)
    pd.testing.assert_frame_equal(again.probe_layers, run.probe_layers)
    pd.testing.assert_frame_equal(again.layers, run.layers)
    assert again.info == run.info and again.profile == run.profile
