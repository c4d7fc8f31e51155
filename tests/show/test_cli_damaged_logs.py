"""``mpwatch diagnose`` on damaged logs (issue 49, "damaged logs said aloud"): a corrupt record, a
file that is no event file, a folder or file without permission, a tail still being written.
Each is said (which file, where, how much), in every format; unreadable data is an error that
``--fail-on error`` counts (exit 1), and a logdir where nothing could be read for it exits 2.

The damage is made at offsets computed here from the TFRecord framing (u64 length, u32 masked
crc of the length, data, u32 masked crc of the data), not by mpwatch's reader. Permissions are
tested for real: as root (who reads everything) the CLI runs in a forked child that dropped to
the user ``nobody``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

import jsonschema
import pytest
from builders import event_files, write_clean_run
from framing import frame  # noqa: E402

from mpwatch.show import cli, report


def diagnose(*args: str) -> subprocess.CompletedProcess:
    """The real command line: ``python -m mpwatch diagnose ...``."""
    return subprocess.run([sys.executable, "-m", "mpwatch", "diagnose", *args],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("clean"))
    write_clean_run(root)
    return root


@pytest.fixture(scope="module")
def corrupt(clean, tmp_path_factory) -> dict:
    """The clean run with its third record's length crc flipped."""
    root = str(tmp_path_factory.mktemp("corrupt"))
    (src,) = event_files(clean)
    data = bytearray(open(src, "rb").read())
    records = frame(bytes(data))
    start3 = records[2][0]
    data[start3 + 9] ^= 0x5A  # a byte of record 3's length crc
    path = os.path.join(root, os.path.basename(src))
    with open(path, "wb") as fh:
        fh.write(bytes(data))
    return {"logdir": root, "file": path, "start3": start3, "skipped": len(records) - 2,
            "nbytes": len(data) - start3}  # fmt: skip


def test_the_clean_run_passes_the_gate(clean):
    assert cli.main(["diagnose", clean, "--fail-on", "warning", "-o", os.devnull]) == 0


def test_a_corrupt_record_is_an_error_the_gate_counts(corrupt):
    said = (
        f"{corrupt['file']}: record 3 at byte {corrupt['start3']} is corrupt (its length's crc "
        f"does not match); skipped the rest of the file ({corrupt['skipped']} records, "
        f"{corrupt['nbytes']} bytes)"
    )
    plain = diagnose(corrupt["logdir"])
    assert plain.returncode == 0, plain.stderr  # no --fail-on: the report, exit 0
    assert said in plain.stdout
    assert "ERROR   Event file damaged: record 3 of " in plain.stdout
    assert "1 error(s), 0 warning(s)" in plain.stdout
    gate = diagnose(corrupt["logdir"], "--fail-on", "error")
    assert gate.returncode == 1 and said in gate.stdout


@pytest.mark.parametrize("fmt", ["text", "markdown", "json", "html"])
def test_the_finding_is_in_every_format(corrupt, fmt, tmp_path, capsys):
    out = tmp_path / f"report.{fmt}"
    code = cli.main(["diagnose", corrupt["logdir"], "--format", fmt, "-o", str(out),
                     "--fail-on", "error"])  # fmt: skip
    assert code == 1
    text = out.read_text(encoding="utf-8")
    assert f"record 3 at byte {corrupt['start3']} is corrupt" in text
    assert "1 error(s)" in capsys.readouterr().err
    if fmt == "json":
        doc = json.loads(text)
        jsonschema.validate(doc, report.JSON_SCHEMA)
        (f,) = [f for f in doc["findings"] if f["severity"] == "error"]
        assert f["rule"] == "damaged-logs" and f["data"]["record"] == 3
        assert f["data"]["records"] == corrupt["skipped"] and doc["counts"]["error"] == 1
    if fmt == "markdown":
        assert "## 🔴 error: Event file damaged" in text
    if fmt == "html":
        assert 'data-rule="damaged-logs"' in text


def test_random_bytes_are_not_an_event_file(tmp_path):
    junk = tmp_path / "events.out.tfevents.1700000000.host"
    junk.write_bytes(random.Random(49).randbytes(4096))
    for gate in ([], ["--fail-on", "error"]):
        got = diagnose(str(tmp_path), *gate)
        # nothing could be read, and something was there: an unreadable logdir, not "no data"
        assert got.returncode == cli.EXIT_USAGE == 2
        assert f"{junk}: not an event file: its first 12 bytes are not a TFRecord record " \
            "header" in got.stdout  # fmt: skip
        assert "truncated" not in got.stdout + got.stderr
        assert "may still be writing" not in got.stdout + got.stderr
        assert got.stderr.startswith("mpwatch diagnose: no mpwatch data could be read in ")
        assert "not an event file" in got.stderr and got.stderr.rstrip().endswith("Exit 2.")
    got = diagnose(str(tmp_path), "--format", "json")
    doc = json.loads(got.stdout)
    assert doc["has_data"] is False and doc["counts"]["error"] == 1


def test_random_bytes_beside_a_good_run(clean, tmp_path):
    shutil.copytree(clean, tmp_path / "good")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "events.out.tfevents.1.host").write_bytes(bytes(range(256)) * 4)
    got = diagnose(str(tmp_path), "--fail-on", "error")
    assert got.returncode == 1
    assert "run 'junk': no mpwatch data could be read" in got.stdout
    assert "Not an event file: events.out.tfevents.1.host" in got.stdout


def test_a_tail_still_being_written_is_a_note(clean, tmp_path):
    (src,) = event_files(clean)
    data = open(src, "rb").read()
    last, size = frame(data)[-1]
    (tmp_path / os.path.basename(src)).write_bytes(data[: last + size - 2])
    got = diagnose(str(tmp_path), "--fail-on", "warning")
    assert got.returncode == 0
    assert "INFO    Last record of events.out.tfevents." in got.stdout
    assert f"truncated at byte {last}" in got.stdout and "0 error(s), 0 warning(s)" in got.stdout


# --- permissions ---------------------------------------------------------------------------------
def cli_unprivileged(argv: list[str]) -> tuple[int, str, str]:
    """``cli.main(argv)`` in a forked child without root's privileges (``nobody`` when this runs
    as root, who reads every folder): (exit code, stdout, stderr)."""
    import pwd

    # what the child needs is imported first (the same command, here): the child may not read
    # root's site-packages
    from tensorboard.compat.proto import event_pb2  # noqa: F401

    cli.main([*argv, "-o", os.devnull])
    nobody = pwd.getpwnam("nobody") if os.geteuid() == 0 else None
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 97
            try:
                try:
                    if nobody is not None:
                        os.setgroups([])
                        os.setgid(nobody.pw_gid)
                        os.setuid(nobody.pw_uid)
                except PermissionError:
                    os._exit(98)
                sys.stdout = open(out.fileno(), "w", closefd=False)
                sys.stderr = open(err.fileno(), "w", closefd=False)
                code = cli.main(argv)
                sys.stdout.flush()
                sys.stderr.flush()
            except BaseException:  # say why in the child's stderr, then exit 97
                traceback.print_exc(file=sys.stderr)
                sys.stderr.flush()
            finally:
                os._exit(code)
        deadline = time.monotonic() + 120
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail("the unprivileged mpwatch diagnose did not finish in 120 s")
            time.sleep(0.05)
        code = os.waitstatus_to_exitcode(status)
        if code == 98:
            pytest.skip("cannot drop root's privileges here (no CAP_SETUID), and root reads "
                        "every folder: permission denied cannot be made")  # fmt: skip
        out.seek(0)
        err.seek(0)
        return code, out.read().decode(), err.read().decode()


@pytest.fixture
def shared_logdir(clean):
    """A logdir ``nobody`` may enter (pytest's tmp_path is root's alone): ``good`` (the clean
    run), ``locked`` (a run folder without permission), ``files`` (a folder whose event file
    has no read permission)."""
    root = tempfile.mkdtemp(prefix="mpwatch-damaged-")
    os.chmod(root, 0o755)
    shutil.copytree(clean, os.path.join(root, "good"))
    for name in ("locked", "files"):
        shutil.copytree(clean, os.path.join(root, name))
    for d, _, files in os.walk(root):
        os.chmod(d, 0o755)
        for f in files:
            os.chmod(os.path.join(d, f), 0o644)
    os.chmod(os.path.join(root, "locked"), 0)
    (hidden,) = event_files(os.path.join(root, "files"))
    os.chmod(hidden, 0)
    yield root
    os.chmod(os.path.join(root, "locked"), 0o755)
    shutil.rmtree(root)


def test_a_folder_without_permission_is_said(shared_logdir):
    locked = os.path.join(shared_logdir, "locked")
    (hidden,) = [os.path.join(shared_logdir, "files", f)
                 for f in os.listdir(os.path.join(shared_logdir, "files"))]  # fmt: skip
    code, out, err = cli_unprivileged(["diagnose", shared_logdir, "--fail-on", "error"])
    assert code == 1, (out, err)
    assert f"ERROR   Folder cannot be read: permission denied: {locked}; any run in it was " \
        "not read" in out  # fmt: skip
    assert f"{locked}: cannot be read (Permission denied); any run in it was not read" in out
    assert "ERROR   Event file cannot be read: permission denied: " in out
    assert f"{hidden}: cannot be read (Permission denied); skipped" in out
    assert "run 'good'" in out and "2 error(s), 0 warning(s)" in out
    # the locked folder alone: nothing could be read, and it may hold a run: exit 2
    code, out, err = cli_unprivileged(["diagnose", shared_logdir, "--run", "good",
                                       "--fail-on", "error"])  # fmt: skip
    assert code == 0, (out, err)
    shutil.rmtree(os.path.join(shared_logdir, "good"))
    shutil.rmtree(os.path.join(shared_logdir, "files"))
    code, out, err = cli_unprivileged(["diagnose", shared_logdir])
    assert code == cli.EXIT_USAGE, (out, err)
    assert "found no event file" not in err
    assert err.startswith(f"mpwatch diagnose: no mpwatch data could be read in {shared_logdir!r}")
    assert f"{locked}: cannot be read (Permission denied)" in err
