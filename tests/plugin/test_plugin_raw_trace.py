"""The tab over a logdir that holds only a raw profiler trace (the real H100 trace at
``LOGDIR/plugins/profile/<capture>/``, no event file, no mpwatch record): a real TensorBoard
process enables the tab, lists the run, and headless Chromium shows its Profile panel.

Ground truth: xprof's own ``kernel_stats`` table of the trace (``builders.xprof_kernel_stats``),
and the files of the logdir before and after (the tab writes nothing into it).
"""

from __future__ import annotations

import os

import pytest
from builders import H100_TRACE, put_h100_trace, xprof_kernel_stats
from tensorboard_process import running_tensorboard
from test_plugin_server import BOOT_TIMEOUT, Server, Tab, _strict_json

from mpwatch.words import percent

pytest.importorskip("xprof.convert.raw_to_tool_data")


def _files(root) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            st = os.stat(os.path.join(dirpath, n))
            out[os.path.relpath(os.path.join(dirpath, n), root)] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture(scope="module")
def truth():
    if not os.path.isfile(H100_TRACE):
        pytest.skip(f"the H100 trace is not here: {H100_TRACE}")
    t = xprof_kernel_stats(H100_TRACE)
    total = t["total_duration_us"].sum()
    xprof_tc = t.loc[t["is_kernel_using_tensor_core"].astype(bool), "total_duration_us"].sum()
    return {"total_us": total, "xprof_tc": xprof_tc / total}


@pytest.fixture(scope="module")
def trace_server(tmp_path_factory, truth):
    root = tmp_path_factory.mktemp("trace_only")
    logdir = root / "logs"
    put_h100_trace(logdir)
    before = _files(logdir)

    def ready(base):
        srv = Server(int(base.rsplit(":", 1)[1]), str(logdir), None)
        status, body = srv.route("runs")
        return status == 200 and [r["name"] for r in body["runs"]] == ["."]

    with running_tensorboard(
        str(logdir), str(root / "tensorboard.log"), ready, BOOT_TIMEOUT, ("--reload_interval", "1")
    ) as (_, port, proc):
        yield Server(port, str(logdir), proc)
    assert _files(logdir) == before  # the tab wrote nothing into the logdir


def test_the_tab_is_enabled_and_serves_the_traces_profile(trace_server, truth):
    status, _, body = trace_server.get("/data/plugins_listing")
    assert status == 200 and _strict_json(body)["mpwatch"]["enabled"] is True
    status, view = trace_server.route("profile", run=".")
    assert status == 200
    s = view["summary"]
    assert s["source"] == "device_kernels"
    assert s["total_us"] == pytest.approx(truth["total_us"])
    assert s["xprof_tensor_core_share"] == pytest.approx(truth["xprof_tc"])
    assert s["trace"].endswith(os.path.join("plugins", "profile", "2025_01_01_00_00_00"))
    status, found = trace_server.route("findings", run=".")
    assert status == 200
    assert {f["rule"] for f in found["findings"]} <= {
        "profile",
        "tensor-core-use",
        "tensor-core-alignment",
    }
    assert found["findings"] and found["info"] is None


@pytest.mark.browser
def test_the_profile_panel_shows_a_raw_trace(browser, trace_server, truth):
    tab = Tab(browser, trace_server)  # opens the tab and waits for the layer table's rows
    try:
        frame = tab.frame
        frame.wait_for_function(
            "() => document.body.dataset.run === '.' && document.body.dataset.state === 'ready'",
            timeout=30_000,
        )
        frame.wait_for_selector("#mpw-profile .mpw-tc-mpwatch", timeout=30_000)
        assert frame.locator("#mpw-profile-section").is_visible()
        source = frame.locator("#mpw-profile .mpw-profile-source")
        assert source.get_attribute("data-source") == "device_kernels"
        assert "read from the raw trace" in frame.inner_text("#mpw-profile .mpw-profile-trace")
        assert frame.locator(".mpw-tc-xprof").inner_text().endswith(percent(truth["xprof_tc"]))
        time_text = frame.locator("#mpw-profile .mpw-time").inner_text()
        assert time_text.endswith(f"{round(truth['total_us'] / 1000)} ms"), time_text
        assert frame.locator(".mpw-finding").count() >= 1  # the profile's findings
        assert tab.errors == []
    finally:
        tab.close()


def test_in_process_a_record_wins_and_a_keras_run_gains_its_trace(tmp_path, truth):
    """Keras' layout (``train/`` with its event files and the trace) beside a run whose profile
    is a record: the tab lists both; ``train`` shows its trace's profile, ``rec`` its record."""
    import argparse
    import json

    import tensorflow as tf
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from tensorboard_plugin_mpwatch import plugin as plugin_module
    from tensorboard_plugin_mpwatch.loader import MpwatchLoader
    from test_plugin import write_gpu_run
    from werkzeug.test import Client

    logdir = tmp_path / "logs"
    with tf.summary.create_file_writer(str(logdir / "train")).as_default():
        tf.summary.scalar("epoch_loss", 1.0, step=0)  # Keras' own scalar, no mpwatch data
    put_h100_trace(logdir / "train")
    write_gpu_run(str(logdir / "rec"))  # a trace and its record (written with run facts)
    flags = argparse.Namespace(samples_per_plugin={})
    MpwatchLoader().fix_flags(flags)
    mux = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance=flags.samples_per_plugin)
    mux.AddRunsFromDirectory(str(logdir))
    mux.Reload()
    provider = data_provider.MultiplexerDataProvider(mux, str(logdir))
    tab = plugin_module.MpwatchPlugin(
        base_plugin.TBContext(data_provider=provider, logdir=str(logdir))
    )
    apps = tab.get_plugin_apps()

    def get(route, **params):
        response = Client(apps[f"/{route}"]).get("/", query_string=params)
        assert response.status_code == 200, response.get_data(as_text=True)
        return json.loads(response.get_data(as_text=True))

    assert [r["name"] for r in get("runs")["runs"]] == ["rec", "train"]
    train = get("profile", run="train")["summary"]
    assert train["trace"] == str(logdir / "train" / "plugins" / "profile" / "2025_01_01_00_00_00")
    assert train["total_us"] == pytest.approx(truth["total_us"])
    rec = get("profile", run="rec")["summary"]
    assert rec["trace"] is None and rec["total_us"] == pytest.approx(truth["total_us"])
    assert get("findings", run="train")["info"] is None
    assert get("findings", run="rec")["info"]["policy"] == "mixed_float16"
    # the run name picks a scanned run, never a path
    response = Client(apps["/profile"]).get("/", query_string={"run": "../logs/train"})
    assert response.status_code == 404
