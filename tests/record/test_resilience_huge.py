"""Huge: a real 1,000-layer model under mpwatch, and 100,000 steps x 1,000 layers of logs.

Everything is checked against ground truth computed here, not against mpwatch's own output:

- a real 1,000-layer functional model (``build_model`` of benchmarks/huge.py) fit for a few steps
  under ``mixed_float16`` with ``MixedPrecisionMonitor`` (probe every 2 steps, no profiler): the
  layer table has exactly the model's layers, the per-variable gradient table and the probe cover
  every trainable variable, every record event (parsed with TensorFlow's own
  ``tf.compat.v1.train.summary_iterator``) is within ``contract.MAX_RECORD_BYTES``, and the weights
  after the fit are bit-for-bit those of a plain fit from the same state and data (TensorFlow's
  CPU kernels gave identical weights over repeated plain fits and plain vs mpwatch fits of the
  same model when this test was written; should a platform ever differ, drop that assertion
  rather than loosen it into a flaky tolerance);
- 100,000 steps of a 1,000-layer run, written directly (vectorized, the event bytes
  ``tf.summary.scalar`` writes; see ``test_reader.test_benchmark_events_are_what_tf_writes``) with
  values from formulas: ``mpwatch.load_run`` returns every step and value exactly, and the records;
- the same logdir in a real ``tensorboard`` process (it loads in well under 10 s here), once with
  ``--samples_per_plugin scalars=0`` (every point kept: counts of 100,000) and once with
  TensorBoard's default sample of each scalar tag: every point the tab serves is a true point.

Speed is measured by benchmarks/huge.py, not here. The 1,000-layer fit costs a few minutes on two
CPU cores, nearly all of it tracing (the train step, its retrace with mpwatch's tap, and the
probe's float32-reference function over 1,000 layers).
"""

from __future__ import annotations

import glob
import json
import os
import urllib.parse
import urllib.request
import zlib
from types import SimpleNamespace

import numpy as np
import pytest
from repo_scripts import load_script
from tensorboard_process import running_tensorboard

from mpwatch import contract

LAYERS = 1000
FIT_STEPS = 4
BATCH = 32
WIDTH = 16
LONG_STEPS = 100_000
LOG_EVERY = 10
PROBE_STEPS = (1, 50_000, 100_000)
BOOT_TIMEOUT = 240  # TensorBoard imports TensorFlow, then loads 100,000 steps: bounded wait


def _record_events(logdir: str) -> list[tuple[int, str, bytes, int]]:
    """(step, kind, payload blob, serialized event bytes) of every mpwatch record, read with
    TensorFlow's own event iterator."""
    import tensorflow as tf

    out = []
    pattern = os.path.join(logdir, "**", "events.out.tfevents.*")
    for path in sorted(glob.glob(pattern, recursive=True)):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag.startswith("mpwatch/record/"):
                    kind = value.tag[len("mpwatch/record/") :]
                    out.append((event.step, kind, value.tensor.string_val[0], event.ByteSize()))
    return out


def _decode(blob: bytes) -> dict:
    return json.loads(zlib.decompress(blob).decode("utf-8"))


def _rows(tbl: dict) -> list[dict]:
    return [dict(zip(tbl["columns"], row)) for row in tbl["data"]]


# --- a real 1,000-layer model ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def huge_fit(tmp_path_factory, policy):
    """One model, trained twice from the same state on the same batches (no shuffling): plainly,
    then with MixedPrecisionMonitor. Returns the model, both fits' weights and optimizer facts."""
    import mpwatch

    huge = load_script("benchmarks/huge.py")
    logdir = str(tmp_path_factory.mktemp("huge_fit") / "run")
    with policy("mixed_float16"):
        model = huge.compile_model(huge.build_model(LAYERS, WIDTH, seed=0))
        x, y = huge.synthetic_data(FIT_STEPS * BATCH, WIDTH, seed=1)
        model.optimizer.build(model.trainable_variables)
        weights0 = [v.numpy() for v in model.weights]
        opt0 = [v.numpy() for v in model.optimizer.variables]

        def fit(callbacks):
            for v, a in zip(model.weights, weights0):
                v.assign(a)
            for v, a in zip(model.optimizer.variables, opt0):
                v.assign(a)
            model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=callbacks)
            return SimpleNamespace(
                weights=[v.numpy() for v in model.weights],
                iterations=int(model.optimizer.iterations.numpy()),
                scale=float(model.optimizer.dynamic_scale.numpy()),
            )

        plain = fit([])
        monitor = mpwatch.MixedPrecisionMonitor(
            log_dir=logdir, log_every=2, probe_every=2, profile=False
        )
        watched = fit([monitor])
    return SimpleNamespace(
        model=model, logdir=logdir, weights0=weights0, plain=plain, watched=watched
    )


def _model_layers(model) -> list:
    return [ly for ly in model.layers if type(ly).__name__ != "InputLayer"]


@pytest.mark.slow
def test_huge_model_layer_table_has_exactly_the_models_layers(huge_fit):
    import mpwatch

    model = huge_fit.model
    layers = _model_layers(model)
    assert len(layers) == LAYERS
    run = mpwatch.load_run(huge_fit.logdir)
    assert run.warnings == []
    table = run.layers
    assert len(table) == LAYERS
    assert table["name"].is_unique
    assert set(table["name"]) == {ly.name for ly in layers}
    by_name = table.set_index("name")
    for ly in layers:
        row = by_name.loc[ly.name]
        assert row["path"] == f"{model.name}/{ly.name}"
        assert row["class"] == type(ly).__name__
        assert row["params"] == ly.count_params()
        assert bool(row["is_output"]) == (ly.name == "out")
        assert row["compute_dtype"] == ly.compute_dtype
        assert row["variable_dtype"] == ly.variable_dtype
        inside = "float32" if type(ly).__name__ == "LayerNormalization" else ly.compute_dtype
        assert row["effective_dtype"] == inside
    assert by_name.loc["out", "compute_dtype"] == "float32"
    norms = sum(type(ly).__name__ == "LayerNormalization" for ly in layers)
    assert norms > 0 and (by_name["class"] == "LayerNormalization").sum() == norms
    assert sum(by_name["params"]) == model.count_params()


@pytest.mark.slow
def test_huge_model_gradient_tables_cover_every_trainable_variable(huge_fit):
    import mpwatch

    model = huge_fit.model
    owner = {v.path: ly.name for ly in _model_layers(model) for v in ly.trainable_weights}
    truth = {v.path: int(np.prod(v.shape)) for v in model.trainable_variables}
    assert len(truth) == len(model.trainable_variables) == len(owner)
    run = mpwatch.load_run(huge_fit.logdir)

    gv = run.grad_variables
    assert sorted(set(gv["step"])) == list(range(2, FIT_STEPS + 1, 2))  # log_every=2
    for step, rows in gv.groupby("step"):
        assert len(rows) == len(truth), step
        assert dict(zip(rows["variable"], rows["size"])) == truth
        assert dict(zip(rows["variable"], rows["layer"])) == {
            p: f"{model.name}/{name}" for p, name in owner.items()
        }
        assert (rows["nonfinite_count"] >= 0).all()

    # the probe (every 2 steps): every variable and every layer, at each probe step
    assert sorted(run.probe_model["step"]) == list(range(2, FIT_STEPS + 1, 2))
    for step, rows in run.probe_variables.groupby("step"):
        assert dict(zip(rows["variable"], rows["size"])) == truth, step
        assert dict(zip(rows["variable"], rows["layer"])) == owner
    names = {ly.name for ly in _model_layers(model)}
    for step, rows in run.probe_layers.groupby("step"):
        assert len(rows) == LAYERS and set(rows["layer"]) == names, step


@pytest.mark.slow
def test_huge_model_every_record_is_within_the_size_limit(huge_fit):
    events = _record_events(huge_fit.logdir)
    kinds = {kind for _, kind, _, _ in events}
    assert {"run_info", "layers", "grad_variables", "probe"} <= kinds
    assert "notice" not in kinds  # no recording part failed
    sizes = {}
    for step, kind, blob, event_bytes in events:
        assert len(blob) <= contract.MAX_RECORD_BYTES, (kind, step, len(blob))
        assert event_bytes <= contract.MAX_RECORD_BYTES, (kind, step, event_bytes)
        sizes[kind] = max(sizes.get(kind, 0), event_bytes)
        _decode(blob)  # every record decodes by hand (zlib + JSON)

    # the layer table and the probe, reassembled by hand from the events (a split probe's parts
    # are further records at the same step), name every layer and every variable
    model = huge_fit.model
    names = {ly.name for ly in _model_layers(model)}
    paths = {v.path for v in model.trainable_variables}
    (layers_payload,) = [_decode(b) for _, k, b, _ in events if k == "layers"][-1:]
    assert {r["name"] for r in _rows(layers_payload["layers"])} == names
    probe_steps = sorted({s for s, k, _, _ in events if k == "probe"})
    for step in probe_steps:
        parts = [_decode(b) for s, k, b, _ in events if k == "probe" and s == step]
        head = [p for p in parts if "layers" in p]
        assert len(head) == 1 and len(parts) == head[0].get("parts", 1), (step, sizes)
        assert {r["layer"] for r in _rows(head[0]["layers"])} == names
        variables = [r["variable"] for p in parts for r in _rows(p["variables"])]
        assert sorted(variables) == sorted(paths)


@pytest.mark.slow
def test_huge_model_training_is_unaffected(huge_fit):
    import mpwatch

    plain, watched = huge_fit.plain, huge_fit.watched
    assert any(not np.array_equal(a, b) for a, b in zip(huge_fit.weights0, plain.weights))
    for a, b in zip(plain.weights, watched.weights):
        np.testing.assert_array_equal(a, b)
    assert (watched.iterations, watched.scale) == (plain.iterations, plain.scale)
    # what mpwatch recorded about the optimizer agrees with the optimizer
    run = mpwatch.load_run(huge_fit.logdir)
    # step 0: the scale before the first step
    assert run.scalar(contract.LOSS_SCALE).index.tolist() == list(range(0, FIT_STEPS + 1))
    assert run.scalar(contract.LOSS_SCALE).iloc[-1] == watched.scale
    assert run.scalar(contract.STEP_SKIPPED).sum() == FIT_STEPS - watched.iterations


# --- 100,000 steps of a 1,000-layer run -----------------------------------------------------------
def _long_truth() -> dict:
    """Every scalar of the long run, from formulas (float32, as TensorBoard stores scalars)."""
    steps = np.arange(1, LONG_STEPS + 1, dtype=np.int64)
    skipped = (steps % 4999 == 0).astype(np.float32)
    every = steps[steps % LOG_EVERY == 0]
    cumulative = np.cumsum(skipped)[every - 1]
    per_interval = np.diff(np.concatenate([[0.0], cumulative]))
    return {
        contract.LOSS_SCALE: (steps, (2.0 ** (10 + (steps // 997) % 6)).astype(np.float32)),
        contract.STEP_SKIPPED: (steps, skipped),
        contract.SKIPPED_STEPS: (every, per_interval.astype(np.float32)),
        contract.SKIPPED_STEPS_TOTAL: (every, cumulative.astype(np.float32)),
        contract.GRAD_ZERO_FRACTION: (every, ((every * 7919 % 10007) / 10007).astype(np.float32)),
        contract.STEP_TIME_MS: (every, (12.5 + (every % 13) * 0.25).astype(np.float32)),
        contract.TRAIN_LOSS: (every, (1.0 / (1.0 + every / 1000.0)).astype(np.float32)),
    }


def _long_layers_payload() -> dict:
    rows = [
        [
            f"dense_{i}",
            f"long/dense_{i}",
            "Dense",
            1,
            "mixed_float16",
            "float32" if i == LAYERS - 1 else "float16",
            "float32",
            "float32" if i == LAYERS - 1 else "float16",
            "float32" if i == LAYERS - 1 else "float16",
            16 * 16 + 16,
            16 * 16 + 16,
            {"units": 16, "kernel_input_dim": 16},
            True,
            i == LAYERS - 1,
            None,
        ]
        for i in range(LAYERS)
    ]
    return {"layers": contract.table(contract.LAYERS_COLUMNS, rows)}


@pytest.fixture(scope="module")
def long_run(tmp_path_factory):
    """A logdir with one run: the scalars of ``_long_truth`` (one event file, interleaved by step
    as a real run writes them) and, in a second file, the layer table and 3 probes of 1,000
    layers. Written with benchmarks/reader.py's vectorized event writer."""
    bench = load_script("benchmarks/reader.py")
    root = tmp_path_factory.mktemp("long_logdir")
    path = root / "run"
    path.mkdir()
    truth = _long_truth()
    wall0 = 1.7e9
    groups = []
    for ti, (tag, (st, vals)) in enumerate(truth.items()):
        for gst, mat in bench.scalar_events(tag, st, vals, wall0):
            groups.append((gst * 16 + ti, mat))
    keys = np.concatenate([k for k, _ in groups])
    framed = [row.tobytes() for _, m in groups for row in m]
    with open(path / f"events.out.tfevents.{int(wall0)}.huge.1.v2", "wb") as f:
        f.write(bench.file_version_event(wall0))
        f.write(b"".join(framed[i] for i in np.argsort(keys, kind="stable")))
    rng = np.random.default_rng(3)
    layers = _long_layers_payload()
    probes = {s: bench.probe_payload(LAYERS, rng, 32768.0) for s in PROBE_STEPS}
    info = {"policy": "mixed_float16", "compute_dtype": "float16", "variable_dtype": "float32"}
    last_wall = wall0 + LONG_STEPS * 0.01 + 1.0  # written after the scalars, as a real run would
    with open(path / f"events.out.tfevents.{int(wall0) + 1}.huge.2.v2", "wb") as f:
        f.write(bench.file_version_event(wall0 + 1))
        f.write(bench.record_event(contract.KIND_RUN_INFO, 0, info, last_wall))
        f.write(bench.record_event(contract.KIND_LAYERS, 1, layers, last_wall))
        for s, payload in probes.items():
            f.write(bench.record_event(contract.KIND_PROBE, s, payload, last_wall))
    return SimpleNamespace(
        root=str(root), path=str(path), truth=truth, layers=layers, probes=probes, info=info
    )


def test_long_run_reads_every_step_and_value_exactly(long_run):
    import mpwatch

    run = mpwatch.load_run(long_run.path)
    assert run.warnings == []
    assert run.scalars.index.tolist() == list(range(1, LONG_STEPS + 1))
    for tag, (steps, values) in long_run.truth.items():
        got = run.scalar(tag)
        np.testing.assert_array_equal(got.index.to_numpy(), steps, err_msg=tag)
        np.testing.assert_array_equal(got.to_numpy(), values.astype(np.float64), err_msg=tag)
    assert len(run.scalar(contract.LOSS_SCALE)) == LONG_STEPS
    assert len(run.scalar(contract.TRAIN_LOSS)) == LONG_STEPS // LOG_EVERY

    # the records decode to what was written
    assert run.info == long_run.info
    assert run.records["layers"] == [(1, long_run.layers)]
    assert len(run.layers) == LAYERS
    assert run.layers["name"].tolist() == [f"dense_{i}" for i in range(LAYERS)]
    assert [s for s, _ in run.records["probe"]] == list(PROBE_STEPS)
    assert [p for _, p in run.records["probe"]] == [long_run.probes[s] for s in PROBE_STEPS]
    assert len(run.probe_layers) == len(PROBE_STEPS) * LAYERS
    assert len(run.probe_variables) == len(PROBE_STEPS) * 2 * LAYERS


# --- the tab over a real TensorBoard --------------------------------------------------------------
def _get(base: str, path: str, **params) -> dict:
    url = base + path + ("?" + urllib.parse.urlencode(params) if params else "")
    with urllib.request.urlopen(url, timeout=120) as r:
        assert r.headers.get("Content-Type", "").startswith("application/json")
        return json.loads(r.read().decode("utf-8"))


@pytest.fixture(scope="module", params=["keep_all", "tensorboard_default"])
def long_tab(request, long_run):
    """A real ``tensorboard`` over the long run: with ``--samples_per_plugin scalars=0`` (every
    scalar kept) and with TensorBoard's default (a reservoir sample of each scalar tag)."""
    extra = ("--samples_per_plugin", "scalars=0") if request.param == "keep_all" else ()
    polls = iter(range(10**9))

    def ready(base):
        # a fresh experiment id each poll: the plugin caches a run's tables per (experiment, run,
        # version), so polling the default experiment could keep a half-loaded read
        eid = f"poll-{next(polls)}"
        runs = _get(base, f"/experiment/{eid}/data/plugin/mpwatch/runs")["runs"]
        assert [r["name"] for r in runs] == ["run"] and runs[0]["max_step"] == LONG_STEPS
        probes = _get(base, f"/experiment/{eid}/data/plugin/mpwatch/probes", run="run")
        assert probes["steps"] == list(PROBE_STEPS)
        layers = _get(base, f"/experiment/{eid}/data/plugin/mpwatch/layers", run="run")
        assert len(layers["rows"]) == LAYERS
        if request.param == "keep_all":
            sc = _get(base, f"/experiment/{eid}/data/plugin/mpwatch/scalars", run="run")
            assert sc["series"][contract.LOSS_SCALE]["count"] == LONG_STEPS
        return True

    log_path = os.path.join(long_run.root, "..", f"tensorboard-{request.param}.log")
    with running_tensorboard(long_run.root, log_path, ready, BOOT_TIMEOUT, extra) as (base, _, _):
        yield SimpleNamespace(base=base, mode=request.param, truth=long_run.truth)


@pytest.mark.slow
def test_tab_serves_the_long_run(long_tab):
    body = _get(long_tab.base, "/data/plugin/mpwatch/scalars", run="run")
    assert body["run"] == "run"
    series = body["series"]
    assert set(long_tab.truth) <= set(series)
    for tag, (steps, values) in long_tab.truth.items():
        s = series[tag]
        got_steps = np.asarray(s["steps"], dtype=np.int64)
        if long_tab.mode == "keep_all":
            assert s["count"] == len(steps), tag  # 100,000 for a per-step tag
        else:  # TensorBoard keeps a sample; what it keeps must still be exact
            assert 0 < s["count"] <= len(steps), tag
        assert 0 < len(got_steps) <= min(s["count"], 1500 + 2), tag
        assert (np.diff(got_steps) > 0).all(), tag
        assert got_steps[0] >= 1 and got_steps[-1] == steps[-1], tag  # the last step is kept
        assert got_steps[-1] <= LONG_STEPS
        # every point shown is a true (step, value) pair of the run
        idx = np.searchsorted(steps, got_steps)
        np.testing.assert_array_equal(steps[idx], got_steps, err_msg=tag)
        np.testing.assert_array_equal(
            np.asarray(s["values"], dtype=np.float64), values[idx].astype(np.float64), err_msg=tag
        )
    steps_all, flags = long_tab.truth[contract.STEP_SKIPPED]
    assert body["skipped_total"] == int(flags.sum()) == 20
    if long_tab.mode == "keep_all":
        # every skipped step is marked; the tab also marks the end of the logging interval that
        # holds one (where SKIPPED_STEPS / SKIPPED_STEPS_TOTAL rise): no mark anywhere else
        marks, true = set(body["skipped_steps"]), set(steps_all[flags > 0].tolist())
        assert true <= marks
        assert all(any(0 < m - t < LOG_EVERY for t in true) for m in marks - true)

    layers = _get(long_tab.base, "/data/plugin/mpwatch/layers", run="run")
    assert len(layers["rows"]) == LAYERS
    names = [row[layers["columns"].index("name")] for row in layers["rows"]]
    assert names == [f"dense_{i}" for i in range(LAYERS)]
    assert layers["probe_step"] == PROBE_STEPS[-1]
    probes = _get(long_tab.base, "/data/plugin/mpwatch/probes", run="run")
    assert probes["steps"] == list(PROBE_STEPS)
    assert len(probes["heatmap"]["layers"]) == LAYERS
