"""What the reader could not read, said exactly (``Run.problems``): the damage is made at offsets
this test computes from the TFRecord framing itself (u64 length, u32 masked crc of the length,
data, u32 masked crc of the data), in event files written by TensorBoard's own writer."""

from __future__ import annotations

import glob
import os
import random
import shutil

import pytest
from framing import frame  # noqa: E402

from mpwatch import contract
from mpwatch import read as reader
from mpwatch.read import problems as p

STEPS = 40
SCALE = 32768.0



@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> str:
    """An event file of TensorBoard's EventFileWriter: its file_version event, then one
    ``mpwatch/loss_scale`` scalar per step."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    logdir = str(tmp_path_factory.mktemp("tb_written"))
    w = EventFileWriter(logdir)
    for step in range(1, STEPS + 1):
        value = summary_pb2.Summary.Value(tag=contract.LOSS_SCALE, simple_value=SCALE)
        w.add_event(event_pb2.Event(step=step, wall_time=1.0, summary=summary_pb2.Summary(
            value=[value])))  # fmt: skip
    w.close()
    (path,) = glob.glob(os.path.join(logdir, "events.out.tfevents.*"))
    return path


def damaged(pristine: str, tmp_path, change) -> tuple[str, bytes]:
    """A copy of the pristine file changed by ``change(bytearray)``; (its path, its bytes)."""
    data = bytearray(open(pristine, "rb").read())
    data = change(data) or data
    path = str(tmp_path / os.path.basename(pristine))
    with open(path, "wb") as fh:
        fh.write(bytes(data))
    return path, bytes(data)


def load(path: str) -> reader.Run:
    return reader.load_run(os.path.dirname(path), warn=False)


def test_pristine_has_no_problem(pristine):
    run = load(pristine)
    assert run.problems == [] and run.warnings == []
    assert len(frame(open(pristine, "rb").read())) == STEPS + 1  # file_version + one per step


def test_corrupt_length_crc_of_the_third_record(pristine, tmp_path):
    records = frame(open(pristine, "rb").read())
    start3 = records[2][0]

    def flip(data):
        data[start3 + 8] ^= 0xFF  # the first byte of record 3's length crc

    path, data = damaged(pristine, tmp_path, flip)
    run = load(path)
    (q,) = run.problems
    assert (q.kind, q.path, q.offset, q.record) == (p.CORRUPT_RECORD, path, start3, 3)
    assert q.records == len(records) - 2 and q.nbytes == len(data) - start3
    assert q.loses_data
    assert q.message == (
        f"{path}: record 3 at byte {start3} is corrupt (its length's crc does not match); "
        f"skipped the rest of the file ({len(records) - 2} records, {len(data) - start3} bytes)"
    )
    assert run.warnings == [q.message]
    # record 2 (step 1) was read; nothing after the damage came back as data
    assert run.scalar(contract.LOSS_SCALE).to_dict() == {1: SCALE}


def test_a_damaged_length_leaves_the_records_after_it_uncounted(pristine, tmp_path):
    records = frame(open(pristine, "rb").read())
    start3 = records[2][0]

    def shorten(data):
        data[start3] ^= 0x01  # record 3's length itself: the framing after it is lost

    path, data = damaged(pristine, tmp_path, shorten)
    (q,) = load(path).problems
    assert (q.kind, q.offset, q.record, q.records) == (p.CORRUPT_RECORD, start3, 3, None)
    assert q.nbytes == len(data) - start3 and "how many records they held is unknown" in q.message

    def huge(data):
        data[start3 + 7] = 0x7F  # a length past the end of the file

    path, _ = damaged(pristine, tmp_path, huge)
    (q,) = load(path).problems
    assert (q.kind, q.offset, q.record) == (p.CORRUPT_RECORD, start3, 3)  # damage, not a cut


def test_random_bytes_are_not_an_event_file(tmp_path):
    path = str(tmp_path / "events.out.tfevents.1700000000.host")
    noise = random.Random(49).randbytes(4096)
    with open(path, "wb") as fh:
        fh.write(noise)
    run = load(path)
    assert not run.has_data
    (q,) = run.problems
    assert (q.kind, q.offset, q.nbytes) == (p.NOT_EVENT_FILE, 0, 4096)
    assert q.message.startswith(f"{path}: not an event file: its first 12 bytes are not a "
                                "TFRecord record header")  # fmt: skip
    assert "truncated" not in q.message and "still be writing" not in q.message


def test_a_data_crc_mismatch_names_the_record(pristine, tmp_path):
    records = frame(open(pristine, "rb").read())
    start5, size5 = records[4]

    def flip(data):
        data[start5 + size5 - 5] ^= 0x01  # the last byte of record 5's data (its value)

    path, _ = damaged(pristine, tmp_path, flip)
    run = load(path)
    (q,) = run.problems
    assert (q.kind, q.offset, q.record, q.records, q.nbytes) == (p.DATA_CRC, start5, 5, 1, size5)
    assert "(the first: record 5 at byte" in q.message
    assert 4 not in run.scalar(contract.LOSS_SCALE).index  # record 5 holds step 4
    assert len(run.scalar(contract.LOSS_SCALE)) == STEPS - 1


def test_a_truncated_tail_is_a_cut_that_loses_nothing_whole(pristine, tmp_path):
    records = frame(open(pristine, "rb").read())
    last, size = records[-1]
    path, data = damaged(pristine, tmp_path, lambda d: d[: last + size - 3])  # data cut
    (q,) = load(path).problems
    assert (q.kind, q.offset, q.record, q.nbytes) == (p.TRUNCATED_TAIL, last, len(records),
                                                      size - 3)  # fmt: skip
    assert not q.loses_data
    assert f"of a {size}-byte record" in q.message and "may still be writing" in q.message

    path, _ = damaged(pristine, tmp_path, lambda d: d[: last + 5])  # header cut
    (q,) = load(path).problems
    assert (q.kind, q.nbytes) == (p.TRUNCATED_TAIL, 5) and "12-byte header" in q.message

    path, _ = damaged(pristine, tmp_path, lambda d: d + bytes(64))  # zeros a crash left
    run = load(path)
    (q,) = run.problems
    assert (q.kind, q.nbytes) == (p.TRUNCATED_TAIL, 64) and "64 zero bytes" in q.message
    assert len(run.scalar(contract.LOSS_SCALE)) == STEPS


def test_load_runs_and_the_warnings_say_the_same(pristine, tmp_path):
    good = tmp_path / "good"
    good.mkdir()
    shutil.copy(pristine, good)
    (tmp_path / "junk").mkdir()
    junk = tmp_path / "junk" / "events.out.tfevents.1.host"
    junk.write_bytes(b"\xff" * 100)
    runs = reader.load_runs(str(tmp_path))
    assert list(runs) == ["good", "junk"]
    assert runs["good"].problems == [] and runs["good"].has_data
    (q,) = runs["junk"].problems
    assert q.kind == p.NOT_EVENT_FILE and runs["junk"].warnings == [q.message]
