"""The TensorBoard tab's loader and data layer, in-process (no TensorBoard server, no browser).

Ground truth: runs written with :class:`mpwatch.RunWriter` with known values, and the
reader's own :func:`mpwatch.load_run` of the same event files (the tab and the CLI see one Run).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
from builders import H100_TRACE, put_h100_trace
from tensorboard.context import RequestContext

from mpwatch import contract
from mpwatch.contract import table
from mpwatch.read import load_run
from mpwatch.record.runtime.writer import RunWriter

CTX = RequestContext()
XSS_LAYER = '<img src=x onerror="window.__x=1">'
# the contract's column names (mpwatch/contract.py)
LAYER_COLUMNS = contract.LAYERS_COLUMNS
PROBE_LAYER_COLUMNS = contract.PROBE_LAYER_COLUMNS


def probe_payload(step: int, layers: list[str], scale: float) -> dict:
    rows = [
        [name, 100, i % 7, (i % 7) / 100, 1e-3 * (i + 1), 1e-3, 10.0 * (i + 1), 3.0, 0.0, False]
        for i, name in enumerate(layers)
    ]
    return {
        "mode": "float16",
        "loss_scale": scale,
        "reference": "float32_twin",
        "reference_note": None,
        "variables": table(
            contract.PROBE_VARIABLE_COLUMNS,
            [[f"{n}/kernel", n, 10, 10, 0, 0.0, 1e-3, 0.5] for n in layers],
        ),
        "layers": table(PROBE_LAYER_COLUMNS, rows),
        "model": {
            "ref_nonzero": 100 * len(layers),
            "underflow_count": 3,
            "underflow_fraction": 0.03,
            "grad_rel_error": float("nan"),  # non-finite values must reach the browser as null
            "max_abs_activation": float("inf"),
            "first_nonfinite_layer": None,
        },
        "histogram": {
            "edges_log2": list(range(-40, 1)),
            "counts": [int(1000 * math.exp(-(((k + 20) / 6) ** 2))) for k in range(-40, 0)],
            "zeros": 5,
            "window_log2": [-24 - math.log2(scale), math.log2(65504) - math.log2(scale)],
        },
        "sweep": table(
            ["scale_log2", "scale", "predicted_underflow_fraction", "predicted_overflow_fraction"],
            [[k, 2.0**k, 0.1 / (k + 1), 0.0] for k in range(10, 17)],
        ),
        "recommended_scale": 65536.0,
    }


def write_synthetic_run(
    logdir: str,
    steps: int = 60,
    layers: list[str] | None = None,
    probe_every: int = 10,
    skips: tuple[int, ...] = (7, 8),
    close: bool = True,
    profile: bool = False,
) -> RunWriter:
    """A run with known values: loss scale halves at each skipped step; layer i takes (i + 1) / T of
    the profiled time (T = 1 + 2 + ... + n)."""
    layers = layers or ["conv2d", "dense", "softmax"]
    w = RunWriter(logdir)
    w.record(
        contract.KIND_RUN_INFO,
        0,
        {
            "policy": "mixed_float16",
            "compute_dtype": "float16",
            "variable_dtype": "float32",
            "loss_scale": {"kind": "dynamic", "reason": None, "initial": 32768.0},
            "model": {
                "name": "synthetic",
                "class": "Sequential",
                "kind": "sequential",
                "params": 1,
            },
            "device": {"type": "CPU", "name": "cpu", "compute_capability": None},
        },
    )
    rows = [
        [n, n, "Dense", 1, "mixed_float16", "float16", "float32",
         "float16", "float16", 10 * (i + 1), 10 * (i + 1),
         {"units": 10}, False, n == layers[-1], None]
        for i, n in enumerate(layers)
    ]  # fmt: skip
    w.record(contract.KIND_LAYERS, 1, {"layers": table(LAYER_COLUMNS, rows)})
    scale = 32768.0
    for s in range(1, steps + 1):
        skipped = s in skips
        if skipped:
            scale /= 2
        w.scalars(
            s,
            {
                contract.LOSS_SCALE: scale,
                contract.STEP_SKIPPED: float(skipped),
                contract.SKIPPED_STEPS_TOTAL: float(sum(k <= s for k in skips)),
                contract.GRAD_ZERO_FRACTION: 0.1,
                contract.GRAD_SUBNORMAL_FRACTION: 0.01 * (s % 3),
                contract.GRAD_NONFINITE_COUNT: math.inf if skipped else 0.0,
            },
        )
        if s % 10 == 0:  # the interval counter: skipped steps in the 10 steps ending here
            w.scalars(s, {contract.SKIPPED_STEPS: float(sum(s - 10 < k <= s for k in skips))})
        if s % probe_every == 0:
            w.record(contract.KIND_PROBE, s, probe_payload(s, layers, scale))
    if profile:
        total = sum(range(1, len(layers) + 1))
        w.record(
            contract.KIND_PROFILE,
            steps,
            {
                "steps": [steps - 5, steps],
                "device": "CPU",
                "total_us": 1000.0 * total,
                "unattributed_us": 0.0,
                "cast_us": 10.0,
                "cast_share": 10.0 / (1000.0 * total),
                "share_16bit": 0.9,
                "layers": table(
                    ["layer", "time_us", "time_16bit_us", "time_32bit_us", "ops", "share"],
                    [
                        [n, 1000.0 * (i + 1), 900.0 * (i + 1), 100.0 * (i + 1), 3, (i + 1) / total]
                        for i, n in enumerate(layers)
                    ],
                ),  # fmt: skip
                "op_types": table(
                    ["op_type", "time_us", "bits", "count", "kept_float32_by_amp"],
                    [["MatMul", 1000.0 * total, 16, 3, False]],
                ),
                "trace_dir": "plugins/profile/x",
            },
        )
    if close:
        w.close()
    else:
        w.flush()
    return w


GPU_TRACE = H100_TRACE


def write_gpu_run(logdir: str) -> None:
    """A run with the real H100 trace (tests/data/h100) summarized into its profile record, its
    run_info (an H100) and a layers record that knows only two of the model's layers (the others
    are known to the profile alone)."""
    from mpwatch.record.callbacks.profile_capture import record_trace

    put_h100_trace(logdir)
    w = RunWriter(logdir)
    w.record(
        contract.KIND_RUN_INFO,
        0,
        {
            "policy": "mixed_float16",
            "compute_dtype": "float16",
            "variable_dtype": "float32",
            "loss_scale": {"kind": "dynamic", "reason": None, "initial": 32768.0},
            "model": {"name": "convnet", "class": "Sequential", "kind": "sequential", "params": 1},
            "device": {"type": "GPU", "name": "NVIDIA H100 80GB HBM3",
                       "compute_capability": "9.0", "tensor_cores": True},
        },
    )  # fmt: skip
    rows = [
        ["conv2d", "convnet/conv2d", "Conv2D", 1, "mixed_float16", "float16", "float32",
         "float16", "float16", 896, 896, {"filters": 32, "input_channels": 3}, False, False, None],
        ["batch_normalization", "convnet/batch_normalization", "BatchNormalization", 1,
         "mixed_float16", "float16", "float32", "float16", "float32", 128, 64, {}, None, False,
         "normalises in float32 inside"],
    ]  # fmt: skip
    w.record(contract.KIND_LAYERS, 0, {"layers": table(LAYER_COLUMNS, rows)})
    w.close()
    record_trace(logdir, step=5)


# --- the loader -----------------------------------------------------------------------------------
def test_entry_point_registers_the_loader():
    eps = importlib.metadata.entry_points(group="tensorboard_plugins")
    loader = {ep.name: ep for ep in eps}["mpwatch"].load()
    from tensorboard_plugin_mpwatch.loader import MpwatchLoader

    assert loader is MpwatchLoader


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({}, {"mpwatch": 0}),
        ({"images": 5}, {"images": 5, "mpwatch": 0}),
        ({"mpwatch": 50}, {"mpwatch": 50}),  # the user's choice wins
        ("images=5, mpwatch=7", {"images": 5, "mpwatch": 7}),
        ("", {"mpwatch": 0}),
    ],
)
def test_loader_merges_samples_per_plugin(given, expected):
    from tensorboard_plugin_mpwatch.loader import MpwatchLoader

    flags = argparse.Namespace(samples_per_plugin=given)
    MpwatchLoader().fix_flags(flags)
    assert flags.samples_per_plugin == expected


def test_loader_flag_goes_through_tensorboard_argument_parsing():
    from tensorboard import program
    from tensorboard.plugins.core import core_plugin
    from tensorboard_plugin_mpwatch.loader import MpwatchLoader

    tb = program.TensorBoard(plugins=[core_plugin.CorePluginLoader(), MpwatchLoader()])
    tb.configure(
        argv=["tensorboard", "--logdir", "/nonexistent", "--samples_per_plugin", "images=3"]
    )
    assert tb.flags.samples_per_plugin == {"images": 3, "mpwatch": 0}


def test_loader_is_import_safe():
    code = (
        "import sys, tensorboard_plugin_mpwatch.loader as l; "
        "heavy = [m for m in ('tensorflow', 'pandas', 'tensorboard_plugin_mpwatch.plugin') "
        "if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- the data layer over an in-process data provider ---------------------------------------------
def _provider(logdir: str, scalars: int = 1000, multiplexer: list | None = None):
    """TensorBoard's Python loader (``--load_fast=false``) over ``logdir``, keeping ``scalars``
    points per scalar tag (TensorBoard's default 1,000) and every mpwatch record (the loader's
    ``mpwatch=0``). ``multiplexer``, a list, receives the multiplexer (to ``Reload()`` it)."""
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard_plugin_mpwatch.loader import MpwatchLoader

    flags = argparse.Namespace(samples_per_plugin={"scalars": scalars})
    MpwatchLoader().fix_flags(flags)
    mux = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance=flags.samples_per_plugin)
    mux.AddRunsFromDirectory(logdir)
    mux.Reload()
    if multiplexer is not None:
        multiplexer.append(mux)
    return data_provider.MultiplexerDataProvider(mux, logdir)


@pytest.fixture(scope="module")
def synthetic_logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("plugin_logs")
    write_synthetic_run(str(root / "run_a"), steps=120, probe_every=5)  # 24 probes: over TB's 10
    write_synthetic_run(str(root / "run_b"), layers=["dense_1", XSS_LAYER, "out"], profile=True)
    import tensorflow as tf

    with tf.summary.create_file_writer(str(root / "plain")).as_default():
        tf.summary.scalar("loss", 1.0, step=1)
    return str(root)


def test_runs_without_mpwatch_data_are_not_listed(synthetic_logdir):
    from tensorboard_plugin_mpwatch import data

    runs = data.list_mpwatch_runs(_provider(synthetic_logdir), CTX, "")
    assert sorted(runs) == ["run_a", "run_b"]
    assert runs["run_a"]["max_step"] == 120


def test_plugin_run_is_the_readers_run(synthetic_logdir):
    """The tab builds its Run from the data provider; the CLI reads event files. Same Run."""
    from tensorboard_plugin_mpwatch import data

    from mpwatch import read as reader

    records = data.read_run(_provider(synthetic_logdir), CTX, "", "run_a")
    assert len(records.records[contract.KIND_PROBE]) == 24  # every probe kept (mpwatch=0)
    model = data.build_model(records)
    direct = reader.load_run(f"{synthetic_logdir}/run_a")
    mp = [c for c in direct.scalars.columns if c.startswith(contract.PREFIX)]
    pd.testing.assert_frame_equal(model.scalars[mp], direct.scalars[mp], check_dtype=False)
    pd.testing.assert_frame_equal(model.layers, direct.layers)
    pd.testing.assert_frame_equal(model.probe_layers, direct.probe_layers)
    assert model.info == direct.info
    assert sorted(model.histograms) == sorted(direct.histograms)


def test_downsample_keeps_extremes_and_bounds():
    from tensorboard_plugin_mpwatch.data import downsample

    rng = np.random.default_rng(0)
    steps = np.arange(1, 100_001)
    values = rng.normal(size=steps.size)
    values[31_337] = 50.0  # a spike
    values[77_777] = -50.0  # a drop
    values[5] = np.nan
    s, v = downsample(steps, values, 1500)
    assert len(s) <= 1500 + 2
    assert np.all(np.diff(s) > 0)
    assert 31_338 in s and 77_778 in s and 6 in s  # extremes and non-finite survive
    assert s[-1] == 100_000 and s[0] == 1
    assert np.array_equal(v[np.isfinite(v)], values[s - 1][np.isfinite(values[s - 1])])
    s2, v2 = downsample(steps[:100], values[:100], 1500)
    assert len(s2) == 100


def test_views_are_plain_json(synthetic_logdir):
    from tensorboard_plugin_mpwatch import data

    records = data.read_run(_provider(synthetic_logdir), CTX, "", "run_b")
    model = data.build_model(records)
    for view in (
        data.scalars_view(records, model, 100),
        data.layers_view(model, []),
        data.probes_view(model, None),
        data.profile_view(model),
        data.info_view(model),
    ):
        json.dumps(view, allow_nan=False)  # raises on NaN/Infinity
    scalars = data.scalars_view(records, model, 100)
    assert scalars["skipped_steps"] == [7, 8]
    assert scalars["series"][contract.LOSS_SCALE]["values"][-1] == 32768.0 / 4
    nonfinite = scalars["series"][contract.GRAD_NONFINITE_COUNT]["values"]
    assert nonfinite[6] is None and nonfinite[0] == 0.0  # inf -> null
    layers = data.layers_view(model, [])
    names = [r[0] for r in layers["rows"]]
    assert names == ["dense_1", XSS_LAYER, "out"]
    share = layers["columns"].index("time_share")
    assert layers["profiled"] is True and layers["probe_step"] == 60
    assert [r[share] for r in layers["rows"]] == pytest.approx([1 / 6, 2 / 6, 3 / 6])
    underflow = layers["columns"].index("underflow_fraction")
    assert [r[underflow] for r in layers["rows"]] == [0.0, 0.01, 0.02]  # the probe at step 60
    assert data.profile_view(model)["profile"]["share_16bit"] == 0.9
    assert data.profile_view(model)["step"] == 60
    probes = data.probes_view(model, 30)
    assert probes["probe"]["step"] == 30 and probes["heatmap"] is None
    assert probes["probe"]["model"]["grad_rel_error"] is None
    assert probes["probe"]["model"]["underflow_fraction"] == 0.03
    assert probes["probe"]["loss_scale"] == 32768.0 / 4 and probes["probe"]["mode"] == "float16"
    assert probes["probe"]["histogram"]["zeros"] == 5
    assert probes["probe"]["sweep"]["columns"][0] == "scale_log2"
    assert len(probes["probe"]["sweep"]["data"]) == 7
    latest = data.probes_view(model, None)
    assert latest["steps"] == [10, 20, 30, 40, 50, 60]
    assert latest["probe"]["step"] == 60
    assert latest["heatmap"]["layers"] == names
    assert latest["heatmap"]["steps"] == [10, 20, 30, 40, 50, 60]
    assert latest["heatmap"]["values"][1] == [0.01] * 6  # layer i has underflow (i % 7) / 100
    with pytest.raises(KeyError):
        data.probes_view(model, 31)
    info = data.info_view(model)
    assert info["info"]["policy"] == "mixed_float16" and info["errors"] == []


def test_skip_markers_are_exactly_the_skipped_steps(synthetic_logdir):
    """Steps 7 and 8 were skipped; the interval counter mpwatch/skipped_steps says 2 at step 10 (the
    two skips of steps 1-10): step 10 was not skipped and gets no marker."""
    from tensorboard_plugin_mpwatch import data

    records = data.read_run(_provider(synthetic_logdir), CTX, "", "run_a")
    assert records.scalars[contract.SKIPPED_STEPS][1].tolist()[0] == 2.0  # at step 10
    view = data.scalars_view(records, data.build_model(records), 100)
    assert view["skipped_steps"] == [7, 8]
    assert view["skipped_total"] == 2 and view["skipped_marked_all"] is True


def test_skips_known_only_from_the_cumulative_count_mark_no_step(tmp_path):
    """Without the per-step flag, the cumulative count's rises say how many steps were skipped
    between two of its points, not which: no marker at the counter's steps, a span per rise."""
    from tensorboard_plugin_mpwatch import data

    w = RunWriter(str(tmp_path / "run"))
    w.scalar_series(contract.LOSS_SCALE, [10, 20, 30], [4.0, 1.0, 1.0])
    w.scalar_series(contract.SKIPPED_STEPS_TOTAL, [10, 20, 30], [1.0, 3.0, 3.0])
    w.close()
    records = data.read_run(_provider(str(tmp_path)), CTX, "", "run")
    view = data.scalars_view(records, data.build_model(records), 100)
    assert view["skipped_steps"] == []
    assert view["skipped_spans"] == [[1, 10, 1], [11, 20, 2]]
    assert view["skipped_total"] == 3 and view["skipped_marked_all"] is False


def _run_info(iterations: int, scale: float | None) -> dict:
    return {
        "policy": "mixed_float16",
        "loss_scale": {"kind": "dynamic", "reason": None, "initial": 32768.0},
        "start": {"iterations": iterations, "loss_scale": scale},
    }


def test_the_loss_scale_starts_at_the_first_step(tmp_path):
    """The recorder writes the scale before the first step at step 0. A run without that point
    (recorded before it was written, or TensorBoard sampled it away) gets it from its first
    run_info; a run that has it is served as recorded; a continued run starts where it was."""
    from tensorboard_plugin_mpwatch import data

    def served(name: str, info_step: int, info: dict, steps: list[int]) -> tuple[list, list]:
        w = RunWriter(str(tmp_path / name))
        w.record(contract.KIND_RUN_INFO, info_step, info)
        w.scalar_series(contract.LOSS_SCALE, steps, [2.0**14] * len(steps))
        w.close()
        records = data.read_run(_provider(str(tmp_path)), CTX, "", name)
        ls = data.scalars_view(records, data.build_model(records), 100)["series"]
        return ls[contract.LOSS_SCALE]["steps"], ls[contract.LOSS_SCALE]["values"]

    s14 = 2.0**14
    assert served("old", 0, _run_info(0, None), [1, 2, 3]) == ([0, 1, 2, 3], [2.0**15] + [s14] * 3)
    assert served("built", 0, _run_info(0, 1024.0), [1, 2]) == ([0, 1, 2], [1024.0, s14, s14])
    assert served("new", 0, _run_info(0, None), [0, 1]) == ([0, 1], [s14, s14])
    assert served("resumed", 8, _run_info(6, s14), [9, 10]) == ([9, 10], [s14, s14])


def test_an_unreliable_probe_is_shown_as_such(tmp_path):
    """The latest probe is unreliable (its loss disagreed with the train step's): the default view
    is the latest reliable one, and the unreliable one, picked by its step, says why."""
    from tensorboard_plugin_mpwatch import data

    w = write_synthetic_run(str(tmp_path / "run"), steps=20, probe_every=10, close=False)
    bad = probe_payload(20, ["conv2d", "dense", "softmax"], 32768.0)
    bad.update(reliable=False, unreliable_reason="probe loss 2.3 vs the train step's 0.02")
    w.record(contract.KIND_PROBE, 20, bad)
    w.close()
    records = data.read_run(_provider(str(tmp_path)), CTX, "", "run")
    model = data.build_model(records)
    view = data.probes_view(model, None)
    assert view["steps"] == [10, 20] and view["unreliable_steps"] == [20]
    assert view["probe"]["step"] == 10
    picked = data.probes_view(model, 20)["probe"]
    assert picked["step"] == 20 and picked["reliable"] is False
    assert picked["unreliable_reason"] == "probe loss 2.3 vs the train step's 0.02"
    assert "reliable" not in picked["model"]


def test_counts_are_recorded_steps_not_tensorboards_sample(synthetic_logdir):
    """run_a records the loss scale at each of its 120 steps and the interval counter every 10.
    With TensorBoard's whole series, ``count`` is exact; with a 20-point sample it is counted on
    the series' cadence, ``served`` says how many points TensorBoard kept, and the skip total still
    comes out right (the cumulative counter's last point is always kept)."""
    from tensorboard_plugin_mpwatch import data

    whole = data.read_run(_provider(synthetic_logdir), CTX, "", "run_a")
    view = data.scalars_view(whole, data.build_model(whole), 50)
    ls = view["series"][contract.LOSS_SCALE]
    assert (ls["count"], ls["count_exact"], ls["served"]) == (120, True, 120)
    assert len(ls["steps"]) <= 52  # the points drawn: downsampled, count is not their number
    interval = view["series"][contract.SKIPPED_STEPS]
    assert (interval["count"], interval["count_exact"]) == (12, True)

    sample = data.read_run(_provider(synthetic_logdir, scalars=20), CTX, "", "run_a", None, 20)
    assert sample.sampled[contract.LOSS_SCALE] and sample.served[contract.LOSS_SCALE] == 20
    view = data.scalars_view(sample, data.build_model(sample), 50)
    ls = view["series"][contract.LOSS_SCALE]
    first = ls["steps"][0]
    assert ls["served"] == 20 and ls["count_exact"] is False and ls["steps"][-1] == 120
    assert ls["count"] == 120 - first + 1  # per-step cadence from the first kept step
    assert view["series"][contract.SKIPPED_STEPS]["count_exact"] is True  # 12 points: all served
    assert view["skipped_total"] == 2
    assert set(view["skipped_steps"]) <= {7, 8}  # markers only where a step was skipped
    assert view["skipped_marked_all"] is (len(view["skipped_steps"]) == 2)


def test_a_new_version_of_a_run_decodes_only_new_records(synthetic_logdir, monkeypatch):
    from tensorboard_plugin_mpwatch import data

    provider = _provider(synthetic_logdir)
    decoded: dict = {}
    first = data.read_run(provider, CTX, "", "run_a", decoded)
    n_records = sum(len(v) for v in first.records.values())
    assert n_records == 1 + 1 + 24  # run_info, layers, 24 probes
    # decoded once per content: the synthetic probes repeat (two loss scales -> two contents)
    assert len(decoded) == 1 + 1 + 2
    calls = []
    monkeypatch.setattr(contract, "decode_payload", lambda blob: calls.append(blob))
    again = data.read_run(provider, CTX, "", "run_a", decoded)
    assert calls == []
    assert again.records == first.records


# --- split records: a probe written in parts at one step ------------------------------------------
SPLIT_LAYERS = ["conv2d", "dense", "softmax"]
SPLIT_VARIABLES = 300


def write_split_probe_run(logdir: str) -> dict:
    """Probes at steps 15 and 20; the one at 20 holds 300 variables and is written by
    ``RunWriter.record`` under a record size limit lowered so that it splits into parts at one step,
    as a large model's probe does over ``contract.MAX_RECORD_BYTES``."""
    rng = np.random.default_rng(1)
    w = write_synthetic_run(logdir, steps=20, layers=SPLIT_LAYERS, probe_every=15, close=False)
    payload = probe_payload(20, SPLIT_LAYERS, 8192.0)
    rows = [
        [
            f"{SPLIT_LAYERS[i % 3]}/v{i}",
            SPLIT_LAYERS[i % 3],
            100 + i,
            90,
            int(k),
            k / 90,
            float(e),
            0.5,
        ]
        for i, (k, e) in enumerate(zip(rng.integers(0, 90, SPLIT_VARIABLES), rng.random(300)))
    ]
    payload["variables"] = table(contract.PROBE_VARIABLE_COLUMNS, rows)
    head = dict(payload, variables=table(contract.PROBE_VARIABLE_COLUMNS, []), parts=99)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(contract, "MAX_RECORD_BYTES", len(contract.encode_payload(head)) + 256)
        w.record(contract.KIND_PROBE, 20, payload)
    w.close()
    return {"variables": [r[0] for r in rows]}


@contextlib.contextmanager
def data_server_provider(logdir: str, run: str, max_step: int):
    """TensorBoard's data server (``--load_fast=auto``, TensorBoard's default where its binary
    runs) over ``logdir``, with the loader's ``mpwatch=0``; skips when the binary is missing."""
    from tensorboard.data import provider as tb_provider
    from tensorboard.data import server_ingester
    from tensorboard.util import grpc_util

    try:
        binary = server_ingester.get_server_binary()
    except server_ingester.NoDataServerError as e:
        pytest.skip(f"no TensorBoard data server: {e}")
    ingester = server_ingester.SubprocessServerDataIngester(
        binary,
        logdir,
        reload_interval=1,
        channel_creds_type=grpc_util.ChannelCredsType.LOCAL,
        samples_per_plugin={"mpwatch": 0},
    )
    ingester.start()
    try:
        provider = ingester.data_provider
        deadline = time.monotonic() + 60
        while True:  # the server loads the logdir in the background
            listed = provider.list_tensors(
                CTX,
                experiment_id="",
                plugin_name=contract.PLUGIN_NAME,
                run_tag_filter=tb_provider.RunTagFilter(runs=[run]),
            ).get(run, {})
            if listed.get(contract.record_tag(contract.KIND_PROBE)) is not None and (
                listed[contract.record_tag(contract.KIND_PROBE)].max_step >= max_step
            ):
                break
            assert time.monotonic() < deadline, "the data server never loaded the run"
            time.sleep(0.25)
        yield provider
    finally:
        ingester._stdin_handle.close()  # the server runs with --die-after-stdin


def test_a_split_record_reaches_the_tab_whole(tmp_path, read_events):
    """Under TensorBoard's Python loader every part of the split probe is served: the tab's Run
    joins them as the reader does, and the views show the probe at step 20."""
    from tensorboard_plugin_mpwatch import data

    truth = write_split_probe_run(str(tmp_path / "split"))
    _, raw = read_events(str(tmp_path / "split"))
    parts = [p for s, p in raw[contract.KIND_PROBE] if s == 20]
    assert len(parts) >= 3 and parts[0]["parts"] == len(parts)  # really written in parts
    assert [p.get("part", 0) for p in parts] == list(range(len(parts)))

    records = data.read_run(_provider(str(tmp_path)), CTX, "", "split")
    assert records.errors == []
    assert len([s for s, _ in records.records[contract.KIND_PROBE] if s == 20]) == len(parts)
    model = data.build_model(records)
    direct = load_run(str(tmp_path / "split"))
    pd.testing.assert_frame_equal(model.probe_variables, direct.probe_variables)
    latest = model.latest_probe()
    assert latest.step == 20 and latest.variables["variable"].tolist() == truth["variables"]
    assert latest.histogram is not None and latest.model["underflow_fraction"] == 0.03
    assert data.layers_view(model, [])["probe_step"] == 20
    view = data.probes_view(model, None)
    assert view["steps"] == [15, 20] and view["probe"]["step"] == 20
    assert view["probe"]["model"]["underflow_fraction"] == 0.03
    assert view["heatmap"]["steps"] == [15, 20]


def test_a_split_record_under_tensorboards_data_server_is_reported(tmp_path):
    """TensorBoard's data server keeps one value per tag and step: only the last part of the split
    probe arrives. The tab says so and does not let the fragment stand in for the probe: the
    latest probe it shows is the complete one at step 15."""
    from tensorboard_plugin_mpwatch import data

    write_split_probe_run(str(tmp_path / "split"))
    with data_server_provider(str(tmp_path), "split", 20) as provider:
        records = data.read_run(provider, CTX, "", "split")
    at_20 = [p for s, p in records.records.get(contract.KIND_PROBE, []) if s == 20]
    assert at_20 == []  # the fragment is left out
    assert len(records.errors) == 1 and "parts of a split record" in records.errors[0]
    assert "step 20" in records.errors[0] and "--load_fast=false" in records.errors[0]
    model = data.build_model(records)
    assert model.latest_probe().step == 15
    assert data.probes_view(model, None)["steps"] == [15]
    assert data.layers_view(model, [])["probe_step"] == 15
    assert data.info_view(model)["errors"] == records.errors  # the tab shows them


# --- the tab's cache ----------------------------------------------------------------------------
def _write_record_event(run_dir: str, kind: str, step: int, wall_time: float, payload: dict):
    """One mpwatch record event with a given wall time (TensorBoard's own event writer)."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    from tensorboard.util import tensor_util

    metadata = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name=contract.PLUGIN_NAME, content=contract.metadata_content(kind)
        ),
        data_class=summary_pb2.DATA_CLASS_TENSOR,
    )
    value = summary_pb2.Summary.Value(
        tag=contract.record_tag(kind),
        metadata=metadata,
        tensor=tensor_util.make_tensor_proto(np.array(contract.encode_payload(payload))),
    )
    writer = EventFileWriter(run_dir)
    writer.add_event(
        event_pb2.Event(wall_time=wall_time, step=step, summary=summary_pb2.Summary(value=[value]))
    )
    writer.close()


def test_a_late_record_at_the_same_step_and_wall_time_is_served(tmp_path, monkeypatch):
    """The tab's cache follows the run's content, not its last step and wall time: a record added
    at the step and wall time of the run's last record changes nothing TensorBoard lists, and is
    still served."""
    from tensorboard.data import provider as tb_provider
    from tensorboard.plugins import base_plugin
    from tensorboard_plugin_mpwatch import plugin as plugin_module
    from werkzeug.test import Client

    monkeypatch.setattr(plugin_module, "CHECK_TTL_S", 0.0)
    monkeypatch.setattr(plugin_module, "LISTING_TTL_S", 0.0)
    run_dir = str(tmp_path / "live")
    w = write_synthetic_run(run_dir, steps=5, close=False)
    w.record(contract.KIND_NOTICE, 5, {"part": "probe", "level": "info", "message": "first"})
    w.close()
    muxes: list = []
    provider = _provider(str(tmp_path), multiplexer=muxes)
    tab = plugin_module.MpwatchPlugin(base_plugin.TBContext(data_provider=provider))
    apps = tab.get_plugin_apps()

    def get(route, **params):
        response = Client(apps[f"/{route}"]).get("/", query_string=params)
        assert response.status_code == 200, response.get_data(as_text=True)
        return json.loads(response.get_data(as_text=True))

    before = get("findings", run="live")
    assert [n["message"] for n in before["notices"]] == ["first"]
    version = get("runs")["runs"][0]["version"]
    served = provider.read_tensors(
        CTX,
        experiment_id="",
        plugin_name=contract.PLUGIN_NAME,
        downsample=100,
        run_tag_filter=tb_provider.RunTagFilter(tags=[contract.record_tag(contract.KIND_NOTICE)]),
    )["live"][contract.record_tag(contract.KIND_NOTICE)]
    step, wall = served[-1].step, served[-1].wall_time
    time.sleep(1.1)  # event file names start with the second: the new file sorts after the first
    late = {"part": "probe", "level": "error", "message": "late"}
    _write_record_event(run_dir, contract.KIND_NOTICE, step, wall, late)
    muxes[0].Reload()
    assert len(os.listdir(run_dir)) == 2
    assert get("runs")["runs"][0]["version"] == version  # TensorBoard's listing did not change
    after = get("findings", run="live")
    assert [n["message"] for n in after["notices"]] == ["first", "late"]
    assert [n["step"] for n in after["notices"]] == [5, 5]
    again = get("findings", run="live")
    assert again == after
    entry = next(iter(tab._cache.values()))
    assert get("layers", run="live")["run"] == "live" and "layers" in entry.views  # reused


def test_a_gpu_trace_shows_device_time_and_both_tensor_core_shares(tmp_path, read_events):
    if not os.path.isfile(GPU_TRACE):
        pytest.skip("the H100 trace is not here")
    from tensorboard_plugin_mpwatch import data

    write_gpu_run(str(tmp_path / "gpu"))
    _, records = read_events(str(tmp_path / "gpu"))  # TensorBoard's loader, not mpwatch's
    record = records[contract.KIND_PROFILE][-1][1]
    kl = record["kernel_layers"]
    truth = pd.DataFrame(kl["data"], columns=kl["columns"]).set_index("layer")
    model = data.build_model(data.read_run(_provider(str(tmp_path)), CTX, "", "gpu"))
    layers = data.layers_view(model, [])
    json.dumps(layers, allow_nan=False)
    assert layers["time_source"] == "device_kernels"
    rows = {r[0]: dict(zip(layers["columns"], r)) for r in layers["rows"]}
    # the two recorded layers first, then the layers only the profile knows (a model's others)
    assert [r[0] for r in layers["rows"]][:2] == ["conv2d", "batch_normalization"]
    assert {"conv2d_1", "conv2d_2", "batch_normalization_2"} <= set(rows)
    for name, row in rows.items():
        total = record["kernel_summary"]["total_us"]
        assert row["time_share"] == pytest.approx(truth.loc[name, "time_us"] / total), name
        assert row["tensor_core_share"] == pytest.approx(truth.loc[name, "tensor_core_share"])
    view = data.profile_view(model)
    json.dumps(view, allow_nan=False)
    s = view["summary"]
    k = record["kernel_summary"]
    assert s["source"] == "device_kernels" and "kernel" in s["label"]
    assert s["tensor_core_share"] == pytest.approx(k["tensor_core_share"])
    assert s["xprof_tensor_core_share"] == pytest.approx(0.125, abs=0.005)
    # the precisions the record holds (from each kernel's HLO since #26: float16 matrix math,
    # mixed for BatchNormalization's float16 reads with float32 statistics, ...), the tab's the same
    recorded = {p: v for p, v in k["by_precision_share"].items() if v}
    assert s["by_precision_share"] == pytest.approx(recorded)
    assert "float16" in recorded and recorded.get("unknown", 0.0) <= 0.03
    assert s["unknown_share"] == pytest.approx(k.get("unknown_share", 0.0))
    assert s["total_us"] == pytest.approx(k["total_us"])


def test_a_cpu_profile_is_labelled_host_ops(synthetic_logdir):
    from tensorboard_plugin_mpwatch import data

    model = data.build_model(data.read_run(_provider(synthetic_logdir), CTX, "", "run_b"))
    s = data.profile_view(model)["summary"]
    assert s["source"] == "host_ops" and "layer's dtype" in s["label"]
    assert s["share_16bit"] == 0.9 and "tensor_core_share" not in s
    layers = data.layers_view(model, [])
    assert layers["time_source"] == "host_ops"
    tc = layers["columns"].index("tensor_core_share")
    assert all(r[tc] is None for r in layers["rows"])
