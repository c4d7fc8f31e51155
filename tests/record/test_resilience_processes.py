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
import urllib.request

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
    assert series[0] == (0, 2.0**15)  # before the first step: Keras' initial_scale
    assert [v for _, v in series[1:]] == truth["scales"]
    (flags,) = events_by_file(logdir, "mpwatch/step_skipped").values()
    skipped = [s for s, v in flags if v]
    assert len(skipped) == len(truth["scales"]) - truth["iterations"] > 0


BATCHES_PER_EPOCH = 12  # tests/scripts/train_worker.py
OVERFLOW_BATCHES = (3, 7)  # within each epoch: their float16 gradients overflow


def _skips(flags: list[tuple[int, float]], upto: int) -> int:
    return sum(1 for s, v in flags if v and s <= upto)


@pytest.mark.slow
def test_killed_and_resumed_run_reads_as_one_continuous_series(tmp_path):
    """Killed with SIGKILL in its 15th batch; BackupAndRestore (after the monitor in the callback
    list) saved the state after batch 8; mpwatch had flushed its per-step series up to step 12.
    The resumed process holds the state after batch 8, so its steps continue at 9 (not at
    ``optimizer.iterations + 1``, which is 2 lower: the skipped batches 4 and 8), rewriting 9-12."""
    from tensorboard_process import running_tensorboard

    import mpwatch

    logdir, backup = str(tmp_path / "logs"), str(tmp_path / "backup")
    args = [logdir, "--backup", backup, "--backup-every", "8"]
    code, out = finish(run_worker([*args, "--kill-at", "15"]))
    assert code == -9, f"expected SIGKILL, got {code}:\n{out[-3000:]}"
    assert len(events_by_file(logdir, "mpwatch/loss_scale")) == 1
    truth_path = tmp_path / "truth.json"
    code, out = finish(run_worker([*args, "--truth", str(truth_path)]))
    assert code == 0, out[-3000:]
    truth = json.loads(truth_path.read_text())

    files = events_by_file(logdir, "mpwatch/loss_scale")
    assert len(files) == 2
    killed, resumed = (files[p] for p in sorted(files, key=lambda p: files[p][0][0]))
    flags = events_by_file(logdir, "mpwatch/step_skipped")
    killed_flags, resumed_flags = (flags[p] for p in sorted(flags, key=lambda p: flags[p][0][0]))
    assert [s for s, _ in killed] == list(range(0, 13)), "the start, then every 4 steps up to 12"
    # the restored state is the one after batch 8: the resumed life's first step is 9
    assert [s for s, _ in resumed] == list(range(9, 9 + len(truth["scales"])))
    assert [v for _, v in resumed] == truth["scales"], "each step carries its own optimizer state"
    # its skipped flags are the optimizer's: iterations did not advance
    before = 8 - _skips(killed_flags, 8)  # iterations restored from the backup
    its = [before, *truth["iterations_per_batch"]]
    assert [v for _, v in resumed_flags] == [float(a == b) for a, b in zip(its, its[1:])]
    # the second life re-ran epoch 1 from its start (Keras restores the epoch, not the batch)
    assert len(truth["scales"]) == 2 * BATCHES_PER_EPOCH
    skipped_total = _skips(killed_flags, 8) + _skips(resumed_flags, 10**9)
    assert skipped_total == 2 + 2 * len(OVERFLOW_BATCHES)

    # the reader: one continuous series, later writes win at the rewritten steps 9-12
    run = mpwatch.load_run(logdir, warn=False)
    scale = run.scalar("mpwatch/loss_scale")
    last = 8 + len(truth["scales"])
    assert list(scale.index) == list(range(0, last + 1)), "one continuous series from the start"
    assert scale.loc[9:].tolist() == truth["scales"]
    assert scale.loc[:8].tolist() == [v for s, v in killed if s <= 8]
    assert run.scalar("mpwatch/skipped_steps_total").iloc[-1] == skipped_total
    assert int(run.scalar("mpwatch/step_skipped").sum()) == skipped_total
    for tag in ("mpwatch/train/loss", "mpwatch/skipped_steps_total"):
        steps = list(run.scalar(tag).index)
        assert steps == sorted(set(steps)), tag

    # the tab (a real TensorBoard): the same single series, and the same skipped steps
    def ready(base: str) -> object:
        with urllib.request.urlopen(base + "/data/plugin/mpwatch/runs", timeout=10) as r:
            return json.loads(r.read())["runs"]

    log_path = str(tmp_path / "tensorboard.log")
    with running_tensorboard(logdir, log_path, ready) as (base, _, _):
        url = base + "/data/plugin/mpwatch/scalars?run=.&points=1000"
        with urllib.request.urlopen(url, timeout=60) as r:
            view = json.loads(r.read())
    series = view["series"]["mpwatch/loss_scale"]
    assert series["steps"] == list(range(0, last + 1))
    assert series["values"] == scale.tolist()
    assert view["skipped_total"] == skipped_total
    assert view["skipped_steps"] == [s for s, v in killed_flags if v and s <= 8] + [
        s for s, v in resumed_flags if v
    ]


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
    assert truths[0] == truths[1]
    assert truths[0] == {k: single_truth[k] for k in ("scales", "iterations")}

    # only the chief wrote: one event file, named with the chief's pid
    files = sorted(os.listdir(logdir))
    assert len(files) == 1 and files[0].startswith("events.out.tfevents."), files
    # events.out.tfevents.<time>.<host>.<pid>.<n> (TensorBoard's naming; tf.summary adds .v2)
    assert str(procs[0].pid) in files[0].split(".")[4:]
    assert [p for p in tmp_path.rglob("*") if p.is_file() and "truth" not in p.name] == [
        tmp_path / "logs" / files[0]
    ], "the other worker writes nothing that stays"

    for tag in ("mpwatch/loss_scale", "mpwatch/step_skipped"):
        (multi,) = events_by_file(logdir, tag).values()
        (single,) = events_by_file(single_logdir, tag).values()
        assert multi == single, tag
    (multi,) = events_by_file(logdir, "mpwatch/loss_scale").values()
    assert multi[0] == (0, 2.0**15)  # before the first step
    assert [v for _, v in multi[1:]] == single_truth["scales"]
    # the loss (summed over the workers' halves) is the single process's, to float16 precision
    (multi,) = events_by_file(logdir, "mpwatch/train/loss").values()
    (single,) = events_by_file(single_logdir, "mpwatch/train/loss").values()
    assert [s for s, _ in multi] == [s for s, _ in single]
    assert [v for _, v in multi] == pytest.approx([v for _, v in single], rel=2e-2)
