"""mpwatch's own JAX programs compiled once per machine (mpwatch/record/runtime/program_cache.py).

The truth is JAX's own compile: a fit whose probe programs are compiled by XLA in the process
(cache off) writes the probe records the test compares with, record for record and bit for bit,
those of a fit that compiled and kept them (empty cache), of a later process that loaded them,
and of one whose cache entries were damaged (compiled again, training not lost). The records are
parsed from the event files by the tests' own reader. Each fit runs in its own process
(tests/jax/program_cache_fit.py): what a cache is for is the next process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from repo_scripts import ROOT

pytest.importorskip("jax")


def _run(out, cache, **env_extra):
    env = dict(os.environ, KERAS_BACKEND="jax", PYTHONPATH=str(ROOT), MPWATCH_CACHE_DIR=str(cache))
    env.update(env_extra)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "jax" / "program_cache_fit.py"), str(out)],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(out / "truth.json") as f:
        truth = json.load(f)
    truth["stderr"] = proc.stderr
    return truth


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("program_cache")
    cache = base / "cache"
    got = {}
    for name, where, extra in [
        ("off", "off", {}),
        ("cold", cache, {}),
        ("warm", cache, {"DAMAGE": "1"}),
    ]:
        out = base / name
        out.mkdir()
        got[name] = _run(out, where, **extra)
    return got


def _probes(read_events, fit):
    _, records = read_events(fit["logdir"])
    return records["probe"]


def test_the_cache_is_off_when_asked(runs):
    off = runs["off"]
    assert off["folder"] is None
    assert off["fits"][0]["cache"] == {"hits": 0, "misses": 0, "errors": 0}


def test_a_first_process_compiles_and_keeps_each_program(runs):
    cold = runs["cold"]["fits"][0]
    assert cold["cache"]["hits"] == 0 and cold["cache"]["misses"] >= 2
    names = sorted(cold["entries"])
    assert any(n.startswith("probe-") for n in names), names
    assert any(n.startswith("float8-") for n in names), names
    assert all(size > 0 for size in cold["entries"].values())


def test_a_later_process_loads_them_and_compiles_nothing(runs):
    warm = runs["warm"]["fits"][0]
    assert warm["cache"] == {"hits": runs["cold"]["fits"][0]["cache"]["misses"], "misses": 0,
                             "errors": 0}  # fmt: skip
    assert warm["entries"] == runs["cold"]["fits"][0]["entries"]


def test_on_a_cpu_only_a_cached_program_is_loaded_beside_training(runs):
    # a compile beside training would share the two cores with it; a load is light work
    assert runs["cold"]["fits"][0]["ahead"] is False
    assert runs["off"]["fits"][0]["ahead"] is False
    assert runs["warm"]["fits"][0]["ahead"] is True


def test_loaded_programs_write_the_records_jax_own_compile_writes(runs, read_events):
    truth = _probes(read_events, runs["off"]["fits"][0])
    assert len(truth) == 3  # steps 2, 4, 6
    for name in ("cold", "warm"):
        got = _probes(read_events, runs[name]["fits"][0])
        assert [s for s, _ in got] == [s for s, _ in truth]
        for (_, a), (_, b) in zip(got, truth):
            assert a == b, name
    assert "float8" in truth[0][1]  # the float8 capture ran from the cache too


def test_training_is_the_same_with_or_without_the_cache(runs):
    weights = runs["off"]["fits"][0]["weights"]
    for name in ("cold", "warm"):
        for fit in runs[name]["fits"]:
            assert fit["weights"] == weights


def test_a_damaged_entry_is_compiled_again_and_replaced(runs, read_events):
    warm = runs["warm"]
    assert warm["damaged"] == sorted(runs["cold"]["fits"][0]["entries"])
    again = warm["fits"][1]
    assert again["cache"]["errors"] == len(warm["damaged"])
    assert again["cache"]["hits"] == 0
    # rewritten whole (an executable's bytes differ by a few ids from one compile to the next)
    assert sorted(again["entries"]) == sorted(runs["cold"]["fits"][0]["entries"])
    assert all(size > len(b"not an executable" * 100) for size in again["entries"].values())
    assert "not loaded" in warm["stderr"]  # said, once per entry
    assert _probes(read_events, again) == _probes(read_events, runs["off"]["fits"][0])


def test_a_jax_fit_does_not_import_tensorflow(runs):
    # the event files are written without TensorBoard's tf.io.gfile, which imports TensorFlow
    # when it is installed (seconds and memory of a JAX process, for a makedirs and an open)
    assert runs["off"]["tensorflow_imported"] is False
    assert runs["cold"]["tensorflow_imported"] is False


def test_prune_removes_the_least_recently_used_entries_first(tmp_path):
    from mpwatch.record.runtime import program_cache

    for i, size in enumerate([400, 300, 200, 100]):  # entry 0 the oldest
        path = tmp_path / f"p-{i}.xla"
        path.write_bytes(b"x" * size)
        os.utime(path, ns=(10**18 + i * 10**9, 10**18 + i * 10**9))
    (tmp_path / "other.txt").write_bytes(b"y" * 1000)  # not an entry: left alone
    program_cache.prune(str(tmp_path), limit=350)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.txt", "p-2.xla", "p-3.xla"]
    program_cache.prune(str(tmp_path), limit=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.txt"]


def test_the_key_changes_with_the_machine_and_the_program(monkeypatch):
    from mpwatch.record.runtime import program_cache

    class Lowered:
        def __init__(self, text):
            self.text = text

        def as_text(self, debug_info=True):
            assert debug_info is False  # names and source lines do not count
            return self.text

    monkeypatch.setattr(program_cache, "_machine", lambda devices: os.environ.get("XLA_FLAGS", ""))
    monkeypatch.setenv("XLA_FLAGS", "")
    a = program_cache.program_key(Lowered("module @a"), "probe")
    assert a == program_key_again(program_cache, Lowered("module @a"), "probe")
    assert a != program_cache.program_key(Lowered("module @b"), "probe")
    assert a != program_cache.program_key(Lowered("module @a"), "float8")
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=true")
    assert a != program_cache.program_key(Lowered("module @a"), "probe")


def program_key_again(program_cache, lowered, label):
    return program_cache.program_key(lowered, label)


def test_the_machine_names_the_processor_on_a_cpu():
    import jax

    from mpwatch.record.runtime import program_cache

    machine = program_cache._machine(jax.devices())
    assert f"jax {jax.__version__}" in machine
    if jax.devices()[0].platform == "cpu" and os.path.exists("/proc/cpuinfo"):
        assert "flags" in machine or "Features" in machine


def test_a_program_over_several_devices_is_compiled_as_before_and_never_kept(tmp_path):
    code = (
        "import jax, jax.numpy as jnp\n"
        "from mpwatch.record.runtime import program_cache\n"
        "low = jax.jit(lambda a: a * 2).lower(jnp.ones(4))\n"
        "assert jax.device_count() == 2\n"
        "assert program_cache.entry(low, 't') is None and not program_cache.cached(low, 't')\n"
        "assert float(program_cache.load_or_compile(low, 't')(jnp.ones(4)).sum()) == 8.0\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPWATCH_CACHE_DIR=str(tmp_path / "cache"),
               XLA_FLAGS="--xla_force_host_platform_device_count=2")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (tmp_path / "cache" / "xla").exists()
