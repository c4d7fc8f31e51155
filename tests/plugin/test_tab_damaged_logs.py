"""Issue 49 in the tab: what the reader cannot read of a logdir is a finding there too.

TensorBoard's data provider stops quietly at damage; the tab checks the run folders' event files
with the reader's own check and shows the ``damaged-logs`` findings ``mpwatch diagnose`` gives.
Ground truth: the CLI's JSON (``mpwatch diagnose LOGDIR --format json``, a subprocess), and where
the damage is, computed here from the TFRecord framing (u64 length, u32 masked crc of the length,
data, u32 masked crc of the data).

The logdir: the real mixed_float16 fit of ``quickstart_logdir`` (``fit``), a copy of it whose
event file has its third record's length crc flipped (``fit_damaged``: TensorBoard serves its first
two records), and a folder holding one file of random bytes named like an event file
(``garbage``: TensorBoard serves nothing of it).
"""

from __future__ import annotations

import glob
import os
import random
import shutil
import struct

import pytest
from test_plugin_server import Tab, serving
from test_tab_matches_cli import cli_json, finding_cards, shown

RUNS = ["fit", "fit_damaged", "garbage"]
DAMAGED_LOGS = "damaged-logs"


def record_starts(data: bytes) -> list[int]:
    """Where each whole record starts, by the framing alone."""
    out, pos = [], 0
    while pos + 12 <= len(data):
        (n,) = struct.unpack_from("<Q", data, pos)
        if pos + 16 + n > len(data):
            break
        out.append(pos)
        pos += 16 + n
    return out


def event_file(run_dir: str) -> str:
    (path,) = glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))
    return path


@pytest.fixture(scope="module")
def logdir(tmp_path_factory, quickstart_logdir):
    root = tmp_path_factory.mktemp("tab_damaged") / "logs"
    shutil.copytree(quickstart_logdir, root / "fit")
    shutil.copytree(quickstart_logdir, root / "fit_damaged")
    path = event_file(str(root / "fit_damaged"))
    with open(path, "rb") as fh:
        data = bytearray(fh.read())
    start3 = record_starts(bytes(data))[2]
    data[start3 + 8] ^= 0xFF  # the first byte of record 3's length crc
    with open(path, "wb") as fh:
        fh.write(bytes(data))
    (root / "garbage").mkdir()
    noise = root / "garbage" / "events.out.tfevents.1700000000.host"
    noise.write_bytes(random.Random(49).randbytes(4096))
    return {"root": str(root), "damaged": path, "start3": start3, "noise": str(noise)}


@pytest.fixture(scope="module")
def truth(logdir):
    """The CLI's findings, by run, in the CLI's order."""
    doc = cli_json(logdir["root"])
    assert sorted(r["name"] for r in doc["runs"]) == RUNS
    by_run: dict[str, list[dict]] = {run: [] for run in RUNS}
    for f in doc["findings"]:
        by_run[f["run"]].append(shown(f))
    return by_run


@pytest.fixture(scope="module")
def server(logdir):
    with serving(logdir["root"], RUNS, "tensorboard-damaged.log") as srv:
        yield srv


def damage_findings(found: list[dict]) -> list[dict]:
    return [f for f in found if f["rule"] == DAMAGED_LOGS]


def test_the_cli_says_where_the_damage_is(logdir, truth):
    """The comparison is worth making: the CLI names the damage the framing says is there."""
    (corrupt,) = damage_findings(truth["fit_damaged"])
    name = os.path.basename(logdir["damaged"])
    assert corrupt["severity"] == "error"
    assert corrupt["title"].startswith(f"Event file damaged: record 3 of {name} is corrupt")
    assert f"record 3 at byte {logdir['start3']} is corrupt" in corrupt["evidence"]
    (noise,) = damage_findings(truth["garbage"])
    assert noise["severity"] == "error"
    assert noise["title"].startswith(f"Not an event file: {os.path.basename(logdir['noise'])}")
    assert damage_findings(truth["fit"]) == []


def test_the_tab_lists_a_run_it_could_read_nothing_of(server):
    status, body = server.route("runs")
    assert status == 200 and [r["name"] for r in body["runs"]] == RUNS


def test_the_findings_route_serves_the_clis_damaged_logs_findings(server, truth):
    """Through a real TensorBoard: each damaged run's findings hold the CLI's ``damaged-logs``
    error, the same title and evidence; the good run has none; and every run's findings are its
    share of the CLI's, in the CLI's order. The reader's lines do not repeat a finding."""
    for run in RUNS:
        status, view = server.route("findings", run=run)
        assert status == 200, view
        served = [shown(f) for f in view["findings"]]
        assert damage_findings(served) == damage_findings(truth[run]), run
        assert served == truth[run], run
        assert not any(f["evidence"] in e for f in served for e in view["errors"]), run
    for run in ("fit_damaged", "garbage"):
        _, view = server.route("findings", run=run)
        (found,) = damage_findings(view["findings"])
        assert found["severity"] == "error"
    _, view = server.route("findings", run="fit")
    assert damage_findings(view["findings"]) == []
    for route in ("scalars", "layers", "probes", "profile"):  # a run of nothing read answers too
        status, body = server.route(route, run="garbage")
        assert status == 200 and body["run"] == "garbage", (route, body)


@pytest.mark.browser
def test_the_tab_shows_the_damage_as_the_cli_says_it(browser, server, truth):
    tab = Tab(browser, server)
    try:
        for run in RUNS:
            tab.select_run(run)
            assert finding_cards(tab) == truth[run], run
        assert tab.errors == []
    finally:
        tab.close()


def test_a_reload_reads_only_files_that_changed(logdir, tmp_path, monkeypatch):
    """In process (the plugin's scan of ``--logdir``): unchanged files are not read again on the
    next look; a file that grew by a cut record is read again, its run gains the ``info``
    finding of a cut last record, and the listing's version changes."""
    from tensorboard_plugin_mpwatch import data

    from mpwatch import read as reader
    from mpwatch.judge import diagnose_runs
    from mpwatch.read import check as check_module

    root = tmp_path / "logs"
    shutil.copytree(logdir["root"], root)
    opened: list[str] = []
    monkeypatch.setattr(
        check_module, "open", lambda f, *a: opened.append(f) or open(f, *a), raising=False
    )
    damaged = data.DamagedRuns(str(root), ttl=0.0)
    first = damaged.runs()
    assert sorted(first) == ["fit_damaged", "garbage"] and len(opened) == 3  # every event file
    assert damaged.runs() == first and len(opened) == 3  # a reload: nothing read again
    good = event_file(str(root / "fit"))
    with open(good, "ab") as fh:
        fh.write(struct.pack("<Q", 100)[:5])  # the start of a record still being written
    after = damaged.runs()
    assert opened[3:] == [good]
    assert {k: v for k, v in after.items() if k != "fit"} == first
    listing = data.merge_damage({"fit": {"max_step": 8, "version": "8"}}, after)
    assert listing["fit"]["version"] != "8" and listing["garbage"]["max_step"] == 0
    # the tab's Run of "fit" gets the problems: its finding is the CLI's (the same judge)
    records = data.RunRecords(name="fit")
    data.add_problems(records, *after["fit"])
    tab_run = data.build_model(records)
    cli_run = reader.load_runs(str(root))["fit"]
    assert tab_run.problems == cli_run.problems
    (tab_finding,) = [f for f in diagnose_runs([tab_run]) if f.rule == DAMAGED_LOGS]
    (cli_finding,) = [f for f in diagnose_runs([cli_run]) if f.rule == DAMAGED_LOGS]
    assert tab_finding == cli_finding and tab_finding.severity == "info"
