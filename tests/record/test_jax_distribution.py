"""mpwatch under ``keras.distribution`` on JAX (4 host devices): the same loss scale, skipped steps
and gradient health as a single-device run of the same model on the same data, the optimizer's
own state as the truth, and training unchanged (weights bit-identical to a plain distributed fit).

The fits run in their own process (tests/jax/jax_distribution.py, conftest's ``dist_runs``):
Keras' backend and XLA's host device count are fixed when they are imported. This process parses
the event files with the independent parser (conftest ``read_events``) and reads them with
``mpwatch.load_run`` / ``mpwatch.diagnose``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from repo_scripts import ROOT

import mpwatch
from mpwatch import contract

pytest.importorskip("jax")

BATCHES = 24
OVERFLOW_BATCHES = {2, 3, 9, 17}  # as in tests/jax/jax_distribution.py (0-based)
CASES = ("data_parallel", "model_parallel")


def _skipped_truth(case_truth):
    its = [0] + case_truth["iterations"]
    return [float(its[i + 1] == its[i]) for i in range(BATCHES)]


def test_the_distributions_are_real(dist_runs):
    _, truth = dist_runs
    assert truth["data_parallel"]["devices"] == 4
    # the layout map sharded both kernels over the mesh's "model" axis
    mp = truth["model_parallel"]["shardings"]
    assert "model" in mp["d1/kernel"] and "model" in mp["out/kernel"]
    assert "model" not in truth["data_parallel"]["shardings"]["d1/kernel"]


@pytest.mark.parametrize("case", CASES)
def test_loss_scale_and_skips_equal_the_optimizers_and_the_single_devices(
    dist_runs, read_events, case
):
    out, truth = dist_runs
    t = truth[case]
    skipped = _skipped_truth(t)
    # the forced overflows, and nothing else, were skipped
    assert [i for i, s in enumerate(skipped) if s] == sorted(OVERFLOW_BATCHES)
    scalars, records = read_events(str(out / case))
    assert scalars[contract.LOSS_SCALE][1:] == [(i + 1, s) for i, s in enumerate(t["scale"])]
    assert scalars[contract.STEP_SKIPPED] == [(i + 1, s) for i, s in enumerate(skipped)]
    single, _ = read_events(str(out / "single"))
    for tag in (contract.LOSS_SCALE, contract.STEP_SKIPPED, contract.SKIPPED_STEPS_TOTAL):
        assert scalars[tag] == single[tag], tag
    (info,) = [p for _, p in records["run_info"]]
    want = "DataParallel" if case == "data_parallel" else "ModelParallel"
    assert info["strategy"] == want and info["num_replicas"] == 4


@pytest.mark.parametrize("case", CASES)
def test_gradient_health_equals_the_single_devices(dist_runs, read_events, case):
    """Counts equal (zeros, subnormals, non-finite values of every variable's gradient, every
    step); the largest |gradient| within 2%: the devices add float16 partial sums in another
    order (0.2% apart at step 1, measured) and the two trainings drift apart by that rounding
    over the steps (0.5% by step 24)."""
    out, _ = dist_runs
    _, records = read_events(str(out / case))
    _, single = read_events(str(out / "single"))

    def tables(recs):
        cols = contract.GRAD_VARIABLE_COLUMNS
        return {
            s: {r[cols.index("variable")]: dict(zip(cols, r)) for r in p["variables"]["data"]}
            for s, p in recs["grad_variables"]
        }

    got, want = tables(records), tables(single)
    assert sorted(got) == sorted(want) == list(range(1, BATCHES + 1))
    for step in want:
        for var, w in want[step].items():
            g = got[step][var]
            for col in ("size", "zero_fraction", "subnormal_fraction", "nonfinite_count"):
                assert g[col] == w[col], (step, var, col)
            np.testing.assert_allclose(g["max_abs"], w["max_abs"], rtol=2e-2)
        # independent truth: only the forced batches' gradients are not finite
        bad = sum(v["nonfinite_count"] for v in got[step].values())
        assert (bad > 0) == (step - 1 in OVERFLOW_BATCHES), step


@pytest.mark.parametrize("case", CASES)
def test_training_is_unchanged_and_the_run_reads_like_any_other(dist_runs, case):
    out, truth = dist_runs
    assert truth[case]["weights_equal_plain"]
    run = mpwatch.load_run(str(out / case))
    single = mpwatch.load_run(str(out / "single"))
    assert list(run.probe_model["step"]) == list(single.probe_model["step"]) == [8, 16, 24]
    for col in ("ref_nonzero", "underflow_count", "nonfinite"):
        assert list(run.probe_layers[col]) == list(single.probe_layers[col]), col
    # float16 values summed in another order across devices: within rounding of the same pass
    for col in ("max_abs_activation", "act_grad_underflow_fraction"):
        np.testing.assert_allclose(run.probe_layers[col], single.probe_layers[col], rtol=2e-2)
    for col in ("grad_rel_error", "output_rel_error"):  # both tiny (1e-4): a few roundings apart
        np.testing.assert_allclose(run.probe_layers[col], single.probe_layers[col], atol=2e-4)
    findings = mpwatch.diagnose(str(out / case))
    skipped = [f for f in findings if f.rule == "skipped-steps"]
    want = [f for f in mpwatch.diagnose(str(out / "single")) if f.rule == "skipped-steps"]
    assert [f.title for f in skipped] == [f.title for f in want]


def _two_processes(tmp_path, budget=None, phase=None, logdir=None):
    """Runs tests/jax/jax_processes.py as processes 0 and 1; (log_dir, each one's result)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    logdir = logdir or tmp_path / "run"
    env = dict(os.environ, KERAS_BACKEND="jax", PYTHONPATH=str(ROOT))
    script = str(ROOT / "tests" / "jax" / "jax_processes.py")
    extra = ["-" if budget is None else str(budget)]
    if phase is not None:
        extra += [phase, str(tmp_path / "checkpoint.npz")]
        tmp_path = tmp_path / phase
        tmp_path.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, script, str(i), port, str(logdir), str(tmp_path / f"p{i}.json"),
             *extra],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        for i in (0, 1)
    ]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    return logdir, [json.loads((tmp_path / f"p{i}.json").read_text()) for i in (0, 1)]


def test_two_processes_one_writer_the_same_series(tmp_path, dist_runs, read_events):
    """Two JAX processes (jax.distributed, CPU collectives, 2 devices each) training the model
    of the other tests, each process feeding its half of every batch: only process 0 writes,
    once; the loss scale, skipped steps and gradient counts are those of the one-process run on
    4 devices; both processes end with the same weights; the
    probe runs on the whole batch in every process at the same steps and measures what the
    one-process probe measures (never a hang or a lost fit)."""
    logdir, got = _two_processes(tmp_path)
    assert [g["process"] for g in got] == [0, 1]
    assert got[0]["weights"] == got[1]["weights"]  # one model
    events = sorted(p.name for p in logdir.iterdir() if p.name.startswith("events.out"))
    assert len(events) == 1  # one writer
    run = mpwatch.load_run(str(logdir))
    assert run.info["strategy"] == "DataParallel" and run.info["num_replicas"] == 4
    one_run = mpwatch.load_run(str(dist_runs[0] / "data_parallel"))
    assert list(run.probe_model["step"]) == list(one_run.probe_model["step"]) == [8, 16, 24]
    for col in ("ref_nonzero", "underflow_count"):
        assert list(run.probe_layers[col]) == list(one_run.probe_layers[col]), col
    steps = run.scalars.index
    assert steps.is_unique and steps.max() == 24  # every step once, no duplicate events
    out, _ = dist_runs
    scalars, records = read_events(str(logdir))
    one, one_records = read_events(str(out / "data_parallel"))
    for tag in (contract.LOSS_SCALE, contract.STEP_SKIPPED, contract.SKIPPED_STEPS_TOTAL,
                contract.GRAD_NONFINITE_COUNT, contract.GRAD_ZERO_FRACTION):  # fmt: skip
        assert scalars[tag] == one[tag], tag
    skipped = [s for s, v in scalars[contract.STEP_SKIPPED] if v]
    assert skipped == [b + 1 for b in sorted(OVERFLOW_BATCHES)]


def test_two_processes_take_the_budgets_decisions_alike(tmp_path):
    """Under the cost budget each process measures its own clock, but a probe is one program of
    both: they take process 0's decision (a probe on one process only would hang the other)."""
    logdir, got = _two_processes(tmp_path, budget=0.05)
    assert got[0]["weights"] == got[1]["weights"]
    run = mpwatch.load_run(str(logdir))
    decisions = [d for b in run.budgets for d in b.get("decisions", []) if d["part"] == "probe"]
    assert decisions and {d["action"] for d in decisions} <= {"ran", "skipped"}
    ran = [d["step"] for d in decisions if d["action"] == "ran"]
    assert list(run.probe_model["step"]) == ran if ran else run.probe_model.empty


def test_two_processes_killed_and_restarted_continue_the_same_series(tmp_path, dist_runs,
                                                                    read_events):  # fmt: skip
    """Two processes train 12 batches with the user's own checkpoint after the 8th, and end (as
    if killed: 4 batches logged past the checkpoint); two new processes restore it and train
    the 16 batches after it into the same log_dir. Only process 0 reads the logs to find where
    the restored state is (step 8, not the optimizer's 6 iterations: 2 skipped steps before it);
    both continue there. Read back, the run is the one-process 4-device run's series."""
    logdir = tmp_path / "run"
    _two_processes(tmp_path, phase="first", logdir=logdir)
    _, got = _two_processes(tmp_path, phase="rest", logdir=logdir)
    assert got[0]["weights"] == got[1]["weights"]
    run = mpwatch.load_run(str(logdir))
    one = mpwatch.load_run(str(dist_runs[0] / "data_parallel"))
    for tag in (contract.LOSS_SCALE, contract.STEP_SKIPPED, contract.SKIPPED_STEPS_TOTAL,
                contract.GRAD_NONFINITE_COUNT, contract.GRAD_ZERO_FRACTION):  # fmt: skip
        mine, theirs = run.scalar(tag), one.scalar(tag)
        assert list(mine.index) == list(theirs.index), tag
        np.testing.assert_array_equal(mine.to_numpy(), theirs.to_numpy(), err_msg=tag)
    # probes every 8 steps in both lives; 12: the first life's epoch end (its fit ended there)
    assert list(run.probe_model["step"]) == [8, 12, 16, 24]
