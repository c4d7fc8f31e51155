"""Training subprocesses for the resilience tests (tests/scripts/train_worker.py), with bounded
waits, and the event files they leave parsed with TensorFlow's own iterator (not mpwatch)."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import time
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
    """Start train_worker.py with ``args`` (its output captured)."""
    return subprocess.Popen(
        [sys.executable, WORKER, *args],
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(proc: subprocess.Popen, timeout: float = TIMEOUT_S) -> tuple[int, str]:
    """Wait for ``proc`` at most ``timeout`` seconds; kill it and fail the test past that."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"worker did not finish in {timeout:.0f}s:\n{out[-3000:]}")
    return proc.returncode, out


def finish_all(procs: list[subprocess.Popen], timeout: float = TIMEOUT_S) -> list[tuple[int, str]]:
    """Wait for processes that depend on each other (one cluster): when one fails, or the shared
    deadline passes, the others are killed rather than left waiting for their peer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
            break
        time.sleep(0.2)
    for p in procs:
        if p.poll() is None:
            p.kill()
    return [(p.wait(), p.communicate()[0]) for p in procs]
