"""Issue 24, item 7: the "Mixed Precision" tab gives the findings ``mpwatch diagnose LOGDIR`` gives.

The CLI judges a logdir's runs together: a mixed run is compared with a float32 run of the same
model (``mixed-vs-float32``), and that measured comparison replaces the mixed run's
``no-tensor-cores`` guess. The tab must show the same findings, run by run. Ground truth is
the CLI's own JSON (``mpwatch diagnose LOGDIR --format json``, run as a subprocess), compared with
what a real ``tensorboard`` process serves and what headless Chromium shows.

The logdir: the real mixed_float16 fit of ``quickstart_logdir`` (on this CPU, without a float32
twin: it keeps its ``no-tensor-cores`` warning), a mixed_float16 run and a float32 run of one
model on a CPU, written with ``RunWriter`` (the mixed run 3.8x slower: measured, not guessed), and
a real JAX fit under ``keras.distribution.ModelParallel`` on 4 host devices (``dist_runs``: its
forced overflows make skipped-step findings).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from builders import LAYER_COLUMNS, layer_rows, run_info
from test_plugin_server import Tab, serving

from mpwatch import contract
from mpwatch.record.runtime.writer import RunWriter

RUNS = ["cpu_fp32", "cpu_mixed", "fit", "jax_model_parallel"]


def write_cpu_run(path: str, policy: str, step_ms: float, memory_mb: float) -> None:
    """One run of the builders' four-layer model on a CPU: run facts, the layer table, step time,
    peak memory and a falling training loss at steps 10..200 (and, when mixed, the loss scale)."""
    w = RunWriter(path)
    w.record(contract.KIND_RUN_INFO, 0, run_info(policy, batch_size=32, tc=False))
    w.record(contract.KIND_LAYERS, 1, {"layers": contract.table(LAYER_COLUMNS, layer_rows(policy))})
    if policy.startswith("mixed_"):
        steps = list(range(1, 201))
        w.scalar_series(contract.LOSS_SCALE, steps, [32768.0] * len(steps))
        w.scalar_series(contract.STEP_SKIPPED, steps, [0.0] * len(steps))
    for s in range(10, 201, 10):
        w.scalars(
            s,
            {
                contract.TRAIN_LOSS: 2.0 / s,
                contract.STEP_TIME_MS: step_ms,
                contract.PEAK_MEMORY_MB: memory_mb,
            },
        )
    w.close()


def cli_json(logdir: str, *args: str) -> dict:
    """``mpwatch diagnose LOGDIR --format json`` in its own process, parsed."""
    exe = os.path.join(os.path.dirname(sys.executable), "mpwatch")
    cmd = [exe] if os.path.exists(exe) else [sys.executable, "-m", "mpwatch"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="-1")
    proc = subprocess.run(
        [*cmd, "diagnose", logdir, "--format", "json", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def shown(finding: dict) -> dict:
    """What the tab shows of a finding (its card)."""
    return {k: finding[k] for k in ("severity", "title", "rule", "layer", "evidence")}


def finding_cards(tab: Tab) -> list[dict]:
    """The finding cards the tab shows for its run, as :func:`shown` gives a finding."""
    return tab.frame.locator("#mpw-findings article.mpw-finding").evaluate_all(
        """(cards) => cards.map((c) => {
            const text = (sel) => {
                const e = c.querySelector(sel);
                return e ? e.textContent : null;
            };
            const layer = text('.mpw-finding-layer');
            return {severity: text('.mpw-badge'), title: text('strong'),
                    rule: c.dataset.rule,
                    layer: layer === null ? null : layer.replace(/^layer /, ''),
                    evidence: text('.mpw-evidence')};
        })"""
    )


@pytest.fixture(scope="module")
def logdir(tmp_path_factory, quickstart_logdir, dist_runs):
    root = tmp_path_factory.mktemp("tab_vs_cli")
    shutil.copytree(quickstart_logdir, root / "fit")
    shutil.copytree(dist_runs[0] / "model_parallel", root / "jax_model_parallel")
    write_cpu_run(str(root / "cpu_mixed"), "mixed_float16", step_ms=38.0, memory_mb=400.0)
    write_cpu_run(str(root / "cpu_fp32"), "float32", step_ms=10.0, memory_mb=800.0)
    return str(root)


@pytest.fixture(scope="module")
def truth(logdir):
    """The CLI's findings, by run, in the CLI's order."""
    doc = cli_json(logdir)
    assert sorted(r["name"] for r in doc["runs"]) == RUNS
    by_run: dict[str, list[dict]] = {run: [] for run in RUNS}
    for f in doc["findings"]:
        by_run[f["run"]].append(shown(f))
    return by_run


def test_the_logdir_is_one_the_cli_judges_differently_from_each_run_alone(logdir, truth):
    """The pair changes the mixed run's findings: compared, not guessed. Judged alone (``--run``,
    what the tab used to do) the same run gets the device guess and no comparison."""
    rules = {run: [f["rule"] for f in found] for run, found in truth.items()}
    assert "mixed-vs-float32" in rules["cpu_mixed"] and "no-tensor-cores" not in rules["cpu_mixed"]
    compared = next(f for f in truth["cpu_mixed"] if f["rule"] == "mixed-vs-float32")
    assert "'cpu_fp32'" in compared["title"] and compared["severity"] == "warning"
    assert "no-tensor-cores" in rules["fit"]  # a real fit with no float32 twin
    alone = [f["rule"] for f in cli_json(logdir, "--run", "cpu_mixed")["findings"]]
    assert "no-tensor-cores" in alone and "mixed-vs-float32" not in alone


def test_the_plugin_routes_serve_the_clis_findings(logdir, truth):
    """In process, over TensorBoard's Python loader: each run's ``findings`` route is its share of
    the CLI's findings, in the CLI's order; the layer table's badges are its layer findings."""
    from tensorboard.plugins import base_plugin
    from tensorboard_plugin_mpwatch import plugin as plugin_module
    from test_plugin import _provider
    from werkzeug.test import Client

    tab = plugin_module.MpwatchPlugin(base_plugin.TBContext(data_provider=_provider(logdir)))
    apps = tab.get_plugin_apps()

    def get(route: str, **params: str) -> dict:
        response = Client(apps[f"/{route}"]).get("/", query_string=params)
        assert response.status_code == 200, response.get_data(as_text=True)
        return json.loads(response.get_data(as_text=True))

    assert sorted(r["name"] for r in get("runs")["runs"]) == RUNS
    for run in RUNS:
        view = get("findings", run=run)
        assert view["note"] is None
        assert [shown(f) for f in view["findings"]] == truth[run], run
        badges = get("layers", run=run)["badges"]
        served = {(layer, b["rule"], b["title"]) for layer, bs in badges.items() for b in bs}
        assert served == {(f["layer"], f["rule"], f["title"]) for f in truth[run] if f["layer"]}


@pytest.fixture(scope="module")
def server(logdir):
    with serving(logdir, RUNS, "tensorboard-tab-vs-cli.log") as srv:
        yield srv


@pytest.mark.browser
def test_the_tab_shows_the_clis_findings_run_by_run(browser, server, truth):
    """Every run, selected in the tab: its finding cards (severity, title, rule, layer, evidence,
    in order) are the CLI's findings of that run."""
    tab = Tab(browser, server)
    try:
        for run in RUNS:
            tab.select_run(run)
            assert finding_cards(tab) == truth[run], run
        assert tab.errors == []
    finally:
        tab.close()


def test_the_tab_shows_notices_as_plain_text():
    """Keras wraps an exception's message in terminal escapes; the tab's notices are plain text."""
    from tensorboard_plugin_mpwatch import data

    from mpwatch.read import Run

    run = Run(name="r", path="/logs/r")
    keras_style = "ValueError: Exception encountered.\n\n\x1b[1mboom\x1b[0m\n\nArguments received"
    run.notices = [{"step": 3, "part": "probe", "level": "error", "message": keras_style}]
    (notice,) = data.info_view(run)["notices"]
    assert notice == {
        "step": 3,
        "part": "probe",
        "level": "error",
        "message": "ValueError: Exception encountered.\n\nboom\n\nArguments received",
    }


@pytest.mark.browser
def test_the_tab_writes_numbers_as_the_cli_does(browser, server, logdir, read_events):
    """The real fit's probe facts and loss-scale caption, in the tab, spelled as mpwatch.words
    spells them (the CLI's ``2^15 (32768)``, never ``32,768``): each checked against the values
    in the event files, read here."""
    from mpwatch import words

    scalars, records = read_events(os.path.join(logdir, "fit"))
    scales = [v for _, v in sorted(scalars[contract.LOSS_SCALE])]
    probes = [p for _, p in sorted(records[contract.KIND_PROBE], key=lambda r: r[0])]
    latest = {**probes[-1]["model"], "loss_scale": probes[-1]["loss_scale"]}
    tab = Tab(browser, server)
    try:
        tab.select_run("fit")
        facts = tab.frame.locator(".mpw-facts .mpw-fact").all_text_contents()
        assert f"loss scale: {words.loss_scale(latest['loss_scale'])}" in facts, facts
        assert f"underflow: {words.percent(latest['underflow_fraction'])}" in facts, facts
        caption = tab.frame.locator("#mpw-loss-scale-caption").text_content()
        assert f"last {words.loss_scale(scales[-1])}" in caption, caption
        assert "32,768" not in caption and "32,768" not in " ".join(facts)
        assert tab.errors == []
    finally:
        tab.close()
