"""Profiler capture and conversion on a real trace of a real short ``fit`` of a tiny model (CPU).

One fit per module (module-scoped fixture): a functional mixed_float16 model with a nested
Sequential, a LayerNormalization (float32 inside) and a float32 output layer, created after a decoy
model so that Keras layer names carry suffixes (``dense_2``...) and TensorFlow's graph scopes add
their own (``dense_2_1``, ``dense_1_2``). Ground truth comes from the op table (xprof's converter
output) summed independently with pandas, and from the model's own layer list.
"""

from __future__ import annotations

import glob
import gzip
import json
import logging
import os
import socket
import urllib.error
import urllib.request

import numpy as np
import pytest
from tensorboard_process import running_tensorboard

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
pytest.importorskip("xprof.convert.raw_to_tool_data")

from mpwatch import contract, profile  # noqa: E402
from mpwatch.record.callbacks.monitor import MixedPrecisionMonitor  # noqa: E402
from mpwatch.record.callbacks.profile_capture import ProfileMonitor, parse_steps  # noqa: E402

BATCHES = 8
STEPS = (3, 5)


def _records(logdir: str) -> list[tuple[str, int, dict]]:
    """(kind, step, payload) of every mpwatch record in a logdir, read straight from event files."""
    out = []
    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                kind = contract.kind_of_tag(value.tag)
                if kind is None:
                    continue
                blob = tf.make_ndarray(value.tensor).item()
                out.append((kind, int(event.step), contract.decode_payload(blob)))
    return out


def _scalar_steps(logdir: str, tag: str) -> list[int]:
    steps = []
    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            steps += [int(event.step) for v in event.summary.value if v.tag == tag]
    return sorted(steps)


def _frame(tbl: dict):
    import pandas as pd

    return pd.DataFrame(tbl["data"], columns=tbl["columns"])


def _build_model():
    old = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])  # decoy: takes "dense"
        inner = keras.Sequential(
            [keras.layers.Dense(8, activation="relu"), keras.layers.Dense(8)], name="inner"
        )
        inp = keras.Input((16,))
        h = keras.layers.Dense(32, activation="relu")(inp)
        h = keras.layers.LayerNormalization()(h)
        h = inner(h)
        h = keras.layers.Dense(16)(h)
        h = keras.layers.Dropout(0.1)(h)
        out = keras.layers.Dense(4, dtype="float32")(h)
        model = keras.Model(inp, out, name="net")
    finally:
        keras.mixed_precision.set_global_policy(old)
    model.compile(optimizer="adam", loss="mse")
    return model


def _data(n: int = BATCHES * 16):
    rng = np.random.default_rng(0)
    return rng.random((n, 16), dtype=np.float32), rng.random((n, 4), dtype=np.float32)


def _leaves(model) -> list:
    out = []

    def visit(layer, prefix):
        for child in layer._flatten_layers(include_self=False, recursive=False):
            path = f"{prefix}/{child.name}"
            kids = list(child._flatten_layers(include_self=False, recursive=False))
            if kids:
                visit(child, path)
            else:
                out.append((path, child))

    visit(model, model.name)
    return out


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    logdir = str(tmp_path_factory.mktemp("profile_run"))
    model = _build_model()
    x, y = _data()
    cb = ProfileMonitor(logdir, profile_steps=STEPS)
    # next to mpwatch's other recording (the gradient tap, a shared writer), as a user would run it
    monitor = MixedPrecisionMonitor(logdir, log_every=4, profile=False)  # profiled below
    history = model.fit(x, y, batch_size=16, epochs=2, callbacks=[monitor, cb], verbose=0)
    # what the run directory held right after the fit (before any TensorBoard touched it)
    listing = sorted(os.listdir(cb.trace_dir)) if cb.trace_dir else []
    return {
        "logdir": logdir,
        "model": model,
        "cb": cb,
        "history": history,
        "listing": listing,
        "records": _records(logdir),
    }


@pytest.fixture(scope="module")
def ops(fitted):
    return profile.op_table(fitted["cb"].trace_dir)


@pytest.fixture(scope="module")
def payload(fitted):
    prof = [p for kind, _, p in fitted["records"] if kind == contract.KIND_PROFILE]
    assert len(prof) == 1, fitted["records"]
    return prof[0]


# --- capture --------------------------------------------------------------------------------------
def test_trace_where_the_profile_tab_looks(fitted):
    cb = fitted["cb"]
    assert cb.error is None
    assert len(fitted["history"].history["loss"]) == 2
    run_dirs = glob.glob(os.path.join(fitted["logdir"], "plugins", "profile", "*"))
    assert run_dirs == [cb.trace_dir]
    host = socket.gethostname()
    assert fitted["listing"] == [f"{host}.xplane.pb"] or all(
        f.endswith(".xplane.pb") for f in fitted["listing"]
    )
    # the conversion ran on a copy: no converter cache files beside the original trace
    assert not [f for f in fitted["listing"] if not f.endswith(".xplane.pb")]


def test_record_follows_the_schema(fitted, payload):
    notices = [p for k, _, p in fitted["records"] if k == contract.KIND_NOTICE]
    assert not [n for n in notices if n.get("part") == "profile"], notices
    step = [s for k, s, _ in fitted["records"] if k == contract.KIND_PROFILE][0]
    # written at mpwatch's batch step of the last captured batch (fresh model: batch step == batch),
    # the same steps the other mpwatch records use (the loss scale is written at every batch step)
    assert payload["steps"] == list(STEPS)
    assert step == STEPS[1]
    loss_scale_steps = _scalar_steps(fitted["logdir"], contract.LOSS_SCALE)
    assert loss_scale_steps[: BATCHES + 1] == list(range(0, BATCHES + 1))  # 0: before the first
    for key in (
        "steps",
        "device",
        "total_us",
        "unattributed_us",
        "cast_us",
        "cast_share",
        "share_16bit",
        "layers",
        "op_types",
        "trace_dir",
    ):
        assert key in payload
    assert payload["device"] == "CPU"
    assert payload["trace_dir"] == fitted["cb"].trace_dir
    layers = _frame(payload["layers"])
    assert list(layers.columns[:6]) == [
        "layer",
        "time_us",
        "time_16bit_us",
        "time_32bit_us",
        "ops",
        "share",
    ]
    op_types = _frame(payload["op_types"])
    assert list(op_types.columns[:5]) == [
        "op_type",
        "time_us",
        "bits",
        "count",
        "kept_float32_by_amp",
    ]


# --- the join, against ground truth ---------------------------------------------------------------
def test_every_layer_with_trainable_weights_gets_time(fitted, payload):
    layers = _frame(payload["layers"]).set_index("path")
    weighted = [path for path, layer in _leaves(fitted["model"]) if layer.trainable_weights]
    assert len(weighted) == 6  # 3 Dense + LayerNormalization + the 2 Dense inside "inner"
    for path in weighted:
        assert path in layers.index, (path, list(layers.index))
        assert layers.loc[path, "time_us"] > 0, path
        assert layers.loc[path, "ops"] > 0, path


def test_layer_keys_join_the_layers_record(fitted, payload):
    """``layer`` is the name and ``path`` the path that mpwatch's layers record uses."""
    from mpwatch.record.callbacks.layer_dtypes import walk

    layers = _frame(payload["layers"])
    record_paths = {path: layer.name for layer, path, _ in walk(fitted["model"])}
    for name, path in zip(layers["layer"], layers["path"]):
        assert record_paths.get(path) == name, (name, path)


def test_layer_time_plus_unattributed_is_the_op_table_total(ops, payload):
    total = float(ops["self_time_us"].sum())  # independent: the converter's table, summed
    layers = _frame(payload["layers"])
    assert payload["total_us"] == pytest.approx(total, rel=1e-9)
    assert layers["time_us"].sum() + payload["unattributed_us"] == pytest.approx(total, rel=1e-9)
    assert (layers["time_16bit_us"] + layers["time_32bit_us"]).to_numpy() == pytest.approx(
        layers["time_us"].to_numpy()
    )
    assert layers["share"].to_numpy() == pytest.approx((layers["time_us"] / total).to_numpy())
    assert 0 < payload["unattributed_us"] < total


def test_cast_share_against_the_op_table(ops, payload):
    cast = float(ops.loc[ops["op_type"] == "Cast", "self_time_us"].sum())
    assert cast > 0  # mixed_float16 casts float32 variables and inputs
    assert payload["cast_us"] == pytest.approx(cast)
    assert payload["cast_share"] == pytest.approx(cast / float(ops["self_time_us"].sum()))
    op_types = _frame(payload["op_types"])
    assert op_types.loc[op_types.op_type == "Cast", "time_us"].sum() == pytest.approx(cast)


def test_precision_split_follows_the_layer_dtypes(fitted, payload, ops):
    layers = _frame(payload["layers"]).set_index("path")
    by_class = {path: layer for path, layer in _leaves(fitted["model"])}
    for path, layer in by_class.items():
        if path not in layers.index:
            continue
        row = layers.loc[path]
        if layer.compute_dtype == "float32" or type(layer).__name__ == "LayerNormalization":
            assert row["time_16bit_us"] == 0, path  # float32 layer / float32 inside
        elif layer.trainable_weights:
            assert row["time_16bit_us"] > 0, path  # float16 Dense: MatMul etc. in 16-bit
    # the 16-bit share: 16-bit time of the layers over the total, independently from the op rows
    t16 = layers["time_16bit_us"].sum()
    assert payload["share_16bit"] == pytest.approx(t16 / float(ops["self_time_us"].sum()))
    assert 0 < payload["share_16bit"] < 1


def test_amp_float32_op_types_are_flagged(payload):
    op_types = _frame(payload["op_types"])
    flagged = set(op_types.loc[op_types.kept_float32_by_amp.astype(bool), "op_type"])
    assert flagged <= profile.AMP_FLOAT32_OPS
    assert "Mean" in flagged  # the mse loss reduces with Mean
    assert not op_types.loc[op_types.op_type == "MatMul", "kept_float32_by_amp"].any()
    assert set(op_types["bits"]) <= {16, 32}


def test_scope_suffixes_in_the_real_trace(fitted, ops):
    """The graph's scopes carry TensorFlow's suffixes; the join undoes them."""
    names = set(ops["op_name"])
    scopes = {n.split("/")[2] for n in names if n.startswith("StatefulPartitionedCall/net")}
    layer_names = {layer.name for _, layer in _leaves(fitted["model"])}
    # at least one scope is not a layer name as is (TensorFlow made it unique)
    assert scopes - layer_names - {"Cast", "Cast_1"}


# --- name scope suffixes, unit --------------------------------------------------------------------
def test_scope_candidates():
    names = ["dense", "dense_1", "dense_2", "dense_10", "conv2d"]
    assert profile.scope_candidates("dense_1_2", names) == ["dense_1"]
    assert profile.scope_candidates("dense_1", names) == ["dense", "dense_1"]
    assert profile.scope_candidates("dense_10", names) == ["dense", "dense_10"]
    assert profile.scope_candidates("dense_x", names) == []
    assert profile.scope_candidates("densely", names) == []
    assert profile.scope_candidates("conv2d_3", names) == ["conv2d"]


def test_match_scopes_resolves_suffixes():
    layers = ["dense", "dense_1", "dense_2"]
    # every scope made unique once (what a Keras train function shows)
    assert profile.match_scopes(["dense_1", "dense_1_2", "dense_2_1"], layers) == {
        "dense_1": "dense",
        "dense_1_2": "dense_1",
        "dense_2_1": "dense_2",
    }
    # no suffixes at all
    assert profile.match_scopes(["dense", "dense_1", "dense_2"], layers) == {
        "dense": "dense",
        "dense_1": "dense_1",
        "dense_2": "dense_2",
    }
    # a tie ("dense_1" alone is layer dense_1 or dense made unique) follows the siblings' pattern
    assert profile.match_scopes(["dense_1", "dense_2_1"], layers)["dense_1"] == "dense"
    assert profile.match_scopes(["dense_1", "dense_2"], layers)["dense_1"] == "dense_1"
    # unknown scopes are left out
    assert profile.match_scopes(["Cast", "dense_1_2"], layers) == {"dense_1_2": "dense_1"}


def test_attribute_ops_nested_and_suffixed():
    li = profile.LayerInfo
    inner = li("inner", "net/inner", "Sequential", "float16", 0)
    inner.children = [
        li("dense", "net/inner/dense", "Dense", "float16", 10),
        li("dense_1", "net/inner/dense_1", "Dense", "float16", 10),
    ]
    root = li("net", "net", "Functional", "float16")
    root.children = [
        li("dense_1", "net/dense_1", "Dense", "float16", 10),  # same name as an inner layer
        inner,
        li("dense_2", "net/dense_2", "Dense", "float32", 10),
    ]
    names = [
        "StatefulPartitionedCall/net_1/dense_1_1/MatMul",
        "StatefulPartitionedCall/gradient_tape/net_1/dense_1_1/MatMul/MatMul_1",
        "StatefulPartitionedCall/net_1/inner_1/dense_1/MatMul",
        "StatefulPartitionedCall/net_1/inner_1/dense_1_2/BiasAdd",
        "StatefulPartitionedCall/net_1/inner_1/Cast",
        "StatefulPartitionedCall/net_1/dense_2_1/BiasAdd",
        "StatefulPartitionedCall/net_1/Cast",
        "StatefulPartitionedCall/compile_loss/mse/Mean",
        "Iterator::Root::Prefetch",
    ]
    got = {
        n: (v.path if v is not None else None)
        for n, v in profile.attribute_ops(names, root).items()
    }
    assert got == {
        names[0]: "net/dense_1",
        names[1]: "net/dense_1",
        names[2]: "net/inner/dense",
        names[3]: "net/inner/dense_1",
        names[4]: "net/inner",  # the nested model's own op
        names[5]: "net/dense_2",
        names[6]: None,  # the root model's input cast: unattributed
        names[7]: None,
        names[8]: None,
    }


def test_shared_names_fall_back_to_paths():
    import pandas as pd

    li = profile.LayerInfo
    a, b = li("a", "m/a", "Sequential", "float16"), li("b", "m/b", "Sequential", "float16")
    a.children = [li("fc", "m/a/fc", "Dense", "float16", 4)]
    b.children = [li("fc", "m/b/fc", "Dense", "float16", 4)]
    root = li("m", "m", "Functional", "float16")
    root.children = [a, b, li("head", "m/head", "Dense", "float32", 2)]
    ops = pd.DataFrame(
        {
            "host_or_device": "Host",
            "op_type": ["MatMul", "MatMul", "MatMul"],
            "op_name": ["m_1/a_1/fc_1/MatMul", "m_1/b_1/fc_1/MatMul", "m_1/head_1/MatMul"],
            "occurrences": 1,
            "total_time_us": [1.0, 2.0, 4.0],
            "self_time_us": [1.0, 2.0, 4.0],
            "execution_mode": "Function",
        }
    )
    t = profile.layer_time(ops, root).layers.set_index("layer")
    assert t.loc["m/a/fc", "time_us"] == 1.0 and t.loc["m/b/fc", "time_us"] == 2.0
    assert t.loc["head", "time_us"] == 4.0  # unique names stay names


def test_layer_time_on_a_constructed_table():
    import pandas as pd

    li = profile.LayerInfo
    root = li("m", "m", "Sequential", "float16")
    root.children = [
        li("dense", "m/dense", "Dense", "bfloat16", 10),
        li("layer_normalization", "m/layer_normalization", "LayerNormalization", "float16", 4),
        li("dense_1", "m/dense_1", "Dense", "float32", 10),
        li("unused", "m/unused", "Dense", "float16", 3),
    ]
    rows = [
        ("MatMul", "m_1/dense_1/MatMul", 10.0),
        ("Cast", "m_1/dense_1/Cast/Cast", 2.0),
        ("ReadVariableOp", "m_1/dense_1/Cast/Cast/ReadVariableOp", 1.0),
        ("Mean", "m_1/layer_normalization_1/moments/mean", 3.0),
        ("MatMul", "m_1/dense_1_2/MatMul", 5.0),
        ("Sum", "compile_loss/mse/Sum", 4.0),
    ]
    ops = pd.DataFrame(
        {
            "host_or_device": "Host",
            "op_type": [r[0] for r in rows],
            "op_name": [r[1] for r in rows],
            "occurrences": 3,
            "total_time_us": [r[2] for r in rows],
            "self_time_us": [r[2] for r in rows],
            "execution_mode": "Function",
        }
    )
    res = profile.layer_time(ops, root)
    t = res.layers.set_index("path")
    assert t.loc["m/dense", ["time_us", "time_16bit_us", "time_32bit_us", "cast_us"]].tolist() == [
        13.0,
        10.0,  # bfloat16 counts as 16-bit
        3.0,  # Cast and the variable read
        2.0,
    ]
    assert t.loc["m/layer_normalization", "time_16bit_us"] == 0  # float32 inside
    assert t.loc["m/dense_1", ["time_16bit_us", "time_32bit_us"]].tolist() == [0.0, 5.0]
    assert t.loc["m/unused", "time_us"] == 0  # has weights, ran nothing: listed with 0
    assert res.total_us == 25.0 and res.unattributed_us == 4.0 and res.cast_us == 2.0
    assert res.share_16bit == pytest.approx(10.0 / 25.0)
    ot = res.op_types.set_index(["op_type", "bits"])
    assert ot.loc[("MatMul", 16), "time_us"] == 10.0 and ot.loc[("MatMul", 32), "time_us"] == 5.0
    assert bool(ot.loc[("Sum", 32), "kept_float32_by_amp"]) is True
    # overrides: the caller knows the layer really computes in float16
    res2 = profile.layer_time(ops, root, dtype_overrides={"m/layer_normalization": "float16"})
    assert res2.layers.set_index("path").loc["m/layer_normalization", "time_16bit_us"] == 3.0


def test_huge_layer_tables_are_trimmed_to_fit_a_record(monkeypatch):
    import pandas as pd

    n = 3000
    root = profile.LayerInfo("m", "m", "Sequential", "float16")
    root.children = [
        profile.LayerInfo(f"dense_{i}", f"m/dense_{i}", "Dense", "float16", 10) for i in range(n)
    ]
    ops = pd.DataFrame(
        {
            "host_or_device": "Host",
            "op_type": "MatMul",
            "op_name": [f"m_1/dense_{i}_1/MatMul" for i in range(n)],
            "occurrences": 1,
            "total_time_us": np.arange(n, dtype=float) + 1,
            "self_time_us": np.arange(n, dtype=float) + 1,
            "execution_mode": "Function",
        }
    )
    monkeypatch.setattr(contract, "MAX_RECORD_BYTES", 20_000)
    payload = profile.layer_time(ops, root).payload(steps=[1, 2])
    assert len(contract.encode_payload(payload)) <= 20_000
    kept = _frame(payload["layers"])
    assert 0 < len(kept) < n and payload["layers_dropped"] == n - len(kept)
    assert kept["time_us"].min() >= n - len(kept)  # the slowest layers are the ones kept
    assert payload["total_us"] == pytest.approx(n * (n + 1) / 2)


def test_parse_steps():
    assert parse_steps((3, 5)) == (3, 5)
    assert parse_steps(4) == (4, 4)
    assert parse_steps("2,6") == (2, 6)
    assert parse_steps(None) is None and parse_steps(0) is None and parse_steps(False) is None
    for bad in [(5, 3), (0, 2), "a,b", (1, 2, 3), 1.5, -1, True]:
        with pytest.raises(ValueError, match="profile_steps"):
            parse_steps(bad)
    with pytest.raises(ValueError, match="convert"):
        ProfileMonitor("x", convert="later")


# --- failures: clear errors, training goes on -----------------------------------------------------
def test_trace_without_ops_is_a_clear_error(tmp_path):
    logdir = str(tmp_path)
    tf.profiler.experimental.start(logdir)
    tf.profiler.experimental.stop()  # nothing ran in between
    with pytest.raises(profile.ProfileError, match="no TensorFlow ops|no .*data|empty"):
        profile.op_table(logdir)
    with pytest.raises(profile.ProfileError, match="no profiler trace"):
        profile.op_table(str(tmp_path / "missing"))
    with pytest.raises(profile.ProfileError, match="no profiler trace under"):
        profile.find_traces(str(tmp_path / "plugins"))
    bad = tmp_path / "junk.xplane.pb"
    bad.write_bytes(b"this is no xspace")
    with pytest.raises(profile.ProfileError, match="not a (readable )?profiler trace"):
        profile.op_table(str(bad))
    empty = tmp_path / "empty.xplane.pb"
    empty.write_bytes(b"")
    with pytest.raises(profile.ProfileError, match="missing or empty"):
        profile.op_table(str(empty))


def test_no_probe_runs_inside_the_profile_window(fitted, ops, tmp_path):
    """A probe due inside the profile window (every 4 steps, window 3-5) waits for the window's
    end: the trace holds the training steps alone (xprof's op table counts as many MatMuls as the
    module's fit of the same model without a probe in its window; the probe's float32 reference
    and mixed passes would add theirs, counted as the layers' time), and the held probe runs at
    step 5, on that step's weights."""
    model = _build_model()
    x, y = _data()
    logdir = str(tmp_path)
    mon = MixedPrecisionMonitor(logdir, log_every=4, probe_every=4, profile=STEPS, budget=None)
    history = model.fit(x, y, batch_size=16, epochs=2, callbacks=[mon], verbose=0)
    assert len(history.history["loss"]) == 2
    probes = sorted({s for k, s, _ in _records(logdir) if k == contract.KIND_PROBE})
    assert probes == [5, 8, 12, 16], probes
    traces = glob.glob(os.path.join(logdir, "plugins", "profile", "*"))
    assert len(traces) == 1
    here = profile.op_table(traces[0])

    def matmuls(table) -> int:
        return int(table.loc[table["op_type"] == "MatMul", "occurrences"].sum())

    assert matmuls(ops) > 0
    assert matmuls(here) == matmuls(ops)


def test_failed_conversion_loses_no_training(fitted, tmp_path, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise profile.ProfileError("simulated converter failure")

    monkeypatch.setattr(profile.traces, "op_table", broken)
    model = fitted["model"]  # traced already: a second fit is quick
    batches = []
    counter = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: batches.append(b))
    x, y = _data(6 * 16)
    cb = ProfileMonitor(str(tmp_path), profile_steps=(2, 3))
    with caplog.at_level(logging.ERROR, logger="mpwatch"):
        history = model.fit(x, y, batch_size=16, epochs=2, callbacks=[cb, counter], verbose=0)
    assert len(history.history["loss"]) == 2  # every epoch ran
    assert len(batches) == 12  # every batch ran
    assert cb.result is None and "simulated converter failure" in cb.error
    assert sum("simulated converter failure" in r.getMessage() for r in caplog.records) == 1
    notices = [(s, p) for k, s, p in _records(str(tmp_path)) if k == contract.KIND_NOTICE]
    assert len(notices) == 1
    assert notices[0][1]["part"] == "profile" and notices[0][1]["level"] == "error"
    assert "simulated converter failure" in notices[0][1]["message"]
    # the trace itself is there for the Profile tab
    assert glob.glob(os.path.join(str(tmp_path), "plugins", "profile", "*", "*.xplane.pb"))


def test_profiler_busy_loses_no_training(fitted, tmp_path):
    model = fitted["model"]
    x, y = _data(4 * 16)
    cb = ProfileMonitor(str(tmp_path / "run"), profile_steps=(1, 2), convert="train_end")
    tf.profiler.experimental.start(str(tmp_path / "other"))  # someone else is profiling
    try:
        history = model.fit(x, y, batch_size=16, epochs=1, callbacks=[cb], verbose=0)
    finally:
        tf.profiler.experimental.stop()
    assert len(history.history["loss"]) == 1
    assert "could not start" in cb.error
    notices = [p for k, _, p in _records(str(tmp_path / "run")) if k == contract.KIND_NOTICE]
    assert [n["part"] for n in notices] == ["profile"]


def test_switched_off_captures_nothing(fitted, tmp_path):
    model = fitted["model"]
    x, y = _data(4 * 16)
    cb = ProfileMonitor(str(tmp_path), profile_steps=None)
    model.fit(x, y, batch_size=16, epochs=1, callbacks=[cb], verbose=0)
    assert cb.trace_dir is None and cb.result is None and cb.error is None
    assert not os.path.exists(os.path.join(str(tmp_path), "plugins"))


# --- the Profile tab's own data route on a real TensorBoard ---------------------------------------
def _get(url: str, timeout: float = 30.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - localhost only
        assert resp.status == 200, url
        body = resp.read()
        if resp.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        return body


@pytest.fixture(scope="module")
def tensorboard(fitted, tmp_path_factory):
    log_path = str(tmp_path_factory.mktemp("tb") / "tensorboard.log")
    with running_tensorboard(
        fitted["logdir"], log_path, lambda base: _get(base + "/data/plugins_listing", timeout=5), 60
    ) as (base, _, _):
        yield base


def test_profile_tab_serves_the_captured_run(fitted, tensorboard):
    plugins = json.loads(_get(tensorboard + "/data/plugins_listing"))
    assert "profile" in plugins
    run = os.path.basename(fitted["cb"].trace_dir)
    runs = json.loads(_get(tensorboard + "/data/plugin/profile/runs"))
    assert run in runs, runs
    tools = json.loads(_get(f"{tensorboard}/data/plugin/profile/run_tools?run={run}"))
    assert "framework_op_stats" in tools
    hosts = json.loads(
        _get(f"{tensorboard}/data/plugin/profile/hosts?run={run}&tag=framework_op_stats")
    )
    names = [h["hostname"] if isinstance(h, dict) else h for h in hosts]
    host = os.path.basename(glob.glob(os.path.join(fitted["cb"].trace_dir, "*.xplane.pb"))[0])
    host = host[: -len(".xplane.pb")]
    assert host in names, hosts
    data = json.loads(
        _get(
            f"{tensorboard}/data/plugin/profile/data?run={run}&tag=framework_op_stats&host={host}",
            timeout=60,
        )
    )
    tables = data if isinstance(data, list) else [data]
    op_names = {row["c"][3]["v"] for t in tables for row in t["rows"]}
    # the tab's table holds the same ops mpwatch joined to the layers
    assert any("/net_" in n and n.endswith("MatMul") for n in op_names)
