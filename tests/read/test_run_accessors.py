"""Run.latest_probe(), Run.skipped_steps(), Run.probe_layers (and its old name ``probes``) against
data built by hand (tests/builders.py), through run_from_records and through event files."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from builders import probe_records, skip_scalars, write_mixed_run

from mpwatch import contract
from mpwatch import read as reader


def _run(scalars=None, probes=()):
    records = {contract.KIND_PROBE: list(probes)} if probes else {}
    return reader.run_from_records(".", scalars=scalars or {}, records=records)


# --- latest_probe ---------------------------------------------------------------------------------
def test_latest_probe_is_the_last_step_with_its_own_tables():
    recs = probe_records([(10, "float16"), (20, "float16"), (30, "float16")])
    run = _run(probes=recs)
    got = run.latest_probe()
    assert isinstance(got, reader.ProbeResult) and got.step == 30
    payload = dict(recs)[30]
    assert got.model["loss_scale"] == 30.0 and got.model["mode"] == "float16"
    assert got.model["underflow_fraction"] == payload["model"]["underflow_fraction"]
    assert got.layers["layer"].tolist() == [r[0] for r in payload["layers"]["data"]]
    assert set(got.layers["step"]) == {30}
    assert got.variables["variable"].tolist() == [r[0] for r in payload["variables"]["data"]]
    assert len(got.sweep) == len(payload["sweep"]["data"]) and set(got.sweep["step"]) == {30}
    assert got.histogram == payload["histogram"]
    # tables of one probe step only, index from 0
    assert list(got.layers.index) == list(range(len(got.layers)))


def test_latest_probe_after_a_resume_is_the_rewritten_one():
    # written 10, 30, then 20 by a resumed process: later writes win, the probe at 30 is gone
    run = _run(probes=probe_records([(10, "float16"), (30, "float16"), (20, "float16")]))
    assert run.latest_probe().step == 20 and run.probe_model["step"].tolist() == [10, 20]


def test_latest_probe_of_some_modes():
    run = _run(probes=probe_records([(10, "float16"), (20, "preflight"), (30, "bfloat16")]))
    assert run.latest_probe().step == 30
    assert run.latest_probe(modes=["float16"]).step == 10
    assert run.latest_probe(modes=("float16", "preflight")).step == 20
    # None in the payload; the model row comes from the probe_model frame, where it is NaN
    assert pd.isna(run.latest_probe(modes={"bfloat16"}).model["loss_scale"])
    assert run.latest_probe(modes=["bfloat16"]).sweep.empty  # no sweep under bfloat16
    assert run.latest_probe(modes=["nope"]) is None


def test_latest_probe_of_a_run_without_probes_is_none():
    assert _run().latest_probe() is None
    assert _run(scalars=skip_scalars(flags={1: 0.0})).latest_probe(modes=["float16"]) is None


def test_latest_probe_from_event_files(tmp_path):
    truth = write_mixed_run(str(tmp_path), steps=40)
    got = reader.load_run(str(tmp_path)).latest_probe()
    assert got.step == truth["steps"] and got.model["recommended_scale"] == 131072.0
    assert len(got.layers) == 4 and len(got.variables) == 2 and len(got.sweep) == 25


# --- skipped_steps --------------------------------------------------------------------------------
def _check_series(s: pd.Series) -> None:
    assert s.dtype == np.int64 and s.index.dtype == np.int64 and s.index.name == "step"


def test_skipped_steps_from_the_per_step_flag():
    flags = {s: float(s in (3, 4, 9)) for s in range(1, 11)}
    s = _run(scalars=skip_scalars(flags=flags)).skipped_steps()
    _check_series(s)
    assert s.to_dict() == {3: 1, 4: 1, 9: 1} and s.sum() == 3


def test_the_flag_wins_over_the_total():
    flags = {s: float(s == 5) for s in range(1, 11)}
    totals = {10: 7.0}  # disagrees: the flag is the per-step truth
    s = _run(scalars=skip_scalars(flags=flags, totals=totals)).skipped_steps()
    assert s.to_dict() == {5: 1}


def test_no_skipped_step_is_an_empty_series():
    for scalars in (skip_scalars(flags={s: 0.0 for s in range(1, 6)}), {}, skip_scalars({}, {})):
        s = _run(scalars=scalars).skipped_steps()
        _check_series(s)
        assert len(s) == 0 and s.sum() == 0


def test_skipped_steps_from_rises_of_the_total_without_the_flag():
    totals = {10: 0.0, 20: 2.0, 30: 2.0, 40: 5.0, 50: 5.0}
    s = _run(scalars=skip_scalars(totals=totals)).skipped_steps()
    _check_series(s)
    assert s.to_dict() == {20: 2, 40: 3}  # a rise counts at the later recorded point
    assert s.sum() == 5 == totals[50]


def test_skips_before_the_first_total_count_at_it_and_nan_is_ignored():
    totals = {10: 3.0, 20: float("nan"), 30: 4.0}
    s = _run(scalars=skip_scalars(totals=totals)).skipped_steps()
    assert s.to_dict() == {10: 3, 30: 1}


def test_skipped_steps_from_event_files(tmp_path):
    truth = write_mixed_run(str(tmp_path), steps=60)
    s = reader.load_run(str(tmp_path)).skipped_steps()
    want = np.flatnonzero(truth["skipped"]) + 1
    assert s.index.tolist() == want.tolist() and set(s) == {1}
    assert s.sum() == truth["skipped"].sum()


# --- probe_layers / probes ----------------------------------------------------------------------
def test_probe_layers_and_its_old_name():
    recs = probe_records([(10, "float16"), (20, "float16")])
    run = _run(probes=recs)
    assert run.probes is run.probe_layers
    assert run.probe_layers["step"].tolist() == [10] * 4 + [20] * 4
    assert list(run.probe_layers.columns) == ["step", *contract.PROBE_LAYER_COLUMNS]
    with pytest.raises(AttributeError):
        run.probes = pd.DataFrame()  # read-only: set probe_layers
    empty = _run()
    assert empty.probes is empty.probe_layers and list(empty.probes.columns) == ["step"]
