"""Fuzz-style test of the reader over event files with random truncations and flipped bytes.

Seeded and bounded in time. The truth is what the test itself wrote: each value the reader returns
must be a value that was written at that step under that tag (never garbage), anything it did not
return must be accounted for by a warning, and it never raises.
"""

from __future__ import annotations

import glob
import os
import random
import shutil
import struct
import time
import warnings

import numpy as np
import pytest

from mpwatch import contract
from mpwatch.record.runtime.writer import RunWriter

TAGS = (contract.LOSS_SCALE, contract.GRAD_ZERO_FRACTION)
STEPS = range(1, 151)
LAYERS = contract.table(["name", "params"], [["dense", 12], ["dense_1", 30]])
TIME_BUDGET_S = 15.0
CASES = 150


def truth(tag: str, step: int) -> float:
    return float(np.float32(step * 0.5 if tag == contract.LOSS_SCALE else 1.0 / step))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> str:
    logdir = str(tmp_path_factory.mktemp("pristine"))
    w = RunWriter(logdir)
    w.record(contract.KIND_LAYERS, 0, {"layers": LAYERS})
    for step in STEPS:
        w.scalars(step, {tag: truth(tag, step) for tag in TAGS})
        if step % 50 == 0:
            w.record(contract.KIND_LAYERS, step, {"layers": LAYERS})
    w.close()
    (path,) = glob.glob(os.path.join(logdir, "events.out.tfevents.*"))
    return path


def record_boundaries(data: bytes) -> set[int]:
    """Offsets where a TFRecord ends (u64 length, u32 crc, data, u32 crc): parsed here, not by
    mpwatch."""
    ends, pos = {0}, 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack("<Q", data[pos : pos + 8])
        pos += 12 + length + 4
        ends.add(pos)
    return ends


def corrupt(data: bytes, rng: random.Random) -> bytes:
    buf = bytearray(data)
    mode = rng.choice(("truncate", "flip", "both"))
    if mode in ("flip", "both"):
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
    if mode in ("truncate", "both"):
        buf = buf[: rng.randrange(len(buf))]
    return bytes(buf)


def check_run(run, expected_complete: bool) -> None:
    import mpwatch

    assert isinstance(run, mpwatch.Run)
    missing = 0
    for tag in TAGS:
        series = run.scalar(tag)
        for step, value in series.items():
            assert step in STEPS, f"garbage step {step} under {tag}"
            assert value == truth(tag, int(step)), f"garbage value at {tag}@{step}: {value}"
        missing += len(STEPS) - len(series)
    unknown = [c for c in run.scalars.columns if c not in TAGS]
    assert not unknown, f"garbage tags returned as data: {unknown}"
    if len(run.layers):
        assert run.layers.to_dict("split")["data"] == LAYERS["data"]
    if missing and not expected_complete:
        assert run.warnings, "data was dropped without a warning saying what was skipped"


def test_pristine_reads_completely(pristine):
    import mpwatch

    run = mpwatch.load_run(os.path.dirname(pristine), warn=False)
    assert run.warnings == []
    check_run(run, expected_complete=True)
    for tag in TAGS:
        assert len(run.scalar(tag)) == len(STEPS)


def test_random_truncations_and_flipped_bytes(pristine, tmp_path):
    import mpwatch

    data = open(pristine, "rb").read()
    boundaries = record_boundaries(data)
    rng = random.Random(20261121)
    deadline = time.monotonic() + TIME_BUDGET_S
    done = 0
    while done < CASES and time.monotonic() < deadline:
        case_dir = tmp_path / f"case{done}"
        case_dir.mkdir()
        corrupted = corrupt(data, rng)
        (case_dir / os.path.basename(pristine)).write_bytes(corrupted)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                run = mpwatch.load_run(str(case_dir), warn=False)
            except Exception as e:  # noqa: BLE001 - the point is that nothing escapes
                pytest.fail(f"case {done}: reader raised {type(e).__name__}: {e}")
        # a file cut exactly after a record is a valid, shorter file: nothing to warn about
        clean_cut = data.startswith(corrupted) and len(corrupted) in boundaries
        check_run(run, expected_complete=clean_cut)
        shutil.rmtree(case_dir)
        done += 1
    assert done >= 30, f"only {done} cases ran within {TIME_BUDGET_S}s"


def test_directory_of_garbage_files_is_not_data(tmp_path):
    import mpwatch

    rng = random.Random(7)
    noise = bytes(rng.randrange(256) for _ in range(4096))
    (tmp_path / "events.out.tfevents.1.host").write_bytes(noise)
    (tmp_path / "events.out.tfevents.2.host").write_bytes(b"")
    run = mpwatch.load_run(str(tmp_path), warn=False)
    assert not run.has_data
    assert run.warnings
