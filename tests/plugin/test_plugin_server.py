"""The "Mixed Precision" tab in a real TensorBoard process, and in headless Chromium.

One ``tensorboard --logdir X --host 127.0.0.1 --port P`` subprocess per module over a logdir
holding: the real mixed_float16 fit of ``quickstart_logdir`` (a small CNN with a float16 softmax);
the same kind of fit on Keras' JAX backend (``jax_runs``' softmax case); a real mixed_float16 fit
whose optimizer skips the updates of chosen batches (the truth read from the optimizer by a
callback); a run whose layer is named like an HTML injection; a 1,000-layer run; a run whose latest
probe saw non-finite gradients at loss scale 0; a run still being written; a run whose last probe
is split into parts at one step; a run without mpwatch data.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from tensorboard_process import running_tensorboard
from test_plugin import (
    GPU_TRACE,
    XSS_LAYER,
    probe_payload,
    write_gpu_run,
    write_split_probe_run,
    write_synthetic_run,
)

from mpwatch import contract, words

BOOT_TIMEOUT = 180  # TensorBoard imports TensorFlow: slow on 2 cores
ROUTES = ("scalars", "layers", "probes", "findings", "profile")
RUNS = ["big", "fit", "gpu", "jax", "live", "nan", "skips", "split", "xss"]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _strict_json(text: str):
    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


class Server:
    def __init__(self, port: int, logdir: str, proc: subprocess.Popen) -> None:
        self.port = port
        self.logdir = logdir
        self.proc = proc
        self.base = f"http://127.0.0.1:{port}"

    def get(self, path: str, **params):
        url = self.base + path + ("?" + urllib.parse.urlencode(params) if params else "")
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                return r.status, r.headers.get("Content-Type", ""), r.read().decode("utf-8")
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("Content-Type", ""), e.read().decode("utf-8")

    def route(self, name: str, **params):
        status, ctype, body = self.get(f"/data/plugin/mpwatch/{name}", **params)
        assert ctype.startswith("application/json"), (name, ctype)
        return status, _strict_json(body)


def serving(logdir: str, runs: list[str], log_name: str):
    """A real TensorBoard on ``logdir``, once its ``runs`` route lists exactly ``runs``: a context
    manager giving the :class:`Server` (the module-scoped ``server`` fixtures of the tab tests)."""

    def ready(base: str) -> bool:
        srv = Server(int(base.rsplit(":", 1)[1]), logdir, None)
        status, body = srv.route("runs")
        return status == 200 and sorted(r["name"] for r in body["runs"]) == sorted(runs)

    log_path = os.path.join(logdir, "..", log_name)

    @contextlib.contextmanager
    def cm():
        with running_tensorboard(logdir, log_path, ready, BOOT_TIMEOUT) as (_, port, proc):
            yield Server(port, logdir, proc)

    return cm()


def _wait(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(
                f"tensorboard exited with {proc.returncode} while waiting for {what}"
            )
        try:
            value = predicate()
            if value:
                return value
        except (OSError, ValueError, AssertionError) as e:
            last = e
        time.sleep(0.5)
    raise TimeoutError(f"waited {timeout}s for {what}; last error: {last!r}")


# 0-based batches (of 12, batch size 10) with a huge input: float16 gradients overflow there. None
# is a multiple of log_every=4 minus 1, so the interval counter's steps (4, 8, 12) are not skipped.
OVERFLOW_BATCHES = (2, 5, 6, 9)
SKIP_COLOR = "rgb(217, 48, 37)"  # --mpw-red in style.css


def fit_with_skips(logdir: str, policy) -> dict:
    """A real mixed_float16 fit recorded by the monitor. The truth is the optimizer's own: its
    ``iterations`` after every batch (a skipped update does not advance them) and the scale before
    the first batch, read by a callback, not from mpwatch's record."""
    import keras
    import numpy as np

    import mpwatch

    class Truth(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.iterations, self.scales, self.before = [], [], None

        def on_train_batch_begin(self, batch, logs=None):
            if self.before is None:  # not built before the first train step: its initial_scale
                opt = self.model.optimizer
                built = getattr(opt, "dynamic_scale", None)
                self.before = float(opt.initial_scale if built is None else built.numpy())

        def on_train_batch_end(self, batch, logs=None):
            self.iterations.append(int(self.model.optimizer.iterations.numpy()))
            self.scales.append(float(self.model.optimizer.dynamic_scale.numpy()))

    rng = np.random.default_rng(0)
    x = rng.random((120, 8), dtype=np.float32)
    y = rng.integers(0, 3, 120)
    for b in OVERFLOW_BATCHES:
        x[b * 10] = 1e30
    truth = Truth()
    with policy("mixed_float16"):
        keras.utils.set_random_seed(3)
        model = keras.Sequential(
            [
                keras.Input((8,)),
                keras.layers.Dense(16, activation="relu"),
                keras.layers.Dense(3, activation="softmax", dtype="float32"),
            ]
        )
        model.compile(keras.optimizers.SGD(0.01), "sparse_categorical_crossentropy")
        model.fit(
            x,
            y,
            batch_size=10,
            epochs=1,
            shuffle=False,
            verbose=0,
            callbacks=[mpwatch.MixedPrecisionMonitor(logdir, log_every=4, profile=False), truth],
        )
    its = [0, *truth.iterations]
    skipped = [i + 1 for i in range(len(truth.iterations)) if its[i + 1] == its[i]]
    return {"skipped": skipped, "initial_scale": truth.before, "scales": truth.scales}


def write_nonfinite_probe_run(logdir: str) -> None:
    """A run whose latest probe (step 21) ran at loss scale 0 with NaN gradients: its record still
    holds an underflow of 0 and a recommended scale of 256, which the tab must not present."""
    layers = ["dense", "wide", "out"]
    w = write_synthetic_run(logdir, steps=20, layers=layers, close=False)
    payload = probe_payload(21, layers, 1.0)
    payload["loss_scale"] = 0.0
    payload["recommended_scale"] = 256.0
    payload["histogram"]["window_log2"] = [math.inf, math.inf]  # -24 - log2(0)
    payload["model"].update(
        underflow_fraction=0.0,
        underflow_count=0,
        nonfinite=150,
        size=300,
        first_nonfinite_layer="wide",
        loss=math.nan,
    )
    w.record(contract.KIND_PROBE, 21, payload)
    w.close()


@pytest.fixture(scope="module")
def logdir(tmp_path_factory, quickstart_logdir, policy, jax_runs):
    root = tmp_path_factory.mktemp("tb_logdir")
    shutil.copytree(quickstart_logdir, root / "fit")  # the real fit, as run "fit"
    shutil.copytree(jax_runs[0] / "softmax", root / "jax")  # a real fit on Keras' JAX backend
    skips = fit_with_skips(str(root / "skips"), policy)
    write_nonfinite_probe_run(str(root / "nan"))
    write_synthetic_run(str(root / "xss"), layers=["dense_1", XSS_LAYER, "out"], profile=True)
    write_synthetic_run(
        str(root / "big"),
        steps=120,
        layers=[f"block{i}/dense" for i in range(1000)],
        probe_every=10,
    )
    live = write_synthetic_run(str(root / "live"), steps=20, close=False)
    write_split_probe_run(str(root / "split"))
    if not os.path.isfile(GPU_TRACE):
        pytest.skip("the H100 trace is not here")
    write_gpu_run(str(root / "gpu"))
    import tensorflow as tf

    with tf.summary.create_file_writer(str(root / "plain")).as_default():
        tf.summary.scalar("loss", 1.0, step=1)
    yield {"root": str(root), "live": live, "skips": skips}
    live.close()


@pytest.fixture(scope="module")
def server(logdir):
    def ready(base):
        srv = Server(int(base.rsplit(":", 1)[1]), logdir["root"], None)
        status, body = srv.route("runs")
        names = {r["name"] for r in body["runs"]}
        return status == 200 and set(RUNS) <= names

    log_path = os.path.join(logdir["root"], "..", "tensorboard.log")
    with running_tensorboard(
        logdir["root"], log_path, ready, BOOT_TIMEOUT, ("--reload_interval", "1")
    ) as (_, port, proc):
        yield Server(port, logdir["root"], proc)


# --- the routes ---------------------------------------------------------------------------------
def test_plugins_listing_shows_the_tab_enabled(server):
    status, ctype, body = server.get("/data/plugins_listing")
    assert status == 200
    entry = _strict_json(body)["mpwatch"]
    assert entry["enabled"] is True
    assert entry["tab_name"] == "Mixed Precision"
    assert entry["loading_mechanism"] == {
        "type": "IFRAME",
        "module_path": "/data/plugin/mpwatch/static/index.js",
    }


def test_runs_lists_only_runs_with_mpwatch_data(server):
    status, body = server.route("runs")
    assert status == 200
    assert sorted(r["name"] for r in body["runs"]) == RUNS


@pytest.mark.parametrize("run", RUNS)
def test_every_route_answers_valid_json(server, run):
    for route in ROUTES:
        status, body = server.route(route, run=run)
        assert status == 200, (route, body)
        assert body["run"] == run
    status, body = server.route("scalars", run=run, points=50)
    assert all(len(s["steps"]) <= 52 for s in body["series"].values())
    status, probes = server.route("probes", run=run)
    if probes["steps"]:
        status, body = server.route("probes", run=run, step=probes["steps"][0])
        assert status == 200 and body["probe"]["step"] == probes["steps"][0]


def test_every_probe_record_survives_tensorboard_sampling(server):
    # more probe records than TensorBoard's default sample of 10 for a tensor plugin
    status, body = server.route("probes", run="big")
    assert body["steps"] == list(range(10, 121, 10))  # 12 probes: none sampled away
    assert len(body["heatmap"]["layers"]) == 1000
    from mpwatch import read as reader

    direct = reader.load_run(os.path.join(server.logdir, "fit"))
    status, body = server.route("probes", run="fit")
    assert body["steps"] == sorted(direct.histograms) or body["steps"] == sorted(
        direct.probe_model["step"].tolist()
    )


def test_skip_markers_and_counts_from_a_real_tensorboard(server):
    """run "big": 120 steps, steps 7 and 8 skipped, the interval counter 2 at step 10."""
    status, body = server.route("scalars", run="big", points=50)
    assert body["skipped_steps"] == [7, 8] and body["skipped_total"] == 2
    assert body["skipped_marked_all"] is True
    ls = body["series"][contract.LOSS_SCALE]
    assert (ls["count"], ls["count_exact"], ls["served"]) == (120, True, 120)


def test_skipped_steps_and_first_scale_of_a_real_fit(server, logdir):
    """The real fit: the markers are the steps whose update the optimizer dropped (its own
    iterations), not the interval counter's steps; the loss scale starts before the first step."""
    truth = logdir["skips"]
    assert truth["skipped"] == [b + 1 for b in OVERFLOW_BATCHES]  # the data did overflow there
    status, body = server.route("scalars", run="skips")
    assert status == 200
    assert body["skipped_steps"] == truth["skipped"] and body["skipped_spans"] == []
    assert body["skipped_total"] == len(truth["skipped"]) and body["skipped_marked_all"] is True
    assert body["series"][contract.SKIPPED_STEPS]["steps"] == [4, 8, 12]  # not marked
    ls = body["series"][contract.LOSS_SCALE]
    assert ls["steps"] == list(range(0, 13))
    assert ls["values"] == [truth["initial_scale"], *truth["scales"]]
    assert truth["initial_scale"] == 2.0**15


def test_a_split_record_through_tensorboards_loader(server):
    """TensorBoard's data server (its default loader where the binary runs) keeps one value per tag
    and step: the split probe at step 20 arrives as its last part only, and the tab says so and
    shows the complete probe at step 15. Its Python loader serves every part: the probe is whole."""
    with open(os.path.join(server.logdir, "..", "tensorboard.log"), encoding="utf-8") as f:
        data_server = "Using experimental fast data loading" in f.read()
    _, probes = server.route("probes", run="split")
    _, findings = server.route("findings", run="split")
    _, layers = server.route("layers", run="split")
    if data_server:
        assert probes["steps"] == [15] and layers["probe_step"] == 15
        assert any("parts of a split record" in e for e in findings["errors"])
    else:
        assert probes["steps"] == [15, 20] and layers["probe_step"] == 20
        assert findings["errors"] == []


@pytest.mark.parametrize(
    ("route", "params", "code"),
    [
        ("layers", {}, 400),
        ("layers", {"run": "nope"}, 404),
        ("layers", {"run": "plain"}, 404),
        ("layers", {"run": "../../etc/passwd"}, 404),
        ("scalars", {"run": "fit", "points": "many"}, 400),
        ("scalars", {"run": "fit", "points": "10000000"}, 400),
        ("probes", {"run": "fit", "step": "x"}, 400),
        ("probes", {"run": "fit", "step": "999999"}, 404),
    ],
)
def test_routes_validate_their_parameters(server, route, params, code):
    status, body = server.route(route, **params)
    assert status == code
    assert isinstance(body["error"], str)


def test_static_files_have_explicit_types_and_no_traversal(server):
    status, ctype, body = server.get("/data/plugin/mpwatch/static/index.js")
    assert status == 200 and ctype.startswith("text/javascript")
    assert "export async function render" in body
    status, ctype, _ = server.get("/data/plugin/mpwatch/static/style.css")
    assert status == 200 and ctype.startswith("text/css")
    for path in ("static/..%2Fplugin.py", "static/plugin.py", "static/%2e%2e/loader.py"):
        status, _, body = server.get(f"/data/plugin/mpwatch/{path}")
        assert status == 404 and "import" not in body


def test_frontend_builds_dom_without_html_strings():
    static = os.path.join(
        os.path.dirname(__file__),
        "..",
        "..",
        "tensorboard_plugin",
        "tensorboard_plugin_mpwatch",
        "static",
    )
    for name in os.listdir(static):
        if name.endswith(".js"):
            with open(os.path.join(static, name), encoding="utf-8") as f:
                text = f.read()
            for banned in (
                "innerHTML",
                "outerHTML",
                "insertAdjacentHTML",
                "document.write",
                "eval(",
            ):
                assert banned not in text, (name, banned)
            assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")
            assert "https://" not in text


def test_the_tab_and_the_html_report_share_the_underflow_colour_scale():
    """static/charts.js UNDERFLOW_BINS and mpwatch.show.charts_svg.UNDERFLOW_BINS: same fixed
    thresholds, colours and labels."""
    import re

    from mpwatch.show import charts_svg

    path = os.path.join(
        os.path.dirname(__file__),
        "..",
        "..",
        "tensorboard_plugin",
        "tensorboard_plugin_mpwatch",
        "static",
        "charts.js",
    )
    with open(path, encoding="utf-8") as f:
        text = f.read()
    block = text[text.index("UNDERFLOW_BINS = [") : text.index("];", text.index("UNDERFLOW_BINS"))]
    js = [
        (math.inf if below == "Infinity" else float(below), colour, label)
        for below, colour, label in re.findall(
            r"\{below: ([^,]+), color: '(#[0-9a-f]{6})', label: '([^']+)'\}", block
        )
    ]
    assert js == list(charts_svg.UNDERFLOW_BINS)
    assert f"color: '{charts_svg.NOT_PROBED[0]}', label: '{charts_svg.NOT_PROBED[1]}'" in text


def test_a_run_still_being_written_is_followed(server, logdir):
    status, before = server.route("scalars", run="live")
    assert max(before["series"][contract.LOSS_SCALE]["steps"]) == 20
    writer = logdir["live"]
    writer.scalars(21, {contract.LOSS_SCALE: 1024.0, contract.STEP_SKIPPED: 0.0})
    writer.flush()

    def grown():
        _, body = server.route("scalars", run="live")
        return max(body["series"][contract.LOSS_SCALE]["steps"]) == 21

    _wait(grown, 60, "the live run's new step")


# --- the browser --------------------------------------------------------------------------------
class Tab:
    """TensorBoard's page with the mpwatch tab open; ``frame`` is the plugin's iframe."""

    def __init__(self, browser, server):
        self.page = browser.new_page(viewport={"width": 1400, "height": 1000})
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        self.page.goto(f"{server.base}/#mpwatch", timeout=60_000)
        self.page.wait_for_selector('iframe[src*="plugin_entry.html?name=mpwatch"]', timeout=60_000)
        self.frame = None
        for _ in range(120):  # the frame object appears once its document starts loading
            self.frame = self._find_frame()
            if self.frame is not None:
                break
            self.page.wait_for_timeout(250)
        assert self.frame is not None, "the mpwatch plugin iframe never loaded"
        self.frame.wait_for_selector("#mpw-layer-table tbody tr", timeout=60_000)

    def _find_frame(self):
        for f in self.page.frames:
            if "plugin_entry.html?name=mpwatch" in f.url:
                return f
        return None

    def select_run(self, run: str) -> None:
        self.frame.select_option("#mpw-run", run)
        self.frame.wait_for_function(
            "(run) => document.body.dataset.run === run && document.body.dataset.state === 'ready'",
            arg=run,
            timeout=30_000,
        )

    def close(self) -> None:
        self.page.close()


@pytest.fixture()
def tab(browser, server):
    t = Tab(browser, server)
    yield t
    t.close()


@pytest.mark.browser
@pytest.mark.parametrize("run", ["fit", "jax"])  # trained on Keras' TensorFlow / JAX backend
def test_tab_shows_layers_charts_and_the_float16_softmax_finding(tab, server, logdir, run):
    from mpwatch import read as reader

    tab.select_run(run)
    frame = tab.frame
    direct = reader.load_run(os.path.join(server.logdir, run))
    names = [str(n) for n in direct.layers["name"]]
    table_text = frame.inner_text("#mpw-layer-table")
    for name in names[:50]:
        assert name in table_text
    assert frame.locator(".mpw-count").inner_text().startswith(f"{len(names)} of {len(names)}")
    # charts: loss scale, gradient health, histogram (SVG), heatmap (canvas)
    assert frame.locator("#mpw-loss-scale svg.mpw-chart path.mpw-line").count() == 1
    assert frame.locator("#mpw-health svg.mpw-chart path.mpw-line").count() >= 1
    if direct.histograms:  # the probe ran in this fit
        assert frame.locator("#mpw-histogram svg rect.mpw-bar").count() > 0
        assert frame.locator("#mpw-heatmap canvas").count() == 1
    else:
        assert "no probe results yet" in frame.inner_text("#mpw-histogram")
    # the advisor's float16-output finding, with the fix as code, and as a badge in the table
    outputs = direct.layers[direct.layers["is_output"].fillna(False).astype(bool)]["name"].tolist()
    card = frame.locator('#mpw-findings article[data-rule="output-16bit"]')
    assert card.count() >= 1
    assert outputs[0] in card.first.inner_text()
    assert 'dtype="float32"' in card.first.locator("pre.mpw-fix code").inner_text()
    assert frame.locator("#mpw-layer-table .mpw-badge", has_text="output-16bit").count() >= 1
    # values on hover
    frame.locator("#mpw-loss-scale .mpw-overlay").hover()
    assert "loss scale" in frame.locator(".mpw-tooltip").inner_text()
    assert tab.errors == []


@pytest.mark.browser
def test_layer_names_are_text_never_html(tab):
    tab.select_run("xss")
    frame = tab.frame
    assert XSS_LAYER in frame.inner_text("#mpw-layer-table")
    assert frame.locator('th[data-key="time_share"]').count() == 1  # profiled: time share shown
    # the probe charts of this (synthetic) run: histogram with the float16 window, heatmap
    assert frame.locator("#mpw-histogram svg rect.mpw-bar").count() == 40
    assert frame.locator("#mpw-histogram svg rect.mpw-window").count() == 1
    assert frame.locator("#mpw-heatmap canvas").count() == 1
    assert frame.locator("#mpw-probe-step option").count() == 6
    frame.select_option("#mpw-probe-step", "20")
    frame.wait_for_function("document.querySelector('#mpw-histogram').textContent.length > 0")
    assert frame.locator("#mpw-layer-table img").count() == 0
    assert frame.locator("img").count() == 0
    frame.fill(".mpw-filter", "onerror")
    assert frame.locator("#mpw-layer-table tbody tr").count() == 1
    frame.wait_for_timeout(500)
    assert frame.evaluate("typeof window.__x") == "undefined"
    assert tab.page.evaluate("typeof window.__x") == "undefined"
    assert tab.errors == []


@pytest.mark.browser
def test_a_thousand_layers_are_paged_and_sortable(tab):
    tab.select_run("big")
    frame = tab.frame
    assert frame.locator(".mpw-count").inner_text() == "1000 of 1000 layers"
    assert frame.locator("#mpw-layer-table tbody tr").count() == 50
    frame.locator('th[data-key="params"]').click()  # descending first
    first = frame.locator("#mpw-layer-table tbody tr").first.inner_text()
    assert "block999/dense" in first
    frame.fill(".mpw-filter", "block99")
    # block99, block990..block999
    assert frame.locator(".mpw-count").inner_text() == "11 of 1000 layers"
    assert tab.errors == []


@pytest.mark.browser
def test_the_tab_follows_tensorboards_reload(tab, logdir):
    tab.select_run("live")
    frame = tab.frame
    before = frame.locator("#mpw-status").inner_text()
    writer = logdir["live"]
    writer.scalars(500, {contract.LOSS_SCALE: 2048.0, contract.STEP_SKIPPED: 0.0})
    writer.flush()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        tab.page.locator("app-header-reload button").click()
        try:
            frame.wait_for_function(
                "document.querySelector('#mpw-status').textContent.startsWith('step 500')",
                timeout=3000,
            )
            break
        except Exception:  # noqa: BLE001 - TensorBoard may not have read the new event yet
            continue
    after = frame.locator("#mpw-status").inner_text()
    assert after.startswith("step 500"), (before, after)
    assert tab.errors == []


def _x_scale(chart) -> tuple[float, float, float, float]:
    """Two x ticks of a chart (their x in the SVG's viewBox and the step they are labelled with)."""
    ticks = chart.locator("text.mpw-xtick").evaluate_all(
        "(ts) => ts.map((t) => [Number(t.getAttribute('x')), t.textContent])"
    )
    (x0, s0), (x1, s1) = ticks[0], ticks[-1]
    return x0, float(s0.replace(",", "")), x1, float(s1.replace(",", ""))


@pytest.mark.browser
def test_skip_markers_are_visible_at_exactly_the_optimizers_skipped_steps(tab, logdir):
    """Issue 17, the tab: markers drawn in the skip colour (not the grid's), visible, one at each
    step whose update the optimizer dropped and nowhere else; the loss-scale line from the scale the
    first step used."""
    truth = logdir["skips"]
    tab.select_run("skips")
    chart = tab.frame.locator("#mpw-loss-scale svg.mpw-chart")
    markers = chart.locator("line.mpw-skip")
    assert markers.count() == len(truth["skipped"])
    drawn = markers.evaluate_all(
        """(lines) => lines.map((l) => {
            const cs = getComputedStyle(l);
            const box = l.getBoundingClientRect();
            return {stroke: cs.stroke, opacity: Number(cs.opacity),
                    width: parseFloat(cs.strokeWidth), visibility: cs.visibility,
                    display: cs.display, height: box.height, x: Number(l.getAttribute('x1'))};
        })"""
    )
    grid = chart.locator("line.mpw-gridline").first.evaluate("(l) => getComputedStyle(l).stroke")
    assert grid != SKIP_COLOR
    for m in drawn:
        assert m["stroke"] == SKIP_COLOR, m
        assert m["opacity"] >= 0.5 and m["width"] >= 1, m
        assert m["visibility"] == "visible" and m["display"] != "none", m
        assert m["height"] > 50, m  # across the plot
    # where they are: the chart's own step axis (its tick labels) read back
    x0, s0, x1, s1 = _x_scale(chart)
    steps = [s0 + (m["x"] - x0) * (s1 - s0) / (x1 - x0) for m in drawn]
    assert [round(s) for s in steps] == truth["skipped"]
    assert max(abs(s - round(s)) for s in steps) < 1e-3
    # the loss-scale line starts at step 0 (before the first step) at the initial scale
    d = chart.locator("path.mpw-line").get_attribute("d")
    first_x, first_y = (float(v) for v in d[1:].split("H")[0].split("L")[0].split(","))
    assert s0 + (first_x - x0) * (s1 - s0) / (x1 - x0) == pytest.approx(0.0, abs=1e-3)
    ys = chart.locator("line.mpw-gridline").evaluate_all(
        "(ls) => ls.map((l) => Number(l.getAttribute('y1')))"
    )
    labels = chart.locator("text.mpw-ytick").all_text_contents()
    (ya, la), (yb, lb) = (ys[0], labels[0]), (ys[-1], labels[-1])
    la, lb = float(la.removeprefix("2^")), float(lb.removeprefix("2^"))
    assert la + (first_y - ya) * (lb - la) / (yb - ya) == pytest.approx(
        math.log2(truth["initial_scale"]), abs=1e-2
    )
    caption = tab.frame.inner_text("#mpw-loss-scale .mpw-caption")
    assert caption.startswith(f"{len(truth['skipped'])} skipped step(s), each marked in red")
    assert "loss scale 2^15 (32768) from step 0" in caption
    tab.page.screenshot(path=os.path.join(logdir["root"], "..", "tab-skips.png"), full_page=True)
    assert tab.errors == []


@pytest.mark.browser
def test_every_heatmap_row_is_labelled_on_an_absolute_scale(tab, server):
    """1,000 layers: every row has its label (the panel scrolls); cells are coloured by fixed
    thresholds of the underflow fraction (the legend's), not relative to the largest value."""
    tab.select_run("big")
    frame = tab.frame
    _, probes = server.route("probes", run="big")
    heat = probes["heatmap"]
    labels = frame.locator("#mpw-heatmap .mpw-heatmap-label")
    assert labels.count() == len(heat["layers"]) == 1000
    assert labels.all_text_contents() == heat["layers"]
    scroll = frame.locator("#mpw-heatmap .mpw-heatmap-scroll")
    canvas_rows = frame.locator("#mpw-heatmap canvas.mpw-heatmap-canvas")
    for r in (0, 48, 49, 500, 999):
        label = labels.nth(r)
        label.scroll_into_view_if_needed()
        box, view = label.bounding_box(), scroll.bounding_box()
        assert box["height"] >= 12 and box["width"] > 50, (r, box)
        assert view["y"] - 1 <= box["y"], (r, box, view)  # inside the scrolled panel
        assert box["y"] + box["height"] <= view["y"] + view["height"] + 1, (r, box, view)
        assert label.evaluate("(l) => getComputedStyle(l).visibility") == "visible"
        assert float(label.evaluate("(l) => parseFloat(getComputedStyle(l).fontSize)")) >= 10
    # TensorBoard's reload re-fetches the views: the panel stays where the user scrolled it
    top = scroll.evaluate("(s) => s.scrollTop")
    assert top > 0
    before = frame.locator("#mpw-status").inner_text()
    tab.page.wait_for_timeout(1100)  # the status shows the time to the second
    tab.page.locator("app-header-reload button").click()
    frame.wait_for_function(
        "(b) => document.querySelector('#mpw-status').textContent !== b", arg=before, timeout=30_000
    )
    assert scroll.evaluate("(s) => s.scrollTop") == top
    # the legend: fixed, logarithmic thresholds
    legend = frame.locator("#mpw-heatmap .mpw-heatmap-legend .mpw-legend-item")
    assert legend.all_inner_texts() == ["0", "< 0.1%", "0.1–1%", "1–10%", "≥ 10%", "not probed"]
    swatch = legend.locator(".mpw-swatch").evaluate_all(
        "(ss) => ss.map((s) => getComputedStyle(s).backgroundColor)"
    )

    def bin_of(v):  # the thresholds, as the legend states them
        if v is None:
            return 5
        return 0 if v <= 0 else 1 if v < 1e-3 else 2 if v < 1e-2 else 3 if v < 1e-1 else 4

    # every cell of the latest probe step (one canvas pixel per cell) is its bin's legend colour
    last = len(heat["steps"]) - 1
    pixels = canvas_rows.first.evaluate(
        """(c, col) => {
            const d = c.getContext('2d').getImageData(col, 0, 1, c.height).data;
            const out = [];
            for (let i = 0; i < d.length; i += 4) {
                out.push(`rgb(${d[i]}, ${d[i + 1]}, ${d[i + 2]})`);
            }
            return out;
        }""",
        last,
    )
    values = [row[last] for row in heat["values"][: len(pixels)]]
    assert max(values) == pytest.approx(0.06) and bin_of(0.06) == 3  # the largest is not darkest
    assert pixels == [swatch[bin_of(v)] for v in values]
    assert tab.errors == []


@pytest.mark.browser
def test_histogram_panel_is_honest_when_gradients_are_not_finite(tab):
    """Loss scale 0 and NaN gradients: the probe record still says underflow 0 and a recommended
    scale of 256; the panel says the gradients were not finite and recommends nothing."""
    tab.select_run("nan")
    frame = tab.frame
    text = frame.inner_text("#mpw-histogram-section")
    assert (
        "The gradients were not finite at this probe (150 of 300 elements inf or NaN, first at "
        "layer wide); the loss scale had fallen to 0" in text
    )
    assert "no loss scale is recommended from this probe" in text
    assert "doublings headroom): none" in text and "underflow: not measured" in text
    assert "256" not in text and "underflow: 0%" not in text
    assert frame.locator("#mpw-histogram svg rect.mpw-window").count() == 0  # no window at S = 0
    assert tab.errors == []


@pytest.mark.browser
def test_a_gpu_trace_shows_both_tensor_core_shares_and_device_time(tab, server):
    from mpwatch import read as reader

    direct = reader.load_run(os.path.join(server.logdir, "gpu"))
    k = direct.profile_kernels
    tab.select_run("gpu")
    frame = tab.frame
    frame.wait_for_selector("#mpw-profile .mpw-tc-mpwatch", timeout=30_000)
    assert frame.locator("#mpw-profile-section").is_visible()
    source = frame.locator("#mpw-profile .mpw-profile-source")
    assert source.get_attribute("data-source") == "device_kernels"
    assert "GPU kernels" in source.inner_text()
    # mpwatch's share beside xprof's, the unknown share: the record's numbers, as the tab rounds
    assert (
        frame.locator(".mpw-tc-mpwatch")
        .inner_text()
        .endswith(f"{round(100 * k['tensor_core_share'], 1)}%")
    )
    assert frame.locator(".mpw-tc-xprof").inner_text().endswith("12.5%")
    # (the server's words, as the CLI writes them: two significant digits under 1%)
    assert frame.locator(".mpw-unknown").inner_text().endswith(words.percent(k["unknown_share"]))
    assert "xprof's name list" in frame.locator(".mpw-tc-why").inner_text()
    # the precision bar: each segment's rendered width is its share of the bar, its legend the
    # tab's pct (three significant digits). Issue 26: every kernel's precision from its HLO (the
    # XLA fusions float16, float32 or mixed), none unknown where the kernel names left 20.5%
    bar = frame.locator(".mpw-precision-bar").bounding_box()
    legend = frame.inner_text(".mpw-precision-legend")
    assert k["unknown_share"] == 0
    assert frame.locator('.mpw-precision-bar .mpw-seg[data-precision="unknown"]').count() == 0
    for precision in ("float16", "mixed"):
        seg = frame.locator(f'.mpw-precision-bar .mpw-seg[data-precision="{precision}"]')
        box = seg.bounding_box()
        share = k["by_precision_share"][precision]
        assert box["width"] / bar["width"] == pytest.approx(share, abs=0.01), precision
        label = f"{float(f'{100 * share:.3g}'):g}%"
        assert f"{precision} {label}" in legend, precision
    # the layer table's time column is the device time, with each layer's Tensor Core share
    head = frame.locator("#mpw-layer-table thead th")
    labels = [head.nth(i).get_attribute("data-key") for i in range(head.count())]
    assert frame.locator('th[data-key="time_share"]').inner_text().startswith("GPU time")
    assert "tensor_core_share" in labels
    kl = direct.profile_kernel_layers.set_index("layer")
    row = frame.locator("#mpw-layer-table tbody tr", has_text="conv2d_2").first
    cells = row.locator("td")
    for key, column in (("tensor_core_share", "tensor_core_share"), ("time_share", "share")):
        shown = cells.nth(labels.index(key)).inner_text()
        assert shown.endswith("%"), (key, shown)
        want = kl.loc["conv2d_2", column]
        assert float(shown[:-1]) / 100 == pytest.approx(want, rel=5e-3), (key, shown, want)
    # a CPU profile says what its figures are, and has no Tensor Core column
    tab.select_run("xss")
    source = frame.locator("#mpw-profile .mpw-profile-source")
    assert source.get_attribute("data-source") == "host_ops"
    assert frame.locator('th[data-key="tensor_core_share"]').count() == 0
    assert frame.locator('th[data-key="time_share"]').inner_text().startswith("time share (host")
    # a run without a profile has no profile panel
    tab.select_run("big")
    assert not frame.locator("#mpw-profile-section").is_visible()
    assert tab.errors == []
