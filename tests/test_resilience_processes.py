"""Multi-process resilience: a run killed with SIGKILL mid-epoch and resumed with BackupAndRestore,
and MultiWorkerMirroredStrategy training with two worker processes.

Each test drives real training subprocesses (tests/scripts/train_worker.py) on 127.0.0.1 only, with
bounded waits. Ground truth is what the processes report themselves (the optimizer's own
``dynamic_scale`` after each batch) and the event files parsed here with TensorFlow's own iterator,
not with mpwatch.
"""

from __future__ import annotations

import json
import os

import pytest
from worker_processes import events_by_file, finish, finish_all, run_worker


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


@pytest.mark.slow
def test_multiworker_chief_records_what_a_single_process_records(tmp_path, single_run):
    """Two MultiWorkerMirroredStrategy workers on 127.0.0.1 train one model (a custom loop: Keras'
    fit fails under that strategy upstream). Each worker takes half of every batch, and only the
    chief's half of OVERFLOW_BATCHES overflows, so the skip decision must be shared. Both are given
    the same log_dir, as on a shared filesystem."""
    from tensorboard_process import free_port

    single_logdir, single_truth = single_run
    logdir = str(tmp_path / "logs")
    ports = [free_port(), free_port()]
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs = []
    for i in range(2):
        tf_config = {"cluster": cluster, "task": {"type": "worker", "index": i}}
        procs.append(
            run_worker(
                [logdir, "--multiworker", "--truth", str(tmp_path / f"truth{i}.json")],
                env={"TF_CONFIG": json.dumps(tf_config)},
            )
        )
    for code, out in finish_all(procs):
        assert code == 0, out[-3000:]
    truths = [json.loads((tmp_path / f"truth{i}.json").read_text()) for i in range(2)]
    # the workers agree with each other and with the single process (the optimizers' own values)
    assert truths[0] == truths[1] == single_truth

    # only the chief wrote: one event file, named with the chief's pid
    files = sorted(os.listdir(logdir))
    assert len(files) == 1 and files[0].startswith("events.out.tfevents."), files
    assert files[0].split(".")[-3] == str(procs[0].pid)
    assert [p for p in tmp_path.rglob("*") if p.is_file() and "truth" not in p.name] == [
        tmp_path / "logs" / files[0]
    ], "the other worker writes nothing that stays"

    for tag in ("mpwatch/loss_scale", "mpwatch/step_skipped"):
        (multi,) = events_by_file(logdir, tag).values()
        (single,) = events_by_file(single_logdir, tag).values()
        assert multi == single, tag
    (multi,) = events_by_file(logdir, "mpwatch/loss_scale").values()
    assert [v for _, v in multi] == single_truth["scales"]
    # the loss (summed over the workers' halves) is the single process's, to float16 precision
    (multi,) = events_by_file(logdir, "mpwatch/train/loss").values()
    (single,) = events_by_file(single_logdir, "mpwatch/train/loss").values()
    assert [s for s, _ in multi] == [s for s, _ in single]
    assert [v for _, v in multi] == pytest.approx([v for _, v in single], rel=2e-2)
