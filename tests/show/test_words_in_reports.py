"""Issue 24, item 8: the words of ``mpwatch diagnose``. No escape code without colours
(``--no-color``, ``NO_COLOR``, ``TERM=dumb``, output that is not a terminal), only the report's own
colours on a terminal, each loss scale written one way in a report, times never in exponent
notation.

Every check reads the output of a real ``mpwatch diagnose`` process (on a pseudo-terminal where the
terminal matters). The logdirs: the real quick start fit with a notice whose message is a real Keras
exception (Keras wraps it in ``\\x1b[1m``); a mixed run whose scale collapsed to 2^-9 beside a
float32 run of the same model at 1,400 ms a step (written with ``RunWriter``).
"""

from __future__ import annotations

import json
import os
import pty
import re
import shutil
import subprocess
import sys

import pytest
from builders import LAYER_COLUMNS, layer_rows, run_info

from mpwatch import contract
from mpwatch.record.runtime.writer import RunWriter

MESSAGE = "no float32 twin of this layer"
#: an SGR (colour) sequence, and any escape sequence at all
SGR = re.compile(r"\x1b\[[0-9;]*m")
ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|.)?")


def keras_error() -> str:
    """A recording failure's notice as ``record/callbacks/base.py`` writes it, of a real Keras
    exception."""
    import keras
    import numpy as np

    class Broken(keras.layers.Layer):
        def call(self, x):  # noqa: ANN001, ANN202
            raise ValueError(MESSAGE)

    try:
        Broken(name="broken")(np.zeros((1, 3), "float32"))
    except ValueError as e:
        return f"recording stopped: {type(e).__name__}: {e}"
    raise AssertionError("the layer did not fail")


def mpwatch_diagnose(*args: str, tty: bool = False, **env_extra: str) -> str:
    """``mpwatch diagnose ARGS`` in its own process; its stdout on a pipe, or on a
    pseudo-terminal when ``tty``."""
    exe = os.path.join(os.path.dirname(sys.executable), "mpwatch")
    cmd = [*([exe] if os.path.exists(exe) else [sys.executable, "-m", "mpwatch"]), "diagnose"]
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "TERM")}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="-1", TERM="xterm-256color")
    env.update(env_extra)
    if not tty:
        proc = subprocess.run([*cmd, *args], capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [*cmd, *args], stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.DEVNULL, env=env
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the process closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=300) == 0
    return b"".join(chunks).decode("utf-8").replace("\r\n", "\n")


@pytest.fixture(scope="module")
def notice_logdir(tmp_path_factory, quickstart_logdir):
    """The real quick start fit, with a notice holding Keras' escape codes."""
    root = tmp_path_factory.mktemp("words_notice")
    shutil.copytree(quickstart_logdir, root / "fit")
    message = keras_error()
    assert "\x1b[1m" in message and MESSAGE in message  # Keras' own escapes, truly there
    w = RunWriter(str(root / "fit"))
    w.record(contract.KIND_NOTICE, 8, {"part": "probe", "level": "error", "message": message})
    w.close()
    return str(root)


@pytest.fixture(scope="module")
def collapse_logdir(tmp_path_factory):
    """``mixed``: the scale halves at each of steps 1-24 (each skipped) from 2^15 to 2^-9 and
    stays there to step 200, 700 ms a step; ``fp32``: the same model under float32, 1,400 ms."""
    root = tmp_path_factory.mktemp("words_collapse")
    w = RunWriter(str(root / "mixed"))
    w.record(contract.KIND_RUN_INFO, 0, run_info("mixed_float16", batch_size=32))
    w.record(contract.KIND_LAYERS, 1, {"layers": contract.table(LAYER_COLUMNS, layer_rows())})
    steps = list(range(1, 201))
    w.scalar_series(contract.LOSS_SCALE, steps, [2.0 ** (15 - min(s, 24)) for s in steps])
    w.scalar_series(contract.STEP_SKIPPED, steps, [1.0 if s <= 24 else 0.0 for s in steps])
    for s in range(10, 201, 10):
        w.scalars(s, {contract.TRAIN_LOSS: 2.0 / s, contract.STEP_TIME_MS: 700.0,
                      contract.PEAK_MEMORY_MB: 500.0})  # fmt: skip
    w.close()
    w = RunWriter(str(root / "fp32"))
    w.record(contract.KIND_RUN_INFO, 0, run_info("float32", batch_size=32))
    w.record(
        contract.KIND_LAYERS, 1, {"layers": contract.table(LAYER_COLUMNS, layer_rows("float32"))}
    )
    for s in range(10, 201, 10):
        w.scalars(s, {contract.TRAIN_LOSS: 2.0 / s, contract.STEP_TIME_MS: 1400.0,
                      contract.PEAK_MEMORY_MB: 800.0})  # fmt: skip
    w.close()
    return str(root)


@pytest.mark.parametrize(
    ("args", "tty", "env"),
    [
        ((), False, {}),  # not a terminal
        (("--no-color",), True, {}),
        ((), True, {"NO_COLOR": "1"}),
        ((), True, {"TERM": "dumb"}),
    ],
    ids=["pipe", "no-color-flag", "NO_COLOR", "TERM-dumb"],
)
def test_no_escape_code_without_colours(notice_logdir, args, tty, env):
    out = mpwatch_diagnose(notice_logdir, *args, tty=tty, **env)
    assert "\x1b" not in out
    assert "[1m" not in out and "[0m" not in out  # not even the escape's visible rest
    assert MESSAGE in out and "[recording]" in out  # the notice is there, as plain text
    assert "[output-16bit]" in out


def test_on_a_terminal_only_the_reports_own_colours(notice_logdir):
    out = mpwatch_diagnose(notice_logdir, tty=True)
    escapes = ESCAPE.findall(out)
    assert escapes, "no colours on a terminal"
    assert all(SGR.fullmatch(e) for e in escapes), sorted(set(escapes))  # colours only
    assert f"\x1b[1m{MESSAGE}" not in out and MESSAGE in out  # Keras' bold is gone


def test_json_findings_hold_no_escape_code(notice_logdir):
    doc = json.loads(mpwatch_diagnose(notice_logdir, "--format", "json"))
    found = [f for f in doc["findings"] if f["rule"] == "recording"]
    assert found and MESSAGE in found[0]["evidence"]
    for f in doc["findings"]:
        for key in ("title", "evidence", "fix"):
            assert "\x1b" not in (f[key] or "") and "[1m" not in (f[key] or ""), (key, f[key])


def _scales_written(text: str) -> dict[int, set[str]]:
    """Every ``2^k (v)`` in the text: k -> the spellings of it."""
    out: dict[int, set[str]] = {}
    for m in re.finditer(r"2\^(-?\d+) \(([0-9.,]+)\)", text):
        k, value = int(m.group(1)), m.group(2)
        assert float(value.replace(",", "")) == pytest.approx(2.0**k, rel=5e-3), m.group(0)
        out.setdefault(k, set()).add(m.group(0))
    return out


def test_each_loss_scale_is_written_one_way(collapse_logdir, notice_logdir, read_events):
    """Every loss scale the runs recorded (read from the event files) that a report mentions is
    written as ``2^k (v)``, one spelling per scale; no bare spelling of it anywhere else (code,
    ``initial_scale=...``, aside)."""
    for logdir in (collapse_logdir, notice_logdir):
        text = mpwatch_diagnose(logdir, "--no-color")
        written = _scales_written(text)
        assert all(len(spellings) == 1 for spellings in written.values()), written
        recorded = set()
        for run in os.listdir(logdir):
            scalars, _ = read_events(os.path.join(logdir, run))
            recorded |= {v for _, v in scalars.get(contract.LOSS_SCALE, []) if abs(v) > 0}
        bare = re.sub(r"2\^-?\d+ \([0-9.,]+\)|=\s*[0-9.e+-]+|\bsteps? [0-9, -]+", " ", text)
        for token in re.findall(r"(?<![\w.^])\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?", bare):
            value = float(token.replace(",", ""))
            for s in recorded:
                # written 2^k, never bare (small integer scales collide with dims and counts)
                if s >= 2**12 or s < 1 / 16:
                    assert value != pytest.approx(s, rel=5e-3), (token, s)
    text = mpwatch_diagnose(collapse_logdir, "--no-color")
    assert "final loss scale 2^-9 (0.00195)" in text
    assert "Loss scale stuck at 2^-9 (0.00195)" in text
    assert "from 2^15 (32768) to 2^-9 (0.00195)" in text
    for wrong in ("0.00195312", "0.001953125", "1.95e-03", "2^-9 (0.001953125)"):
        assert wrong not in text


def test_times_never_in_exponent_notation(collapse_logdir):
    text = mpwatch_diagnose(collapse_logdir, "--no-color")
    assert not re.search(r"\d[eE][+-]?\d+\s*(?:ms|us|s)\b", text), text
    assert "1.4 s/step" in text and "700 ms/step" in text
    assert "step time 700 ms vs 1.4 s" in text
    md = mpwatch_diagnose(collapse_logdir, "--format", "markdown")
    assert "| 1.4 s |" in md and "| 2^-9 (0.00195) |" in md
