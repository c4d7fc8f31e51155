"""A logdir holding only a profiler trace, read as it is: ``mpwatch diagnose``, ``load_run`` and
``load_runs`` give the run its profile from the trace, write nothing into the logdir, and work on a
read-only one.

Ground truth, independent of mpwatch: xprof's own tables of the trace (``kernel_stats`` for the
real H100 trace, ``framework_op_stats`` for a CPU trace), converted here straight from xprof and
summed with pandas; the files of the logdir (path, size, modification time) before and after; a
read-only bind mount (``unshare -m``), where a write fails whoever tries it.

The CPU trace is captured here from a small real Keras fit on the TensorFlow backend with Keras' own
``keras.callbacks.TensorBoard(log_dir, profile_batch=(2, 3))``: the trace lands in
``LOGDIR/train/plugins/profile/<capture>/``, beside Keras' event files (no mpwatch record).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pandas as pd
import pytest
from builders import H100_TRACE, put_h100_trace, xprof_kernel_stats

import mpwatch
from mpwatch import contract
from mpwatch.read import find_runs, load_run, load_runs
from mpwatch.read import traces as raw
from mpwatch.words import duration_ms, percent

pytest.importorskip("xprof.convert.raw_to_tool_data")

ROOT = Path(__file__).resolve().parents[2]


def _files(root) -> dict[str, tuple[int, int]]:
    """Every file under root: relative path -> (size, mtime_ns)."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = os.path.join(dirpath, n)
            st = os.stat(p)
            out[os.path.relpath(p, root)] = (st.st_size, st.st_mtime_ns)
    return out


def _diagnose(logdir, *args, cache=None, wrap=None):
    """``mpwatch diagnose LOGDIR ARGS`` in a subprocess; ``wrap`` runs it inside a shell line
    (``{cmd}`` stands for the command)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), NO_COLOR="1")
    if cache is not None:
        env["MPWATCH_CACHE_DIR"] = str(cache)
    cmd = [sys.executable, "-m", "mpwatch", "diagnose", str(logdir), *args]
    if wrap is not None:
        cmd = ["sh", "-c", wrap.format(cmd=" ".join(f"'{c}'" for c in cmd))]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)


# --- the real H100 trace alone ----------------------------------------------------------------
@pytest.fixture(scope="module")
def xprof_table():
    if not os.path.isfile(H100_TRACE):
        pytest.skip(f"the H100 trace is not here: {H100_TRACE}")
    return xprof_kernel_stats(H100_TRACE)


@pytest.fixture()
def h100_logdir(tmp_path, xprof_table):
    logdir = tmp_path / "gpu_logs"
    put_h100_trace(logdir)
    return logdir


def test_diagnose_on_a_trace_alone_prints_the_profile_findings(h100_logdir, xprof_table, tmp_path):
    before = _files(h100_logdir)
    proc = _diagnose(h100_logdir, "--format", "json", cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr[-3000:]  # findings, no --fail-on: 0 (never 3)
    doc = json.loads(proc.stdout)
    assert doc["has_data"] is True
    (run,) = doc["runs"]
    assert run["name"] == "." and run["has_data"]
    prof = run["profile"]
    t = xprof_table
    total = t["total_duration_us"].sum()
    xprof_tc = t.loc[t["is_kernel_using_tensor_core"].astype(bool), "total_duration_us"].sum()
    assert prof["source"] == "device_kernels"
    assert prof["total_ms"] == pytest.approx(total / 1000)
    assert prof["xprof_tensor_core_share"] == pytest.approx(xprof_tc / total)
    assert sum(prof["by_precision_share"].values()) == pytest.approx(1.0)
    assert prof["trace"] == str(h100_logdir / "plugins" / "profile" / "2025_01_01_00_00_00")
    top = {x["layer"]: x for x in prof["top_layers"]}
    forward = t.loc[
        t["op_name"].eq("jit(train_step)/jvp(conv2d_2)/conv_general_dilated"), "total_duration_us"
    ].sum()
    assert top["conv2d_2"]["forward_ms"] >= forward / 1000 - 1e-9
    rules = {f["rule"] for f in doc["findings"]}
    assert "tensor-core-use" in rules
    # only what a profile can show: nothing that rests on records the run lacks
    assert rules <= {"profile", "tensor-core-use", "tensor-core-alignment"}, rules
    assert _files(h100_logdir) == before  # nothing written into the logdir

    text = _diagnose(h100_logdir, cache=tmp_path / "cache")
    assert text.returncode == 0, text.stderr[-3000:]
    out = text.stdout
    assert "a profiler trace only (no mpwatch record" in out
    assert f"{duration_ms(total / 1000)} of GPU kernel time" in out
    assert f"{percent(xprof_tc / total)} by xprof's 'Kernel uses TensorCore'" in out
    assert "read from the raw trace" in out and "[tensor-core-use]" in out
    assert "no mpwatch data" not in out + text.stderr
    # a CI job's --fail-on: findings are info, so 0; an error threshold never reached
    assert _diagnose(h100_logdir, "--fail-on", "warning").returncode in (0, 1)


def test_load_run_gives_the_profile_of_record_trace(h100_logdir, tmp_path, monkeypatch):
    monkeypatch.setenv("MPWATCH_CACHE_DIR", str(tmp_path / "cache"))
    run = load_run(h100_logdir)
    assert run.has_data and run.info == {} and run.warnings == []
    assert run.profile_trace == str(h100_logdir / "plugins" / "profile" / "2025_01_01_00_00_00")
    # the same figures as the record record_trace writes (the converter the capture runs)
    written = tmp_path / "written"
    shutil.copytree(h100_logdir, written)
    mpwatch.record_trace(written)
    recorded = load_run(written)
    assert recorded.profile_trace is None  # a record: read from it, not from the trace
    assert run.profile_kernels == recorded.profile_kernels
    pd.testing.assert_frame_equal(run.profile_kernel_layers, recorded.profile_kernel_layers)
    assert run.profile_source == recorded.profile_source == "device_kernels"
    # load_runs names the run as find_runs does; traces=False reads records only
    assert find_runs(h100_logdir) == {".": str(h100_logdir)}
    assert list(load_runs(h100_logdir)) == ["."]
    assert not load_run(h100_logdir, traces=False).has_data


def test_the_cache_is_outside_the_logdir_and_follows_the_trace(h100_logdir, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("MPWATCH_CACHE_DIR", str(cache))
    before = _files(h100_logdir)
    first = load_run(h100_logdir)
    entries = sorted((cache / "profiles").iterdir())
    assert len(entries) == 1 and _files(h100_logdir) == before
    # the cache answers the next read (the converter is not called)
    monkeypatch.setattr(raw, "_memory", raw.OrderedDict())
    monkeypatch.setattr(raw, "_convert", lambda capture, *join: pytest.fail("converted again"))
    assert load_run(h100_logdir).profile == first.profile
    # a changed trace (its mtime) is a new key: converted again
    trace = next((h100_logdir / "plugins" / "profile").rglob("*.xplane.pb"))
    os.utime(trace, ns=(trace.stat().st_atime_ns, trace.stat().st_mtime_ns + 10**9))
    calls = []
    monkeypatch.setattr(
        raw, "_convert", lambda capture, *join: calls.append(capture) or first.profile
    )
    load_run(h100_logdir)
    assert calls == [str(trace.parent)]
    assert len(list((cache / "profiles").iterdir())) == 2
    # MPWATCH_CACHE_DIR=off: converted in memory, nothing cached
    monkeypatch.setenv("MPWATCH_CACHE_DIR", "off")
    monkeypatch.setattr(raw, "_memory", raw.OrderedDict())
    assert load_run(h100_logdir).profile == first.profile
    assert len(calls) == 2


def test_a_cache_that_cannot_be_written_converts_in_memory(h100_logdir, tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("MPWATCH_CACHE_DIR", str(blocker / "cache"))  # mkdir fails, even as root
    monkeypatch.setattr(raw, "_memory", raw.OrderedDict())
    run = load_run(h100_logdir)
    assert run.profile_kernels is not None and run.warnings == []


def test_a_damaged_trace_is_a_warning_not_a_crash(tmp_path, monkeypatch):
    monkeypatch.setenv("MPWATCH_CACHE_DIR", str(tmp_path / "cache"))
    capture = tmp_path / "logs" / "plugins" / "profile" / "2025_01_01_00_00_00"
    capture.mkdir(parents=True)
    (capture / "host.xplane.pb").write_bytes(b"\xff\x00 not a protobuf")
    run = load_run(tmp_path / "logs", warn=False)
    assert not run.has_data and run.profile is None
    assert any("profiler trace was not read" in w for w in run.warnings), run.warnings
    proc = _diagnose(tmp_path / "logs", cache=tmp_path / "cache")
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "the profiler trace was not read" in proc.stderr  # says why, not only "no data"
    assert "the profiler trace was not read" in proc.stdout  # and the report too


def test_a_trace_beside_a_recorded_run_is_a_run_of_its_own(h100_logdir, tmp_path, monkeypatch):
    """``jax.profiler.trace(LOGDIR)`` beside ``MixedPrecisionMonitor(LOGDIR/run1)``: two runs;
    ``load_run(LOGDIR)`` no longer guesses, and names them."""
    from builders import write_mixed_run

    monkeypatch.setenv("MPWATCH_CACHE_DIR", str(tmp_path / "cache"))
    write_mixed_run(str(h100_logdir / "run1"), steps=3)
    assert list(find_runs(h100_logdir)) == [".", "run1"]
    with pytest.raises(ValueError, match=r"2 runs \(\., run1\)"):
        load_run(h100_logdir)
    assert load_run(h100_logdir, ".").profile_trace is not None
    assert load_run(h100_logdir, "run1").profile_trace is None


def test_the_cache_keeps_the_most_recently_used_entries(tmp_path, monkeypatch):
    folder = tmp_path / "profiles"
    folder.mkdir()
    for i in range(5):
        (folder / f"{i}.json.zlib").write_bytes(b"x")
        os.utime(folder / f"{i}.json.zlib", ns=(10**18 + i, 10**18 + i))
    raw._touch(str(folder / "0.json.zlib"))  # a hit: used now
    raw._prune(str(folder), keep=3)
    assert sorted(p.name for p in folder.iterdir()) == ["0.json.zlib", "3.json.zlib", "4.json.zlib"]


def _can_mount_read_only() -> bool:
    try:
        probe = subprocess.run(
            ["unshare", "-m", "sh", "-c", "mount --bind /tmp /tmp && mount -o remount,bind,ro "
             "/tmp /tmp && ! touch /tmp/.mpwatch-ro-probe"],
            capture_output=True, timeout=30,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


@pytest.mark.parametrize("cache", ["elsewhere", "inside", "off"])
def test_a_read_only_logdir_is_read(tmp_path, xprof_table, cache):
    """The logdir on a read-only mount (a write fails, also for root): the profile is read, from a
    cache elsewhere, or in memory when the cache cannot be written (inside the mount) or is off."""
    if shutil.which("unshare") is None or not _can_mount_read_only():
        pytest.skip("no read-only bind mount here (unshare -m / mount not permitted)")
    ro = Path(tempfile.mkdtemp(prefix="mpwatch-ro-", dir=tmp_path))
    put_h100_trace(ro)
    before = _files(ro)
    cache_dir = {"elsewhere": tmp_path / "cache", "inside": ro / "cache", "off": "off"}[cache]
    line = f"mount --bind '{ro}' '{ro}' && mount -o remount,bind,ro '{ro}' && {{cmd}}"
    proc = _diagnose(ro, "--format", "json", cache=cache_dir, wrap=f'unshare -m sh -c "{line}"')
    assert proc.returncode == 0, proc.stderr[-3000:]
    prof = json.loads(proc.stdout)["runs"][0]["profile"]
    total = xprof_table["total_duration_us"].sum()
    assert prof["total_ms"] == pytest.approx(total / 1000)
    assert _files(ro) == before
    if cache == "elsewhere":
        assert len(list((tmp_path / "cache" / "profiles").iterdir())) == 1


# --- a CPU trace from Keras' own TensorBoard callback ---------------------------------------------
KERAS_FIT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import keras

    keras.mixed_precision.set_global_policy("mixed_float16")
    model = keras.Sequential([
        keras.Input((16, 16, 3)),
        keras.layers.Conv2D(8, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(10),
        keras.layers.Activation("softmax", dtype="float32"),
    ])
    model.compile("adam", "sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    x = rng.random((64, 16, 16, 3), dtype=np.float32)
    y = rng.integers(0, 10, 64)
    board = keras.callbacks.TensorBoard(sys.argv[1], profile_batch=(2, 3))
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[board])
    """
)


@pytest.fixture(scope="module")
def keras_trace_logdir(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("keras_profile")
    env = dict(os.environ, KERAS_BACKEND="tensorflow", CUDA_VISIBLE_DEVICES="-1")
    proc = subprocess.run(
        [sys.executable, "-c", KERAS_FIT, str(logdir)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    traces = list(logdir.rglob("*.xplane.pb"))
    assert len(traces) == 1 and traces[0].parent.parent.parent.parent == logdir / "train", traces
    return logdir


def _xprof_host_ops(trace: Path) -> pd.DataFrame:
    """xprof's own framework_op_stats table of a CPU trace (on a copy), host rows, no IDLE."""
    from xprof.convert import raw_to_tool_data

    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "h.xplane.pb")
        shutil.copyfile(trace, copy)
        data, _ = raw_to_tool_data.xspace_to_tool_data([copy], "framework_op_stats", {})
    tables = json.loads(data)
    tables = tables if isinstance(tables, list) else [tables]
    frames = []
    for t in tables:
        cols = [c["id"] for c in t["cols"]]
        frames.append(pd.DataFrame([[c.get("v") for c in r["c"]] for r in t["rows"]], columns=cols))
    df = next(f for f in frames if not f["type"].eq("IDLE").any())
    df = df[df["host_or_device"].str.lower().ne("device")]
    df["total_self_time"] = pd.to_numeric(df["total_self_time"])
    return df


def test_a_keras_tensorboard_profile_is_read_as_it_is(keras_trace_logdir, tmp_path):
    logdir = keras_trace_logdir
    before = _files(logdir)
    proc = _diagnose(logdir, "--format", "json", cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    (run,) = doc["runs"]
    assert run["name"] == "train" and run["has_data"]  # Keras' own run, with its event files
    prof = run["profile"]
    trace = next(logdir.rglob("*.xplane.pb"))
    truth = _xprof_host_ops(trace)
    total = truth["total_self_time"].sum()
    cast = truth.loc[truth["type"].eq("Cast"), "total_self_time"].sum()
    assert prof["source"] == "host_ops" and prof["device"] == "CPU"
    assert prof["total_ms"] == pytest.approx(total / 1000)
    assert prof["cast_share"] == pytest.approx(cast / total)
    assert prof["trace"] == str(trace.parent)
    assert {f["rule"] for f in doc["findings"]} <= {"profile", "tensor-core-use"}
    assert _files(logdir) == before
    text = _diagnose(logdir, cache=tmp_path / "cache")
    assert text.returncode == 0, text.stderr[-3000:]
    assert f"{duration_ms(total / 1000)} of op time" in text.stdout
    assert f"{percent(cast / total)} in Cast ops" in text.stdout
    # load_run: the run that holds the trace, Keras' scalars beside the profile
    loaded = load_run(logdir, "train")
    assert loaded.profile_trace == str(trace.parent)
    assert loaded.records[contract.KIND_PROFILE][0][1]["total_us"] == pytest.approx(total)
