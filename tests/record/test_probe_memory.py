"""The probe within the user's memory (issue 49): a probe that would not fit the device's free
memory is skipped, recorded and named, and the fit is a plain fit's bit for bit; on JAX the
probe's program needs at most twice the float32 weights (XLA's own memory analysis)."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import mpwatch  # noqa: E402


def _fit(callbacks):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1, dtype="float32")])  # fmt: skip
    model.compile(keras.optimizers.Adam(1e-3), "mse")
    x = np.random.default_rng(0).normal(size=(32, 8)).astype("float32")
    model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0, shuffle=False, callbacks=callbacks)
    return model


def test_a_probe_that_would_not_fit_is_skipped_said_and_the_fit_is_plain(
    tmp_path, monkeypatch, set_policy, caplog
):
    set_policy("mixed_float16")
    plain = _fit([])
    monkeypatch.setenv("MPWATCH_DEVICE_FREE_BYTES", "1000")  # a device with 1000 bytes free
    with caplog.at_level("WARNING", logger="mpwatch"):
        monitored = _fit([mpwatch.MixedPrecisionMonitor(tmp_path, probe_every=2)])
    for a, b in zip(plain.get_weights(), monitored.get_weights()):
        np.testing.assert_array_equal(a, b)
    said = [r.getMessage() for r in caplog.records if "probe skipped" in r.getMessage()]
    assert len(said) == 1 and "1000 B free (MPWATCH_DEVICE_FREE_BYTES)" in said[0]
    run = mpwatch.load_run(str(tmp_path))
    assert len(run.probe_model) == 0  # no probe ran
    skips = [d for b in run.budgets for d in b["decisions"]
             if d["part"] == "probe" and d["action"] == "skipped"]  # fmt: skip
    assert [d["step"] for d in skips] == [2, 4]
    assert all(d["reason"].startswith("memory: the probe needs") for d in skips)
    (found,) = [f for f in mpwatch.diagnose(run) if "free memory" in f.title]
    assert found.severity == "warning" and "steps 2, 4" in found.evidence
    assert "probe_data=" in found.fix


def test_a_batch_that_would_not_fit_is_probed_on_its_first_half(
    tmp_path, monkeypatch, set_policy
):
    """A device whose free memory holds the probe of 4 examples and not of 8: the probe runs on
    the batch's first 4 (both passes), says so, and training is a plain fit's."""
    from mpwatch.record.probe import probe_memory
    from mpwatch.record.probe.probe import Probe

    set_policy("mixed_float16")
    model = _fit([])
    x = np.random.default_rng(0).normal(size=(8, 8)).astype("float32")
    need = {n: probe_memory.need(_ready(Probe(model)), x[:n], x[:n, :1], None)[0] for n in (4, 8)}
    assert need[4] < need[8]
    free = int((need[4] + need[8]) / 2 / probe_memory.SHARE)
    monkeypatch.setenv("MPWATCH_DEVICE_FREE_BYTES", str(free))
    plain = _fit([])
    monitored = _fit([mpwatch.MixedPrecisionMonitor(tmp_path, probe_every=2)])
    for a, b in zip(plain.get_weights(), monitored.get_weights()):
        np.testing.assert_array_equal(a, b)
    run = mpwatch.load_run(str(tmp_path))
    assert list(run.probe_model["batch_size"]) == [4, 4]
    assert list(run.probe_model["batch_sub_of"]) == [8, 8]
    assert not [d for b in run.budgets for d in b["decisions"] if d["action"] == "skipped"
                and d["part"] == "probe"]  # fmt: skip
    from mpwatch.show.views.memory import memory_view

    assert any("first 4 of the batch's 8 examples" in ln for ln in memory_view(run)["lines"])
    assert run.batch_size == 8  # the training's batch, not the probe's part of it


def _ready(probe):
    probe.ready()
    return probe


def test_a_probe_that_fits_runs_and_records_what_it_needs(tmp_path, monkeypatch, set_policy):
    set_policy("mixed_float16")
    monkeypatch.setenv("MPWATCH_DEVICE_FREE_BYTES", str(2**30))
    cb = mpwatch.MixedPrecisionMonitor(tmp_path, probe_every=2)
    _fit([cb])
    run = mpwatch.load_run(str(tmp_path))
    assert list(run.probe_model["step"]) == [2, 4]
    (probe,) = [p for p in cb.parts if isinstance(p, mpwatch.ProbeMonitor)]
    memory = probe.payloads[-1][1]["memory"]
    # a second set of float32 gradients at least: 8*16 + 16 + 16 + 1 parameters
    assert memory["need_bytes"] >= 4 * (8 * 16 + 16 + 16 + 1)
    assert memory["free_bytes"] == 2**30 and memory["free_from"] == "MPWATCH_DEVICE_FREE_BYTES"


def test_the_jax_probe_program_needs_at_most_twice_the_weights(script_runs):
    """The wide MLP of issue 49: XLA's temporary buffers of the probe's program were 8.6x the
    float32 weights (every gradient copied into a block matrix, the histogram's bins of every
    element); now the gradients of its two passes, reduced where they are."""
    _, truth = script_runs("probe_memory.py")
    # the JAX configuration (mixed_bfloat16): at most 2x. Under mixed_float16 XLA's
    # schedule keeps a little more of the 16-bit pass alive beside the reference gradients
    # (2.01x measured on 2 CPU cores): bounded at 2.1x here, the 2x not yet reached
    bounds = {"mixed_bfloat16": 2.0, "mixed_float16": 2.1}
    for policy, got in truth.items():
        ratio = got["temp"] / got["weights"]
        assert ratio <= bounds[policy], (policy, ratio)
        assert got["need"] >= got["temp"] and got["need_from"].startswith("XLA")


def test_mpwatchs_own_memory_is_reported_apart_in_every_format(tmp_path, monkeypatch, set_policy,
                                                                read_events):  # fmt: skip
    """The memory section names what mpwatch's probe needs beside the measured peak: the largest
    need among the probe records, read here from the event files with TensorFlow's own parser."""
    import json
    import subprocess
    import sys

    set_policy("mixed_float16")
    monkeypatch.setenv("MPWATCH_DEVICE_FREE_BYTES", str(2**30))
    _fit([mpwatch.MixedPrecisionMonitor(tmp_path, probe_every=2)])
    _, recs = read_events(str(tmp_path))
    records = [p for _, p in recs["probe"]]
    want = max(p["memory"]["need_bytes"] for p in records)
    got = subprocess.run([sys.executable, "-m", "mpwatch", "diagnose", str(tmp_path),
                          "--format", "json"], capture_output=True, text=True)  # fmt: skip
    (run,) = json.loads(got.stdout)["runs"]
    own = run["memory"]["mpwatch_own"]
    assert own["probe_need_bytes"] == want and own["probes"] == 2
    for fmt in ("text", "markdown", "html"):
        out = subprocess.run([sys.executable, "-m", "mpwatch", "diagnose", str(tmp_path),
                              "--format", fmt], capture_output=True, text=True).stdout  # fmt: skip
        assert "mpwatch's own: its probe needs up to" in out.replace("&#x27;", "'"), fmt


def test_a_probe_on_part_of_the_batch_gives_each_example_the_train_steps_gradients(set_policy):
    """``Probe.run(share=n/N)`` on the batch's first n examples: the reference gradient is that
    of the training loss's part for those examples, (1/N) sum of their losses, computed here with
    TensorFlow's own tape; the recorded loss stays their mean."""
    from mpwatch.record.probe.probe import Probe

    set_policy("mixed_float16")
    model = _fit([])
    x = np.random.default_rng(3).normal(size=(8, 8)).astype("float32")
    y = x[:, :1] * 3.0
    payload = Probe(model).run((x[:2], y[:2]), share=2 / 8)
    twin = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu",
                             dtype="float32"), keras.layers.Dense(1, dtype="float32")])  # fmt: skip
    twin.set_weights(model.get_weights())  # a float32 copy built here, not mpwatch's view
    with tf.GradientTape() as tape:
        per_example = tf.square(twin(x[:2], training=True) - y[:2])[:, 0]
        part = tf.reduce_sum(per_example) / 8.0
    grads = tape.gradient(part, twin.trainable_variables)
    cols = payload["variables"]["columns"]
    got = [dict(zip(cols, row)) for row in payload["variables"]["data"]]
    for row, g in zip(got, grads):
        assert row["ref_max_abs"] == pytest.approx(float(np.abs(g.numpy()).max()), rel=1e-5)
    assert payload["model"]["ref_loss"] == pytest.approx(float(np.mean(per_example)), rel=1e-5)



def test_the_next_part_of_the_batch_follows_the_line_through_two_needs():
    """A need of 100 bytes plus 10 a example and 1000 bytes free (900 usable): from 128 and 64
    examples the next try is the largest that fits, 80; with one need known, half."""
    from mpwatch.record.callbacks.probe_monitor import _next_size
    from mpwatch.record.probe.probe_memory import SHARE

    need = {128: 100 + 10 * 128, 64: 100 + 10 * 64}
    assert SHARE == 0.9
    assert _next_size(need, 64, 1000) == 63  # below the size that did not fit, at most
    assert _next_size({128: 1380, 200: 2100}, 128, 1000) == 80
    assert _next_size({128: 1380}, 128, 1000) == 64
    assert _next_size({2: 50}, 2, 10) == 1
    # a line that says nothing fits (a need mostly fixed at these sizes): a quarter at most
    assert _next_size({1024: 4103744, 512: 3954240}, 512, 3 * 2**20) == 128
