"""The reader's check without decoding (``mpwatch.read.check``): for every kind of damage it finds
what ``load_runs`` puts in ``Run.problems``, word for word, and at the offsets this test computes
from the TFRecord framing itself; a file checked before is not read again while it is unchanged,
and one that grew is read from where its whole records ended, with the same result as a first
check of it."""

from __future__ import annotations

import os
import random
import shutil

import pytest
from test_damaged_logs import damaged, frame, pristine  # noqa: F401 - pristine is a fixture

from mpwatch import read as reader
from mpwatch.read import check as check_module
from mpwatch.read import problems as p


def _records(path: str) -> list[tuple[int, int]]:
    with open(path, "rb") as fh:
        return frame(fh.read())


def _damages(pristine):  # noqa: F811 - the fixture
    """name -> change(bytearray) of the pristine file, each kind of damage the reader names."""
    records = _records(pristine)
    start3 = records[2][0]
    start5, size5 = records[4]
    last, size = records[-1]
    end = os.path.getsize(pristine)

    def at(i, value=None, xor=0xFF):
        def change(data):
            data[i] = value if value is not None else data[i] ^ xor

        return change

    return {
        "length_crc": (at(start3 + 8), p.CORRUPT_RECORD, start3),
        "length": (at(start3, xor=0x01), p.CORRUPT_RECORD, start3),
        "huge_length": (at(start3 + 7, value=0x7F), p.CORRUPT_RECORD, start3),
        "data_crc": (at(start5 + size5 - 5, xor=0x01), p.DATA_CRC, start5),
        "cut_data": (lambda d: d[: last + size - 3], p.TRUNCATED_TAIL, last),
        "cut_header": (lambda d: d[: last + 5], p.TRUNCATED_TAIL, last),
        "zeros": (lambda d: d + bytes(64), p.TRUNCATED_TAIL, end),
        "noise": (lambda d: bytearray(random.Random(49).randbytes(4096)), p.NOT_EVENT_FILE, 0),
    }


@pytest.mark.parametrize(
    "damage",
    ["length_crc", "length", "huge_length", "data_crc", "cut_data", "cut_header", "zeros", "noise"],
)
def test_the_check_finds_what_the_reader_says(pristine, tmp_path, damage):  # noqa: F811
    change, kind, offset = _damages(pristine)[damage]
    run_dir = tmp_path / "logs" / "damaged"
    run_dir.mkdir(parents=True)
    path, _ = damaged(pristine, run_dir, change)
    shutil.copytree(os.path.dirname(pristine), tmp_path / "logs" / "good")
    found = check_module.check_runs(str(tmp_path / "logs"))
    (q,) = found["damaged"]
    assert (q.kind, q.path, q.offset) == (kind, path, offset)  # the framing's truth
    runs = reader.load_runs(str(tmp_path / "logs"))
    assert found == {name: run.problems for name, run in runs.items()}
    assert found["good"] == []


def test_an_unchanged_file_is_not_read_again(pristine, tmp_path, monkeypatch):  # noqa: F811
    path, _ = damaged(pristine, tmp_path, lambda d: d[:-3])  # a cut last record
    opened: list[str] = []
    monkeypatch.setattr(
        check_module, "open", lambda f, *a: opened.append(f) or open(f, *a), raising=False
    )
    first = check_module.check_events(path)
    assert opened == [path] and first.problems[0].kind == p.TRUNCATED_TAIL
    assert check_module.check_events(path, first) is first and opened == [path]
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # touched: read again
    again = check_module.check_events(path, first)
    assert opened == [path, path] and again.problems == first.problems


def test_a_growing_file_is_read_from_where_its_whole_records_end(pristine, tmp_path, monkeypatch):  # noqa: F811
    """The pristine file written a piece at a time, cut anywhere (in a header, in the data, after
    a whole record): each check that goes on from the last one equals a first check of the file
    and the reader's problems, and reads only the bytes after the last whole record."""
    with open(pristine, "rb") as fh:
        full = fh.read()
    records = frame(full)
    path = str(tmp_path / os.path.basename(pristine))
    reads: list[int] = []

    class Spy:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def read(self, n=-1):
            out = self.f.read(n)
            reads.append(len(out))
            return out

        def __getattr__(self, name):
            return getattr(self.f, name)

    monkeypatch.setattr(check_module, "open", lambda f, m: Spy(open(f, m)), raising=False)
    cuts = sorted({5, 30, records[3][0], records[3][0] + 7, records[10][0] + 20, len(full) - 1})
    cuts.append(len(full))
    last = None
    written = 0
    with open(path, "wb") as out:
        for cut in cuts:
            out.write(full[written:cut])
            out.flush()
            written = cut
            reads.clear()
            went_on = check_module.check_events(path, last)
            fresh = check_module.check_events(path)
            assert went_on.problems == fresh.problems, cut
            assert list(went_on.problems) == reader.load_run(str(tmp_path), warn=False).problems
            assert (went_on.whole, went_on.records) == (fresh.whole, fresh.records), cut
            whole = [s + n for s, n in records if s + n <= cut]
            assert went_on.whole == (whole[-1] if whole else 0)  # the framing's truth
            before = last.whole if last is not None and last.whole else 0
            mark = len(last.mark) if last is not None and last.whole else 0
            assert reads[: 2 if before else 1] == ([mark, cut - before] if before else [cut])
            last = went_on
    assert last.problems == () and last.records == len(records)


def test_a_file_written_anew_in_place_is_checked_whole(pristine, tmp_path):  # noqa: F811
    """The same file (inode) truncated and written again, longer, with other bytes: the check
    does not go on after what it saw before, it finds what a first check finds."""
    path, data = damaged(pristine, tmp_path, lambda d: d[:-3])
    before = check_module.check_events(path)
    with open(path, "r+b") as fh:  # same inode
        fh.truncate(0)
        fh.write(random.Random(3).randbytes(len(data) + 100))
    after = check_module.check_events(path, before)
    (q,) = after.problems
    assert q.kind == p.NOT_EVENT_FILE and after.problems == check_module.check_events(path).problems


def test_check_runs_forgets_files_that_are_gone(pristine, tmp_path):  # noqa: F811
    run = tmp_path / "run"
    run.mkdir()
    path = shutil.copy(pristine, run)
    files: dict = {}
    assert check_module.check_runs(str(tmp_path), files) == {"run": []}
    assert list(files) == [path]
    os.remove(path)
    assert check_module.check_runs(str(tmp_path), files) == {} and files == {}
