"""Issue 29: the tab shows float8 readiness per layer and the memory table, in a real TensorBoard
and headless Chromium, as the records hold them (parsed independently: conftest ``read_events``).

The logdir: keras.io's Transformer from tests/beyond/beyond_fit.py under each backend, its
``mixed`` run (mixed_bfloat16, probed: a float8 table) and its ``bfloat16`` run (pure bfloat16:
16-bit variables, a memory table whose own policy is bfloat16).
"""

from __future__ import annotations

import os
import shutil

import pytest
from test_plugin_server import Tab, serving

RUNS = ["bfloat16", "mixed"]


@pytest.fixture(scope="module")
def logdir(tmp_path_factory, beyond_runs):
    out, _ = beyond_runs
    root = tmp_path_factory.mktemp("tab_beyond")
    for run in RUNS:
        shutil.copytree(out / run, root / run)
    return str(root)


@pytest.fixture(scope="module")
def server(logdir):
    with serving(logdir, RUNS, "tensorboard-tab-beyond.log") as srv:
        yield srv


def _table(frame, selector):
    return frame.locator(selector).evaluate(
        """(t) => [...t.querySelectorAll('tr')].map(
            (r) => [...r.querySelectorAll('th,td')].map((c) => c.textContent))"""
    )


def _mib(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    return f"{n / 1024:.1f} KiB" if n < 2**20 else f"{n / 2**20:,.1f} MiB"


@pytest.mark.browser
def test_the_tab_shows_float8_readiness_and_memory(browser, server, read_events):
    tab = Tab(browser, server)
    try:
        tab.select_run("mixed")
        frame = tab.frame
        assert frame.locator("#mpw-float8-section").is_visible()
        rows = _table(frame, "#mpw-float8 table")
        _, records = read_events(os.path.join(server.logdir, "mixed"))
        step, probe = max((sp for sp in records["probe"] if "float8" in sp[1]),
                          key=lambda sp: sp[0])  # fmt: skip
        table = probe["float8"]
        cols = table["columns"]
        assert len(rows) == 1 + len(table["data"]) == 9  # the header and one row per layer
        header = rows[0]
        assert header[:4] == ["layer", "class", "ready", "output float8"]
        for shown, want in zip(rows[1:], table["data"]):
            rec = dict(zip(cols, want))
            assert shown[0] == rec["layer"] and shown[1] == rec["class"]
            assert shown[2] == ("yes" if rec["ready"] else "no")
            assert float(shown[3].rstrip("%")) == pytest.approx(100 * rec["out_error_8"], rel=2e-2)
        assert f"probe at step {step}" in frame.inner_text("#mpw-float8")

        # memory: the record's bytes per policy, the run's own policy first
        (_, memory), *_ = records["memory"]
        by_policy = [dict(zip(memory["by_policy"]["columns"], r))
                     for r in memory["by_policy"]["data"]]  # fmt: skip
        shown = _table(frame, "#mpw-memory table.mpw-memory-by-policy")
        assert [r[0] for r in shown[1:]] == [r["policy"] for r in by_policy]
        assert [r[-1] for r in shown[1:]] == [_mib(r["total"]) for r in by_policy]

        tab.select_run("bfloat16")
        shown = _table(frame, "#mpw-memory table.mpw-memory-by-policy")
        assert shown[1][0] == "bfloat16"
        assert tab.errors == []
    finally:
        tab.close()
