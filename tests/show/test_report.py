"""mpwatch.show.report: every format, the JSON schema, and the HTML page in headless Chromium."""

from __future__ import annotations

import json
import math
import os
import re

import jsonschema
import pytest
from builders import write_float32_run, write_mixed_run, write_plain_scalars

from mpwatch import contract
from mpwatch.judge import diagnose_runs
from mpwatch.read import load_runs
from mpwatch.record.runtime.writer import RunWriter
from mpwatch.show import report, summary

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    write_mixed_run(str(root / "mixed"))
    write_float32_run(str(root / "fp32"))
    # a layer name that would break naive HTML
    w = RunWriter(str(root / "<script>alert(1)</script>"))
    w.scalars(1, {contract.LOSS_SCALE: 2.0})
    w.close()
    runs = load_runs(str(root))
    return str(root), runs, diagnose_runs(runs)


def test_json_follows_the_schema(two_runs):
    root, runs, findings = two_runs
    text = report.render(runs, findings, "json", logdir=root)
    doc = json.loads(text)
    jsonschema.validate(doc, report.JSON_SCHEMA)
    jsonschema.Draft202012Validator.check_schema(report.JSON_SCHEMA)
    assert doc["schema"] == "mpwatch.diagnosis/1" and doc["has_data"] is True
    assert [r["name"] for r in doc["runs"]] == sorted(runs)
    mixed = next(r for r in doc["runs"] if r["name"] == "mixed")
    assert mixed["summary"]["final_loss_scale"] == 1024.0
    assert mixed["summary"]["skipped_steps"] == 25 and mixed["summary"]["probes"] == 2
    assert doc["counts"]["error"] == sum(1 for f in findings if f.severity == "error") >= 1
    out = [f for f in doc["findings"] if f["rule"] == "output-16bit"]
    assert out and out[0]["layer"] == "predictions"


def test_json_schema_rejects_a_broken_document(two_runs):
    root, runs, findings = two_runs
    doc = report.to_json(runs, findings, root)
    doc["findings"][0]["severity"] = "fatal"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, report.JSON_SCHEMA)


def test_text_and_color(two_runs):
    root, runs, findings = two_runs
    plain = report.render(runs, findings, "text", logdir=root)
    assert "\x1b[" not in plain
    assert "ERROR" in plain and "predictions" in plain and 'dtype="float32"' in plain
    colored = report.render(runs, findings, "text", logdir=root, color=True)
    assert "\x1b[1;31mERROR" in colored


def test_markdown(two_runs):
    root, runs, findings = two_runs
    md = report.render(runs, findings, "markdown", logdir=root)
    assert md.startswith("# mpwatch diagnosis")
    assert "| run | policy |" in md and "```python" in md
    assert "<script>" not in md  # the run name is escaped


def test_no_data_is_said_plainly(tmp_path):
    write_plain_scalars(str(tmp_path))
    runs = load_runs(str(tmp_path))
    for fmt in ("text", "markdown", "html"):
        out = report.render(runs, [], fmt, logdir=str(tmp_path))
        assert "no mpwatch data" in out
    doc = json.loads(report.render(runs, [], "json", logdir=str(tmp_path)))
    jsonschema.validate(doc, report.JSON_SCHEMA)
    assert doc["has_data"] is False and doc["findings"] == []


def test_html_is_self_contained_and_escaped(two_runs):
    root, runs, findings = two_runs
    page = report.render(runs, findings, "html", logdir=root)
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script" not in page  # no JavaScript at all
    # nothing fetched: no external resource (a finding's source may cite a URL as text)
    assert not re.search(r"""(src|href|xlink:href)\s*=\s*["']?(https?:)?//""", page)
    assert "url(" not in page and "@import" not in page and "<link" not in page
    assert page.count("<svg") >= 8  # 4 charts per run with data


# tests/builders.write_mixed_run: steps 1-5 (warm-up) and every 20th step skipped
SKIPPED = [1, 2, 3, 4, 5, *range(20, 401, 20)]


def _assert_skip_marks(chart, expected: list[int]) -> None:
    """One red line per skipped step, visible, at its step on the chart's own axis."""
    marks = chart.locator("line.mark")
    drawn = marks.evaluate_all(
        """(ls) => ls.map((l) => {
            const cs = getComputedStyle(l);
            return {stroke: cs.stroke, opacity: Number(cs.strokeOpacity) * Number(cs.opacity),
                    width: parseFloat(cs.strokeWidth), visibility: cs.visibility,
                    height: l.getBoundingClientRect().height, x: Number(l.getAttribute('x1'))};
        })"""
    )
    assert len(drawn) == len(expected)
    grid = chart.locator("line.grid").first.evaluate("(l) => getComputedStyle(l).stroke")
    for m in drawn:
        assert m["stroke"] == "rgb(214, 39, 40)" != grid, m
        assert m["opacity"] >= 0.5 and m["width"] >= 1 and m["visibility"] == "visible", m
        assert m["height"] > 50, m
    ticks = chart.locator("text.xtick").evaluate_all(
        "(ts) => ts.map((t) => [Number(t.getAttribute('x')), Number(t.textContent)])"
    )
    (x0, s0), (x1, s1) = ticks[0], ticks[-1]
    steps = [s0 + (m["x"] - x0) * (s1 - s0) / (x1 - x0) for m in drawn]
    assert [round(s) for s in steps] == expected
    assert max(abs(s - round(s)) for s in steps) < 0.02


def _assert_heatmap(chart) -> None:
    """builders.probe_payload: conv2d 1%, dense 8%, layer_norm and predictions 0% underflow, at
    both probe steps: every row labelled, cells in the bin the fixed thresholds put them."""
    labels = chart.locator("text.row-label")
    assert labels.all_text_contents() == ["conv2d", "dense", "layer_norm", "predictions"]
    cells = chart.locator("rect.cell")
    bins = [int(b) for b in cells.evaluate_all("(cs) => cs.map((c) => c.dataset.bin)")]
    assert bins == [3, 3, 0, 0]  # one run of equal colour per row: [1%, 10%), [1%, 10%), 0, 0
    legend = chart.locator("text.legend-label").all_text_contents()
    assert legend == ["0", "< 0.1%", "0.1–1%", "1–10%", "≥ 10%", "not probed"]


def test_unknown_format():
    with pytest.raises(ValueError, match="unknown format"):
        report.render([], [], "pdf")


@pytest.mark.browser
def test_html_opens_in_headless_chromium(two_runs, tmp_path):
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing: browser test skipped")
    sync_api = pytest.importorskip("playwright.sync_api")
    root, runs, findings = two_runs
    path = tmp_path / "report.html"
    path.write_text(report.render(runs, findings, "html", logdir=root), encoding="utf-8")
    errors: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"],
        )  # fmt: skip
        try:
            page = browser.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(path.as_uri())
            page.wait_for_load_state("load")
            assert page.title().startswith("mpwatch diagnosis")
            runs_shown = page.locator("section.run")
            assert runs_shown.count() == 3
            mixed = page.locator("section.run", has=page.locator("h2", has_text="Run mixed"))
            # charts present and drawn
            assert mixed.locator("svg.chart").count() == 4
            assert mixed.locator("svg[id^=loss-scale] polyline.series").count() == 1
            _assert_skip_marks(mixed.locator("svg[id^=loss-scale]"), SKIPPED)
            _assert_heatmap(mixed.locator("svg[id^=heatmap]"))
            assert mixed.locator("svg[id^=histogram] rect.bar").count() > 10
            assert mixed.locator("svg[id^=histogram] rect.window").count() == 1
            assert mixed.locator("svg[id^=underflow] .series").count() >= 1
            box = mixed.locator("svg[id^=loss-scale]").bounding_box()
            assert box and box["width"] > 100 and box["height"] > 50
            # the per-layer table
            rows = mixed.locator("table.layers tbody tr")
            assert rows.count() == 4
            assert "predictions" in rows.nth(3).inner_text()
            assert "flag-error" in (rows.nth(3).get_attribute("class") or "")
            # the findings
            assert mixed.locator(".finding.error").count() >= 1
            # the hostile run name shows as text
            assert page.get_by_text("Run <script>alert(1)</script>").count() == 1
        finally:
            browser.close()
    assert errors == []


def test_profile_section_in_every_format(two_runs):
    """The mixed run's profile record (tests/builders.profile_payload): 10 ms of op
    time, conv2d 5 ms of which 1 ms 16-bit, dense 2.5 ms, 20% in Cast, 0.5 ms outside layers."""
    root, runs, findings = two_runs
    doc = report.to_json(runs, findings, root)
    jsonschema.validate(doc, report.JSON_SCHEMA)
    mixed = next(r for r in doc["runs"] if r["name"] == "mixed")
    prof = mixed["profile"]
    assert prof["steps"] == [5, 8] and prof["total_ms"] == pytest.approx(10.0)
    assert prof["cast_share"] == pytest.approx(0.2) and prof["share_16bit"] == pytest.approx(0.3)
    assert prof["unattributed_share"] == pytest.approx(0.05)
    assert [(x["layer"], x["time_ms"]) for x in prof["top_layers"]] == [
        ("conv2d", pytest.approx(5.0)),
        ("dense", pytest.approx(2.5)),
    ]
    assert prof["top_layers"][0]["share"] == pytest.approx(0.5)
    assert prof["top_layers"][0]["share_16bit"] == pytest.approx(0.2)
    assert next(r for r in doc["runs"] if r["name"] == "fp32")["profile"] is None
    text = report.render(runs, findings, "text", logdir=root)
    assert "profile: profiled steps 5-8, 10 ms of op time, 30.0% in 16-bit, 20.0% in Cast" in text
    assert "conv2d: 5 ms (50.0%), 20.0% 16-bit" in text
    md = report.render(runs, findings, "markdown", logdir=root)
    assert "**Profile of run `mixed`:**" in md and "- dense: 2.5 ms (25.0%), 80.0% 16-bit" in md
    html = report.render(runs, findings, "html", logdir=root)
    assert '<section class="profile"><h3>Profile</h3>' in html


def test_show_imports_go_one_way():
    """report -> html -> summary (and charts_svg): html never imports report, summary imports
    neither."""
    import ast
    import pathlib

    show = pathlib.Path(report.__file__).parent

    def imported(name):
        tree = ast.parse((show / f"{name}.py").read_text(encoding="utf-8"))
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
        return found

    assert not {m for m in imported("html") if m.startswith("mpwatch.show.report")}
    assert not {m for m in imported("summary") if m.startswith(("mpwatch.show.report",
                                                                "mpwatch.show.html"))}  # fmt: skip
    assert not {m for m in imported("report") | imported("html") if "advisor" in m}
    assert report.NO_DATA is summary.NO_DATA and report.run_summary is summary.run_summary


def test_summary_reads_the_runs_accessors(two_runs):
    """Skipped steps from Run.skipped_steps(), the probe numbers from Run.latest_probe()."""
    _, runs, _ = two_runs
    mixed = runs["mixed"]
    sm = summary.run_summary(mixed)
    assert sm["skipped_steps"] == int(mixed.skipped_steps().sum()) == 25
    latest = mixed.latest_probe()
    assert sm["underflow_fraction"] == pytest.approx(latest.model["underflow_fraction"])
    assert sm["recommended_scale"] == 131072.0 and latest.step == 400
    assert summary.run_summary(runs["fp32"])["skipped_steps"] is None  # nothing about skips
    assert summary.step_range(mixed) == {"first": 1, "last": 400, "count": 400}
    assert summary.finite_float(float("inf")) is None and summary.finite_float("3") == 3.0


def test_skipped_steps_from_the_cumulative_count_only(tmp_path):
    """A run without the per-step flag: the total comes from the cumulative counter's rises."""
    w = RunWriter(str(tmp_path))
    w.scalar_series(contract.LOSS_SCALE, [10, 20, 30], [4.0, 2.0, 2.0])
    w.scalar_series(contract.SKIPPED_STEPS_TOTAL, [10, 20, 30], [1.0, 3.0, 3.0])
    w.close()
    run = load_runs(str(tmp_path))["."]
    assert summary.run_summary(run)["skipped_steps"] == 3
    page = report.render(run, [], "html")
    # which steps were skipped is not recorded: no marker at the counter's steps 10 and 20, the
    # spans that hold the skips shaded
    assert page.count('class="mark"') == 0
    assert page.count('class="span"') == 2
    assert "1 skipped in steps 1-10" in page and "2 skipped in steps 11-20" in page


def test_html_loss_scale_from_the_first_step_and_an_honest_probe(tmp_path):
    """A run recorded without the step-0 point gets it from its first run_info; a probe whose
    gradients were not finite at loss scale 0 shows no underflow and no recommended scale."""
    from builders import probe_payload, run_info

    w = RunWriter(str(tmp_path))
    info = {**run_info(), "start": {"iterations": 0, "loss_scale": None}}
    w.record(contract.KIND_RUN_INFO, 0, info)
    w.scalar_series(contract.LOSS_SCALE, [1, 2, 3], [2.0**14, 2.0**13, 0.0])
    w.scalar_series(contract.STEP_SKIPPED, [1, 2, 3], [1.0, 1.0, 1.0])
    bad = probe_payload(3, 1024.0)
    bad["loss_scale"] = 0.0
    bad["histogram"]["window_log2"] = [math.inf, math.inf]
    bad["model"].update(nonfinite=10, size=20, first_nonfinite_layer="dense")
    w.record(contract.KIND_PROBE, 3, bad)
    w.close()
    run = load_runs(str(tmp_path))["."]
    from mpwatch.show.views import loss_scale_series

    ls = loss_scale_series(run)
    assert ls.index.tolist() == [0, 1, 2, 3] and ls.iloc[0] == 2.0**15
    page = report.render(run, [], "html")
    assert page.count('class="mark"') == 3
    assert "not measured at step 3: the gradients were not finite at this probe (10 of 20" in page
    assert "first at layer dense); the loss scale had fallen to 0" in page
    assert "none (not measured at step 3)" in page and "131072" not in page
    assert 'class="window"' not in page  # no float16 window at S = 0


def _info_run():
    """A run whose findings include a long 'nothing to change' info (60 BatchNormalization layers)
    and an info with code (a float32 run on an A100: try mixed_bfloat16)."""
    from builders import make_run

    rows = [[f"bn_{i}", f"m/bn_{i}", "BatchNormalization", 1, "mixed_float16", "float16",
             "float32", "float16", "float32", 128, 64, {}, None, False, "inside"]
            for i in range(60)]  # fmt: skip
    steps = {contract.STEP_TIME_MS: {10: 5.0}}  # mpwatch data
    bn = make_run("bn", layers=rows, scalars=steps)
    fp32 = make_run("fp32", policy="float32", scalars=steps)
    return [bn, fp32]


def test_info_findings_are_short(tmp_path):
    from mpwatch.judge import diagnose_runs

    runs = _info_run()
    findings = diagnose_runs(runs)
    inside = [f for f in findings if f.rule == "float32-inside"]
    assert len(inside) == 1
    text = report.render(runs, findings, "text")
    block = text[text.index(inside[0].title) :].splitlines()
    assert len(block[1]) <= 10 + report.INFO_EVIDENCE_CHARS  # one short evidence line
    assert "# nothing to do" not in text  # a comment-only fix is left out of the text report
    assert 'set_global_policy("mixed_bfloat16")' in text  # an info with code keeps its fix
    md = report.render(runs, findings, "markdown")
    notes = md[md.index("## 🔵 Notes (nothing to change)") :]
    assert inside[0].title in notes and "```" not in notes
    assert md.count(inside[0].title) == 1
    # JSON keeps everything
    doc = report.to_json(runs, findings)
    assert any(f["evidence"] == inside[0].evidence for f in doc["findings"])
