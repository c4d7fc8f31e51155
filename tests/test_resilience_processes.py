"""Multi-process resilience: a run killed with SIGKILL mid-epoch and resumed with BackupAndRestore.

Each test drives real training subprocesses (tests/scripts/train_worker.py) on 127.0.0.1 only, with
bounded waits. Ground truth is what the processes report themselves (the optimizer's own
``dynamic_scale`` after each batch) and the event files parsed here with TensorFlow's own iterator,
not with mpwatch.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from collections import defaultdict

import pytest

WORKER = os.path.join(os.path.dirname(__file__), "scripts", "train_worker.py")
TIMEOUT_S = 240


def events_by_file(logdir: str, tag: str) -> dict[str, list[tuple[int, float]]]:
    """(step, value) of one scalar tag, per event file, in write order (TF's own parser)."""
    import tensorflow as tf

    out: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
        try:
            for event in tf.compat.v1.train.summary_iterator(path):
                for v in event.summary.value:
                    if v.tag == tag:
                        value = v.simple_value if v.HasField("simple_value") else None
                        if value is None:
                            value = float(tf.make_ndarray(v.tensor))
                        out[path].append((event.step, value))
        except tf.errors.DataLossError:  # the killed writer's cut tail
            pass
    return out


def run_worker(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, WORKER, *args],
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"worker did not finish in {TIMEOUT_S}s:\n{out[-3000:]}")
    return proc.returncode, out


@pytest.fixture(scope="module")
def single_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("single")
    code, out = finish(run_worker([str(d / "logs"), "--truth", str(d / "truth.json")]))
    assert code == 0, out[-3000:]
    return str(d / "logs"), json.loads((d / "truth.json").read_text())


def test_single_process_series_is_the_optimizers(single_run):
    logdir, truth = single_run
    (series,) = events_by_file(logdir, "mpwatch/loss_scale").values()
    assert [v for _, v in series] == truth["scales"]
    (flags,) = events_by_file(logdir, "mpwatch/step_skipped").values()
    skipped = [s for s, v in flags if v]
    assert len(skipped) == len(truth["scales"]) - truth["iterations"] > 0


@pytest.mark.slow
def test_killed_and_resumed_run_reads_as_one_continuous_series(tmp_path):
    import mpwatch

    logdir, backup = str(tmp_path / "logs"), str(tmp_path / "backup")
    # first life: killed with SIGKILL after 18 batches (epoch 2, 6 batches in; backup at 16)
    code, out = finish(run_worker([logdir, "--backup", backup, "--kill-at", "18"]))
    assert code == -9, f"expected SIGKILL, got {code}:\n{out[-3000:]}"
    first = events_by_file(logdir, "mpwatch/train/loss")
    assert len(first) == 1
    # second life: restores from the backup and finishes
    code, out = finish(run_worker([logdir, "--backup", backup]))
    assert code == 0, out[-3000:]
    files = events_by_file(logdir, "mpwatch/train/loss")
    assert len(files) == 2
    killed, resumed = (files[p] for p in sorted(files, key=lambda p: files[p][0][0]))
    # the scenario really overlaps: the resumed life re-ran steps the killed one had logged
    assert resumed[0][0] <= killed[-1][0]
    # no backward steps within either life
    for life in (killed, resumed):
        steps = [s for s, _ in life]
        assert steps == sorted(set(steps))

    run = mpwatch.load_run(logdir, warn=False)
    loss = run.scalar("mpwatch/train/loss")
    steps = list(loss.index)
    assert steps == sorted(set(steps)), "the reader shows each step once, in order"
    assert steps[0] == 1 and steps == list(range(1, steps[-1] + 1)), "one continuous series"
    # later writes win: overlapping steps carry the resumed life's values
    for step, value in resumed:
        assert loss.loc[step] == pytest.approx(value, rel=1e-6)
    for step, value in killed:
        if step < resumed[0][0]:
            assert loss.loc[step] == pytest.approx(value, rel=1e-6)
    scale_steps = list(run.scalar("mpwatch/loss_scale").index)
    assert scale_steps == sorted(set(scale_steps))
