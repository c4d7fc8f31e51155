"""The TensorBoard tab's loader and data layer, in-process (no TensorBoard server, no browser).

Ground truth: runs written with :class:`mpwatch.RunWriter` with known values, and the
reader's own :func:`mpwatch.load_run` of the same event files (the tab and the CLI see one Run).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from tensorboard.context import RequestContext

from mpwatch import contract
from mpwatch.contract import table
from mpwatch.record.writer import RunWriter

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
            [[f"{n}/kernel", n, 10, 10, 0, 0.0, 1e-3] for n in layers],
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
def _provider(logdir: str):
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard_plugin_mpwatch.loader import MpwatchLoader

    flags = argparse.Namespace(samples_per_plugin={})
    MpwatchLoader().fix_flags(flags)
    multiplexer = plugin_event_multiplexer.EventMultiplexer(
        tensor_size_guidance=flags.samples_per_plugin
    )
    multiplexer.AddRunsFromDirectory(logdir)
    multiplexer.Reload()
    return data_provider.MultiplexerDataProvider(multiplexer, logdir)


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

    from mpwatch.read import run as reader

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
    for view in (
        data.scalars_view(records, 100),
        data.layers_view(records, []),
        data.probes_view(records, data.build_model(records), None),
        data.profile_view(records),
    ):
        json.dumps(view, allow_nan=False)  # raises on NaN/Infinity
    scalars = data.scalars_view(records, 100)
    assert scalars["skipped_steps"] == [7, 8]
    assert scalars["series"][contract.LOSS_SCALE]["values"][-1] == 32768.0 / 4
    nonfinite = scalars["series"][contract.GRAD_NONFINITE_COUNT]["values"]
    assert nonfinite[6] is None and nonfinite[0] == 0.0  # inf -> null
    layers = data.layers_view(records, [])
    names = [r[0] for r in layers["rows"]]
    assert names == ["dense_1", XSS_LAYER, "out"]
    share = layers["columns"].index("time_share")
    assert layers["profiled"] is True
    assert [r[share] for r in layers["rows"]] == pytest.approx([1 / 6, 2 / 6, 3 / 6])
    assert data.profile_view(records)["profile"]["share_16bit"] == 0.9
    model = data.build_model(records)
    probes = data.probes_view(records, model, 30)
    assert probes["probe"]["step"] == 30
    assert probes["probe"]["model"]["grad_rel_error"] is None
    latest = data.probes_view(records, model, None)
    assert latest["probe"]["step"] == 60
    assert latest["heatmap"]["layers"] == names
    assert latest["heatmap"]["steps"] == [10, 20, 30, 40, 50, 60]
    assert latest["heatmap"]["values"][1] == [0.01] * 6  # layer i has underflow (i % 7) / 100
    with pytest.raises(KeyError):
        data.probes_view(records, model, 31)


def test_skipped_steps_survive_tensorboards_scalar_sampling():
    """TensorBoard keeps 1,000 points per scalar tag: the flag's sample may miss a skipped step, the
    cumulative count's rise still marks it."""
    from tensorboard_plugin_mpwatch.data import skipped_steps

    flag_steps = np.array([1, 10, 20, 30])  # the sample kept none of the skipped steps 12 and 25
    total_steps = np.array([1, 11, 21, 31])
    scalars = {
        contract.STEP_SKIPPED: (flag_steps, np.zeros(4)),
        contract.SKIPPED_STEPS_TOTAL: (total_steps, np.array([0.0, 0.0, 1.0, 2.0])),
    }
    assert skipped_steps(scalars) == ([21, 31], 2)
    scalars[contract.STEP_SKIPPED] = (np.array([12, 25]), np.array([1.0, 1.0]))
    assert skipped_steps(scalars) == ([12, 21, 25, 31], 2)
    assert skipped_steps({}) == ([], 0)


def test_a_new_version_of_a_run_decodes_only_new_records(synthetic_logdir, monkeypatch):
    from tensorboard_plugin_mpwatch import data

    provider = _provider(synthetic_logdir)
    decoded: dict = {}
    first = data.read_run(provider, CTX, "", "run_a", decoded)
    n_records = sum(len(v) for v in first.records.values())
    assert len(decoded) == n_records == 1 + 1 + 24  # run_info, layers, 24 probes
    calls = []
    monkeypatch.setattr(data.summary, "decode_payload", lambda blob: calls.append(blob))
    again = data.read_run(provider, CTX, "", "run_a", decoded)
    assert calls == []
    assert again.records == first.records
