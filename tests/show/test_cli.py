"""``mpwatch diagnose``: formats, -o, --run, --fail-on and every exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jsonschema
import pytest
from builders import write_clean_run, write_float32_run, write_mixed_run, write_plain_scalars

from mpwatch import contract
from mpwatch.record.runtime.writer import RunWriter
from mpwatch.show import cli, report


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    write_mixed_run(str(root / "mixed"))
    write_float32_run(str(root / "fp32"))
    return str(root)


@pytest.fixture(scope="module")
def clean_logdir(tmp_path_factory):
    """A run with info-level findings only (a healthy mixed_float16 run on a GPU with Tensor
    Cores: nothing to say but info)."""
    root = tmp_path_factory.mktemp("clean")
    write_clean_run(str(root))
    return str(root)


def test_text_default_exit_0(logdir, capsys):
    assert cli.main(["diagnose", logdir]) == 0
    out = capsys.readouterr().out
    assert "run 'mixed'" in out and "output-16bit" in out and "\x1b[" not in out


@pytest.mark.parametrize("fmt", ["text", "markdown", "json", "html"])
def test_each_format_to_a_file(logdir, tmp_path, fmt, capsys):
    out = tmp_path / f"report.{fmt}"
    assert cli.main(["diagnose", logdir, "--format", fmt, "-o", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert capsys.readouterr().out == ""  # the report went to the file
    assert "predictions" in text
    if fmt == "json":
        jsonschema.validate(json.loads(text), report.JSON_SCHEMA)
    if fmt == "html":
        assert text.startswith("<!doctype html>")


def test_run_option(logdir, capsys):
    assert cli.main(["diagnose", logdir, "--run", "fp32", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in doc["runs"]] == ["fp32"]
    assert all(f["run"] == "fp32" for f in doc["findings"])


def test_fail_on(logdir, clean_logdir):
    assert cli.main(["diagnose", logdir, "--fail-on", "error", "-o", os.devnull]) == 1
    assert cli.main(["diagnose", logdir, "--fail-on", "warning", "-o", os.devnull]) == 1
    assert cli.main(["diagnose", logdir, "--run", "fp32", "--fail-on", "warning",
                     "-o", os.devnull]) == 0  # fmt: skip
    assert cli.main(["diagnose", clean_logdir, "--fail-on", "warning", "-o", os.devnull]) == 0


def test_mixed_float16_on_a_cpu_fails_on_warning(tmp_path):
    """The same healthy run on a CPU: mixed_float16 is likely slower there (no-tensor-cores)."""
    w = RunWriter(str(tmp_path))
    w.record(contract.KIND_RUN_INFO, 0, {"policy": "mixed_float16", "compute_dtype": "float16",
                                        "batch_size": 64, "device": {"type": "CPU"}})  # fmt: skip
    w.scalar_series(contract.LOSS_SCALE, list(range(1, 51)), [32768.0] * 50)
    w.close()
    assert cli.main(["diagnose", str(tmp_path), "--fail-on", "warning", "-o", os.devnull]) == 1


def test_usage_errors_exit_2(tmp_path, capsys):
    assert cli.main(["diagnose"]) == 2
    assert cli.main(["diagnose", str(tmp_path), "--format", "pdf"]) == 2
    assert cli.main(["diagnose", str(tmp_path), "--fail-on", "info"]) == 2
    assert cli.main(["frobnicate"]) == 2
    capsys.readouterr()


def test_unreadable_logdir_exits_2(tmp_path, capsys):
    assert cli.main(["diagnose", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    f = tmp_path / "file"
    f.write_text("x")
    assert cli.main(["diagnose", str(f)]) == 2
    assert cli.main(["diagnose", str(tmp_path), "--run", "nope"]) == 2
    if os.geteuid() != 0:  # root reads anything
        d = tmp_path / "locked"
        d.mkdir()
        d.chmod(0)
        try:
            assert cli.main(["diagnose", str(d)]) == 2
        finally:
            d.chmod(0o755)


def test_unwritable_output_exits_2(logdir, tmp_path, capsys):
    assert cli.main(["diagnose", logdir, "-o", str(tmp_path / "no" / "such" / "dir.txt")]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_exit_codes_are_constants_and_documented(capsys):
    assert (cli.EXIT_OK, cli.EXIT_FINDINGS, cli.EXIT_USAGE, cli.EXIT_NO_DATA) == (0, 1, 2, 3)
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["diagnose", "--help"])
    text = capsys.readouterr().out
    assert "exit codes:" in text
    for code in range(4):
        assert f"\n  {code}  " in text
    assert "no mpwatch data" in text
    for code in range(4):
        assert f"- {code} (:data:`EXIT_" in cli.__doc__


def test_empty_logdir_exits_3(tmp_path, capsys):
    assert cli.main(["diagnose", str(tmp_path)]) == cli.EXIT_NO_DATA == 3
    out, err = capsys.readouterr()
    assert "no mpwatch data" in out  # the report still says so
    assert "no mpwatch data in" in err and str(tmp_path) in err
    assert "events.out.tfevents" in err and "mpwatch/" in err and "found no event file" in err
    # --fail-on does not turn "nothing to diagnose" into a pass
    assert cli.main(["diagnose", str(tmp_path), "--fail-on", "warning", "-o", os.devnull]) == 3


def test_logdir_with_only_keras_scalars_exits_3(tmp_path, capsys):
    write_plain_scalars(str(tmp_path / "train"))  # Keras' own epoch_loss, no mpwatch tag
    assert cli.main(["diagnose", str(tmp_path), "--fail-on", "warning"]) == 3
    out, err = capsys.readouterr()
    assert "no mpwatch data" in out
    assert "1 run(s) (train), none with mpwatch data" in err and "epoch_loss" in err
    assert cli.main(["diagnose", str(tmp_path), "--run", "train", "--format", "json"]) == 3
    out, err = capsys.readouterr()
    assert json.loads(out)["has_data"] is False and "train" in err


def test_missing_logdir_exits_2_not_3(tmp_path, capsys):
    assert cli.main(["diagnose", str(tmp_path / "missing")]) == cli.EXIT_USAGE
    assert "no mpwatch data" not in capsys.readouterr().err


def test_a_logdir_with_data_beside_runs_without_exits_0(logdir, tmp_path, capsys):
    import shutil

    root = tmp_path / "mixed_and_plain"
    shutil.copytree(os.path.join(logdir, "fp32"), root / "fp32")
    write_plain_scalars(str(root / "keras"))
    assert cli.main(["diagnose", str(root), "-o", os.devnull]) == 0
    assert "no mpwatch data in" not in capsys.readouterr().err


def test_progress_bar_on_stderr_when_slow(logdir, monkeypatch, capsys):
    monkeypatch.setenv("MPWATCH_PROGRESS", "1")
    monkeypatch.setattr(cli._Progress, "__init__", _eager_init)
    assert cli.main(["diagnose", logdir, "-o", os.devnull]) == 0
    err = capsys.readouterr().err
    assert "reading event files [" in err and "100.0%" in err


def _eager_init(self, stream, delay=1.0, force=False):
    self.stream, self.delay, self.start, self.enabled, self.shown = stream, -1.0, 0.0, True, False


def test_progress_bar_waits_a_second():
    import io

    stream = io.StringIO()
    bar = cli._Progress(stream, delay=1.0, force=True)
    bar(10, 100)
    assert stream.getvalue() == ""  # reading took less than a second: no bar
    bar.start -= 2.0
    bar(50, 100)
    bar.close()
    assert "50.0%" in stream.getvalue() and stream.getvalue().endswith("\n")
    quiet = cli._Progress(io.StringIO(), delay=0.0)  # not a terminal, not forced
    quiet(1, 2)
    assert not quiet.shown


def test_console_script_and_version():
    out = subprocess.run([sys.executable, "-m", "mpwatch", "--version"], capture_output=True,
                         text=True, check=True)  # fmt: skip
    assert out.stdout.startswith("mpwatch ")
    res = subprocess.run([sys.executable, "-m", "mpwatch", "diagnose", "/definitely/not/here"],
                         capture_output=True, text=True)  # fmt: skip
    assert res.returncode == 2
