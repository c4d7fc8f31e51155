"""The cost budget (issue 27): mpwatch's optional work runs only when its estimate fits the share
of the fit's time it was given, what did not run is recorded and named by the diagnosis, an
explicit setting wins, and training is untouched either way.

Ground truth: the budget's arithmetic on a clock the test drives; the event files parsed
independently of mpwatch (``read_events``); the training's result against a plain fit of the same
model (``tests/invisible_fit.py``: History, every variable, optimizer state and random streams,
bit for bit); a deferred profile against the same trace converted by hand with the model.
"""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import invisible_fit as experiment  # noqa: E402

import mpwatch  # noqa: E402
from mpwatch import contract  # noqa: E402
from mpwatch.record.runtime import budget as budget_mod  # noqa: E402
from mpwatch.record.runtime.budget import CostBudget  # noqa: E402

#: the first probe's trace, in Keras' first steps
F = budget_mod.PROBE_TRACE_FACTOR


# --- the arithmetic, on a clock the test drives -----------------------------------------------
def test_the_allowance_is_the_share_of_the_projected_fit_less_what_mpwatch_spent():
    b = CostBudget(0.1)
    b.begin_fit({"epochs": 2, "steps": 50}, now=100.0)
    b.batch_end(1, now=104.0)  # the first call: Keras' trace, 4 s
    assert b.step_seconds() is None
    assert b.projected_fit_seconds(now=104.0) == pytest.approx(4.0)  # length unknown yet
    b.batch_end(1, now=104.5)
    b.charge("profile", 0.25)  # optional work, once (recurring work: the test below)
    b.batch_end(1, now=105.25)  # 0.75 s of wall, 0.25 s of it mpwatch's: a 0.5 s step
    assert b.step_seconds() == pytest.approx(0.5)
    assert b.first_step_seconds() == pytest.approx(4.0)
    # 5.25 s so far + 97 steps to come at 0.5 s
    assert b.projected_fit_seconds(now=105.25) == pytest.approx(5.25 + 97 * 0.5)
    left = 0.1 * (5.25 + 97 * 0.5) - 0.25
    assert b.allowance(now=105.25) == pytest.approx(left)
    # the first probe: Keras' first step (its trace) + 3 steps of passes
    assert b.estimate("probe") == pytest.approx(F * 4.0 + 3 * 0.5)
    assert left == pytest.approx(5.125)
    assert b.decide("probe", 3, now=105.25) is False  # F * 4 + 1.5 s > 5.125 s
    d = b.decisions[-1]
    assert (d.action, d.allowance_s) == ("skipped", pytest.approx(5.125))
    assert d.estimate_s == pytest.approx(F * 4.0 + 1.5)
    assert b.decide("probe", 3, now=105.25, ahead=1.0)  # compiled ahead: its passes, 1.5 s


def test_the_step_time_is_the_devices_when_the_host_runs_ahead():
    """Keras' batch ends on its worker thread (JAX on a GPU): the training thread dispatches
    calls 1 ms apart while the device takes 100 ms a step; the results' times, noted by the
    worker, give the steady step time (the host's clock alone would say 1 ms)."""
    b = CostBudget(0.05)
    b.begin_fit({"epochs": 1, "steps": 400}, now=0.0)
    for i in range(1, 6):
        b.batch_end(1, now=0.001 * i)
    assert b.step_seconds() == pytest.approx(0.001)
    for _ in range(4):
        b.call_done(0.1, 1)
    assert b.step_seconds() == pytest.approx(0.1)
    b.call_done(0.4, 2)  # a call of two steps: per step
    assert b.step_seconds() == pytest.approx(0.1)
    b.begin_fit({"epochs": 1, "steps": 400}, now=10.0)  # a new fit forgets them
    b.batch_end(1, now=10.5)
    b.batch_end(1, now=10.501)
    assert b.step_seconds() == pytest.approx(0.001)


def test_a_later_fit_estimates_the_probes_trace_from_the_models_first_trace():
    """A second fit of a model reuses Keras' trace and starts fast; a new monitor's probe still
    traces its passes: its first-probe estimate takes the model's first traced step."""
    b = CostBudget(0.05)
    b.begin_fit({"epochs": 1, "steps": 400}, now=0.0)
    for i in range(1, 4):
        b.batch_end(1, now=0.02 * i)  # 20 ms a step from the first: Keras' trace reused
    assert b.estimate("probe") == pytest.approx(F * 0.02 + 3 * 0.02)
    b.trace_seconds = 2.0  # the model's first monitored fit: a 2 s first step
    assert b.estimate("probe") == pytest.approx(F * 2.0 + 3 * 0.02)
    assert not b.decide("probe", 3, now=0.06)  # 5% of an 8 s fit: the trace does not fit
    b.trace_seconds = 0.01  # never below this fit's own first step
    assert b.estimate("probe") == pytest.approx(F * 0.02 + 3 * 0.02)
    # traced ahead (a CPU without a kept program): the trace already paid is not asked again,
    # and what is left is never less than the passes
    b.trace_seconds = 2.0
    assert b.estimate("probe", traced=1.5) == pytest.approx(F * 2.0 + 3 * 0.02 - 1.5)
    assert b.estimate("probe", traced=5.0) == pytest.approx(3 * 0.02)


def test_a_probe_whose_program_still_compiles_ahead_is_estimated_as_a_compiling_one(tmp_path):
    """On a GPU the probe compiles on a thread beside training; a probe due before that compile
    ends would wait for it on the training thread (H200, keras.io's Transformer: estimated as
    its passes, 0.01 s, it cost 9.8 s). Until the compile is done the estimate is the trace's."""
    from concurrent.futures import Future

    import keras

    from mpwatch.record.callbacks.probe_monitor import ProbeMonitor
    from mpwatch.record.probe.probe import Probe
    from mpwatch.record.probe.probe_jax import JaxProbeFunction

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    fn = JaxProbeFunction.__new__(JaxProbeFunction)  # its compile ahead, as a real future
    compiling: Future = Future()
    fn._ahead = ("the batch's signature", compiling)
    monitor = ProbeMonitor(str(tmp_path), every=100)
    monitor.probe, monitor._ahead = Probe(model), True
    monitor.probe._fn, monitor.probe.float8 = fn, False  # (float8 readiness: estimated apart)
    b = CostBudget(0.05)
    b.begin_fit({"epochs": 1, "steps": 400}, now=0.0)
    for i in range(1, 4):
        b.batch_end(1, now=1.0 + 0.02 * i)  # a 1 s first step (Keras' trace), then 20 ms
    assert monitor.probe.ahead_pending()
    assert monitor._estimate(b) == pytest.approx(F * 1.02 + 3 * 0.02)  # the trace, the passes
    compiling.set_result(None)
    assert not monitor.probe.ahead_pending()
    assert monitor._estimate(b) == pytest.approx(3 * 0.02)  # compiled: the passes alone


def test_a_second_monitored_fit_keeps_the_models_first_step(tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile("sgd", "mse")
    x, y = np.zeros((32, 4), "float32"), np.zeros((32, 3), "float32")
    first = mpwatch.MixedPrecisionMonitor(str(tmp_path / "a"), budget=0.05)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[first])
    traced = first.budget.first_step_seconds()
    second = mpwatch.MixedPrecisionMonitor(str(tmp_path / "b"), budget=0.05)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[second])
    assert second.budget.trace_seconds == pytest.approx(traced)
    assert second.budget.first_step_seconds() < traced  # the trace was reused


def test_decisions_skip_what_does_not_fit_defer_a_conversion_and_let_explicit_work_run():
    b = CostBudget(0.05)
    b.begin_fit({"epochs": 1, "steps": 100}, now=0.0)
    for i in range(1, 4):
        b.batch_end(1, now=float(i))  # 1 s a step: a 100 s fit, 5 s of budget
    assert not b.decide("probe", 3, estimate=6.0, now=3.0)
    assert b.decide("probe", 3, estimate=4.0, now=3.0)
    b.charge("probe", 4.0)
    b.ran("probe", 4.0)
    assert b.decisions[-1].cost_s == 4.0
    assert not b.decide("profile_conversion", 4, estimate=2.0, now=3.0, defer=True)
    assert b.decide("profile", 5, estimate=50.0, explicit=True, now=3.0)
    actions = [(d.part, d.action) for d in b.decisions]
    assert actions == [
        ("probe", "skipped"),
        ("probe", "ran"),
        ("profile_conversion", "deferred"),
        ("profile", "explicit"),
    ]
    # every skip was estimated above what was left, every run within it
    for d in b.decisions:
        if d.action == "skipped" or d.action == "deferred":
            assert d.estimate_s > d.allowance_s
        elif d.action == "ran":
            assert d.estimate_s <= d.allowance_s
    # after a probe has run, the next one is estimated from what it really cost, less the trace
    # it was estimated to pay (F first steps of 1 s), never below 3 steps
    assert b.estimate("probe") == pytest.approx(max(4.0 - F * 1.0, 3.0))


def test_a_later_probe_costs_the_first_ones_passes_not_a_guess_of_three_steps():
    """TensorFlow's MobileNetV2 on a CPU: Keras' first step 10.5 s, 0.18 s a step; the first
    probe really took 23 s, its passes (two policies' forward-backward, the fix checks) about
    ten steps, not three. The second probe is estimated at what the first cost less the trace it
    was estimated to pay (where 3 steps would say 0.54 s and let it overrun the budget); the
    third at what the second cost."""
    b = CostBudget(0.05)
    b.begin_fit({"epochs": 1, "steps": 1600}, now=0.0)
    b.batch_end(1, now=10.5)
    for i in range(1, 20):
        b.batch_end(1, now=10.5 + 0.18 * i)
    assert b.estimate("probe") == pytest.approx(F * 10.5 + 3 * 0.18)
    b.charge("probe", 23.0)
    b.ran("probe", 23.0)
    assert b.estimate("probe") == pytest.approx(23.0 - F * 10.5)
    assert 1.0 < b.estimate("probe") < 3.0
    # a first probe compiled ahead paid no trace: all of its cost was its passes
    assert b.estimate("probe", ahead=1.0) == pytest.approx(23.0)
    # part of its trace paid ahead (JAX on a CPU): that part is not taken off again
    assert b.estimate("probe", traced=10.0) == pytest.approx(23.0 - (F * 10.5 - 10.0))
    # never below three steps of passes
    c = CostBudget(0.05)
    c.begin_fit({"epochs": 1, "steps": 1600}, now=0.0)
    for i in range(0, 20):
        c.batch_end(1, now=10.5 + 0.18 * i)
    c.ran("probe", 9.0)  # the trace was cheaper than estimated
    assert c.estimate("probe") == pytest.approx(3 * 0.18)
    b.ran("probe", 1.89)
    assert b.estimate("probe") == pytest.approx(1.89)


def test_work_a_broken_training_needs_runs_whatever_it_costs_and_says_why():
    b = CostBudget(0.05)
    b.begin_fit({"epochs": 1, "steps": 100}, now=0.0)
    for i in range(1, 4):
        b.batch_end(1, now=float(i))  # 5 s of budget
    assert b.decide("probe", 3, estimate=50.0, needed="the training loss is nan", now=3.0)
    d = b.decisions[-1]
    assert (d.action, d.estimate_s, d.allowance_s) == ("needed", 50.0, 5.0)
    assert d.reason.startswith("the training loss is nan")
    b.ran("probe", 7.0)
    assert d.cost_s == 7.0
    # what fits runs as any work that fits: "needed" only says why a run beyond the budget was
    assert b.decide("probe", 4, estimate=0.1, needed="the training loss is nan", now=3.0)
    assert b.decisions[-1].action == "ran"


def test_no_budget_runs_everything_and_still_keeps_the_decisions():
    b = CostBudget(None)
    b.begin_fit({"epochs": 1, "steps": 10}, now=0.0)
    assert b.allowance() is None and b.fits("probe")
    assert b.decide("probe", 1, estimate=1e9)
    assert b.decisions[-1].action == "ran" and b.decisions[-1].reason == "no budget"


@pytest.mark.parametrize("bad", [0, -0.1, 1.5, float("nan"), "5%", True, [0.1]])
def test_a_bad_budget_is_a_clear_error_at_construction(tmp_path, bad):
    with pytest.raises(ValueError, match="budget"):
        mpwatch.MixedPrecisionMonitor(tmp_path, budget=bad)


def test_the_default_budget_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("MPWATCH_BUDGET", "0.2")
    assert mpwatch.MixedPrecisionMonitor(tmp_path).budget.fraction == 0.2
    monkeypatch.setenv("MPWATCH_BUDGET", "off")
    assert mpwatch.MixedPrecisionMonitor(tmp_path).budget.fraction is None
    assert mpwatch.MixedPrecisionMonitor(tmp_path, budget=0.3).budget.fraction == 0.3
    monkeypatch.delenv("MPWATCH_BUDGET")
    assert mpwatch.MixedPrecisionMonitor(tmp_path).budget.fraction == budget_mod.DEFAULT_BUDGET
    monkeypatch.setenv("MPWATCH_BUDGET", "lots")
    with pytest.raises(ValueError, match="MPWATCH_BUDGET"):
        mpwatch.MixedPrecisionMonitor(tmp_path)


# --- a real fit whose probe is expensive ---------------------------------------------------------
@pytest.fixture(scope="module")
def fits(tmp_path_factory):
    """A plain fit, a fit under the default budget (its probe's trace costs far more than 5% of
    a fit of 24 small steps), and one with an explicit probe_every under the same budget."""
    old = keras.mixed_precision.global_policy()
    root = tmp_path_factory.mktemp("budget")
    try:
        plain = experiment.fit([])
        skipped = root / "skipped"
        mon = mpwatch.MixedPrecisionMonitor(skipped, log_every=4, budget=0.05)
        watched = experiment.fit([mon])
        explicit = root / "explicit"
        mon2 = mpwatch.MixedPrecisionMonitor(
            explicit, log_every=4, budget=0.05, probe_every=experiment.PROBE_EVERY
        )
        watched2 = experiment.fit([mon2])
    finally:
        keras.mixed_precision.set_global_policy(old)
    return {
        "plain": plain,
        "skipped": (skipped, watched),
        "explicit": (explicit, watched2),
    }


def test_the_budget_skips_the_expensive_probe_and_training_is_bit_identical(fits, read_events):
    logdir, watched = fits["skipped"]
    assert experiment.compare(fits["plain"], watched) == []
    _, records = read_events(logdir)
    assert contract.KIND_PROBE not in records  # no probe ran
    assert contract.KIND_PROFILE not in records
    ((step, b),) = records[contract.KIND_BUDGET]
    assert step == experiment.EPOCHS * experiment.SAMPLES // experiment.BATCH
    assert b["fraction"] == 0.05
    probes = [d for d in b["decisions"] if d["part"] == "probe"]
    assert [d["step"] for d in probes] == [12, 24]  # each epoch's end
    assert all(d["action"] == "skipped" for d in probes)
    for d in b["decisions"]:
        assert d["action"] in ("skipped", "deferred")
        assert d["estimate_s"] > d["allowance_s"]  # estimated over what was left
        assert d["cost_s"] is None
    # the ledger: mpwatch's own time is the sum of its parts, within the fit
    assert sum(b["spent"].values()) == pytest.approx(b["own_seconds"], abs=1e-3)
    assert 0 < b["own_seconds"] < b["fit_seconds"]


def test_the_diagnosis_says_what_the_budget_skipped_and_nothing_rests_on_it(fits):
    logdir, _ = fits["skipped"]
    findings = mpwatch.diagnose(str(logdir))
    by_rule = {}
    for f in findings:
        by_rule.setdefault(f.rule, []).append(f)
    titles = [f.title for f in by_rule.get("budget", [])]
    assert any("probe did not run" in t for t in titles), titles
    probe = next(f for f in by_rule["budget"] if f.data["part"] == "probe")
    assert probe.data["skipped"] == 2 and probe.data["ran"] == 0
    assert "probe_every=N" in probe.fix
    for f in by_rule["budget"]:  # every line of the fix is code a user can paste
        for line in f.fix.splitlines():
            compile(line.replace("probe_every=N", "probe_every=500"), "<fix>", "exec")
    assert "underflow" in probe.evidence  # what is missing, said
    # no finding that needs a probe was made without one
    for rule in ("gradient-underflow", "gradient-error", "output-rel-error", "loss-scale"):
        for f in by_rule.get(rule, []):
            assert "probe" not in (f.evidence + f.title).lower(), (rule, f.title)


def test_an_explicit_probe_every_wins_over_the_budget(fits, read_events):
    logdir, watched = fits["explicit"]
    assert experiment.compare(fits["plain"], watched) == []
    _, records = read_events(logdir)
    probe_steps = sorted({s for s, _ in records[contract.KIND_PROBE]})
    assert probe_steps == [5, 10, 12, 15, 20, 24]
    ((_, b),) = records[contract.KIND_BUDGET]
    assert b["explicit"] == {"probe_every": experiment.PROBE_EVERY}
    probes = [d for d in b["decisions"] if d["part"] == "probe"]
    assert [d["action"] for d in probes] == ["explicit"] * 6
    assert all(d["cost_s"] is not None and d["cost_s"] > 0 for d in probes)
    # the first probe paid the trace: it cost more than the later ones
    assert probes[0]["cost_s"] > max(d["cost_s"] for d in probes[1:])
    assert not [f for f in mpwatch.diagnose(str(logdir)) if f.rule == "budget" and
                f.data.get("part") == "probe"]  # fmt: skip


# --- a profile whose conversion is deferred to the first read ------------------------------------
def test_a_deferred_conversion_is_read_joined_to_the_runs_layers(
    tmp_path, monkeypatch, read_events
):
    """The capture fits, the conversion does not (its estimate made huge): the trace stays, the
    fit writes no profile record, and load_run converts it joined to the run's layers record, as
    the conversion with the model itself does."""
    from mpwatch import profile

    monkeypatch.setattr(budget_mod, "CONVERT_S_PER_MB", 1e9)
    old = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(3)
        model = keras.Sequential(
            [
                keras.Input((32,)),
                keras.layers.Dense(64, activation="relu", name="wide"),
                keras.layers.Dense(64, activation="relu", name="deep"),
                keras.layers.Dense(4, dtype="float32", name="out"),
            ],
            name="net",
        )
        model.compile(keras.optimizers.Adam(1e-3), "mse")
        x = np.random.default_rng(0).normal(size=(4096, 32)).astype("float32")
        y = np.random.default_rng(1).normal(size=(4096, 4)).astype("float32")
        mon = mpwatch.MixedPrecisionMonitor(tmp_path, budget=1.0, probe=False)
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[mon])
    finally:
        keras.mixed_precision.set_global_policy(old)
    _, records = read_events(tmp_path)
    assert contract.KIND_PROFILE not in records
    ((_, b),) = records[contract.KIND_BUDGET]
    actions = {d["part"]: d["action"] for d in b["decisions"]}
    assert actions == {"profile": "ran", "profile_conversion": "deferred"}, b["decisions"]
    conv = next(d for d in b["decisions"] if d["part"] == "profile_conversion")
    traces = glob.glob(os.path.join(tmp_path, "plugins", "profile", "*", "*.xplane.pb"))
    assert len(traces) == 1
    assert conv["detail"]["megabytes"] == pytest.approx(os.path.getsize(traces[0]) / 1e6, rel=1e-2)

    run = mpwatch.load_run(str(tmp_path))
    assert run.profile is not None and run.profile_trace is not None
    assert run.profile["steps"] == conv["detail"]["steps"]
    by_hand = profile.summarize(os.path.dirname(traces[0]), model, ops="auto")
    read = {r[0]: r for r in run.profile["layers"]["data"]}
    hand = {r[0]: r for r in by_hand["layers"]["data"]}
    assert {"wide", "deep", "out"} <= set(read)
    assert read == hand  # every layer row: time, dtype, bits, as the model itself gives them
    assert run.profile["share_16bit"] == pytest.approx(by_hand["share_16bit"])
    assert not np.isnan(run.profile["share_16bit"])
    # and the diagnosis does not call a deferred conversion a skip
    assert not [f for f in mpwatch.diagnose(str(tmp_path)) if f.rule == "budget"]


def test_the_devices_time_at_a_tap_read_is_not_charged_to_mpwatch(tmp_path):
    """A tap read waits for the device to finish the steps queued before it: training's time.
    The ledger charges a hook's wall time less that wait (the tap's ``device_wait``)."""
    import time
    import types

    monitor = mpwatch.MixedPrecisionMonitor(str(tmp_path), budget=0.05)
    tap = types.SimpleNamespace(device_wait=0.0)
    monitor.state = types.SimpleNamespace(tap=tap)

    def hook():  # 30 ms of which 20 ms wait for the device, as a read does
        time.sleep(0.01)
        t0 = time.perf_counter()
        time.sleep(0.02)
        tap.device_wait += time.perf_counter() - t0

    monitor._charged(monitor, hook)
    spent = monitor.budget.spent[monitor.part]
    assert 0.009 <= spent < 0.018  # the 10 ms of its own, not the 20 ms of waiting


def test_float8_readiness_is_measured_one_probe_in_four_and_estimated_apart(tmp_path):
    """A fit with a probe every step: float8 readiness at probes 1, 4, 8 (``FLOAT8_EVERY``),
    and the budget's estimate of each probe adds float8's last measured cost exactly when the
    probe will measure it (its records: the float8 table at those probes' steps only)."""
    import keras

    from mpwatch.record.callbacks.probe_monitor import ProbeMonitor
    from mpwatch.record.probe.probe import FLOAT8_EVERY

    assert FLOAT8_EVERY == 4
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(72, 6)).astype("float32"), rng.normal(size=(72, 2)).astype("float32")
    seen: list[tuple[bool, float]] = []

    class Spy(ProbeMonitor):
        def _float8_estimate(self, budget):
            est = super()._float8_estimate(budget)
            seen.append((self.probe is not None and self.probe.float8_due(), est))
            return est

    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(2)])  # fmt: skip
        model.compile(keras.optimizers.SGD(0.01), "mse")
        probe = Spy(str(tmp_path), every=1)
        probe.budget = CostBudget(None)
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[probe])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    run = mpwatch.load_run(str(tmp_path))
    measured = sorted(int(s) for s in run.probe_float8["step"].unique())
    assert measured == [1, 4, 8]
    # every estimate after the first: float8's last cost when due, else nothing
    for (due, est), step in zip(seen[1:], range(2, 10)):
        assert due == (step in (4, 8)), step
        assert (est > 0) == due, step


def _overflowing_fit(logdir, out_dtype):
    """A model whose forward pass overflows float16 at every step (its first Dense sums 32 inputs
    of 100 with weights of 100: 320,000 > 65504), 3 epochs of 12 steps under mixed_float16 and a
    5% budget: (model, history, monitor)."""
    old = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([
            keras.Input((32,)),
            keras.layers.Dense(16, kernel_initializer=keras.initializers.Constant(100.0),
                               name="hot"),
            keras.layers.Dense(1, dtype=out_dtype, name="out"),
        ])  # fmt: skip
        model.compile(keras.optimizers.SGD(1e-3), "mse")
        x = np.full((96, 32), 100.0, np.float32)
        y = np.zeros((96, 1), np.float32)
        mon = mpwatch.MixedPrecisionMonitor(str(logdir), log_every=4, budget=0.05)
        hist = model.fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=[mon])
    finally:
        keras.mixed_precision.set_global_policy(old)
    return model, hist, mon


def test_a_broken_training_gets_one_probe_a_fit_beyond_the_budget(tmp_path, read_events):
    """The overflowing model (``_overflowing_fit``) with a float32 output, under a 5% budget that
    skips the probe of a healthy fit of the same size (``fits``). Every step is skipped: at the
    first epoch's end the scale has halved 12 times (2^3, still above 1: skipped, as any epoch
    whose mean loss one bad batch made NaN); at the second's it is 2^-9 (``needed``: no scale
    helps); the third's is skipped again (one a fit). The diagnosis names the layer, checked on
    the probe's batch."""
    model, hist, _ = _overflowing_fit(tmp_path, "float32")
    assert not np.isfinite(hist.history["loss"]).any()  # truth: Keras' own losses
    _, records = read_events(str(tmp_path))
    assert float(model.optimizer.dynamic_scale.numpy()) == 2.0 ** (15 - 36)  # every step skipped
    assert [step for step, _ in records[contract.KIND_PROBE]] == [24]
    ((_, b),) = records[contract.KIND_BUDGET]
    probes = [(d["step"], d["action"]) for d in b["decisions"] if d["part"] == "probe"]
    assert probes == [(12, "skipped"), (24, "needed"), (36, "skipped")]
    fixes = [(d["step"], d["action"]) for d in b["decisions"] if d["part"] == "fix_checks"]
    assert fixes == [(24, "ran")]  # the probe the training needs checks its fixes, whatever
    needed = next(d for d in b["decisions"] if d["action"] == "needed")
    assert needed["estimate_s"] > needed["allowance_s"] and needed["cost_s"] > 0
    assert needed["reason"].startswith("the loss scale has fallen to 0.00195")  # 2^-9
    findings = mpwatch.diagnose(str(tmp_path))
    (over,) = [f for f in findings if f.rule == "activation-overflow"]
    assert over.layer == "hot" and over.severity == "error"
    assert "keeping 'hot' float32: finite" in over.evidence
    # the other way out is offered only where the probe saw it work on the batch
    worked = "normalizing the inputs: finite, in range" in over.evidence
    assert ("normalize / scale the input" in over.fix) == worked
    (said,) = [f for f in findings if f.rule == "budget" and f.data["part"] == "probe"]
    assert "beyond the budget at step 24" in said.evidence


def test_a_broken_training_with_a_16bit_output_gets_no_probe_beyond_the_budget(tmp_path):
    """The same overflowing model with its output left in float16 (as a keras.applications
    classifier under mixed_float16): the diagnosis names that output without a probe
    (output-16bit), so the budget's decisions stand, and no probe runs."""
    model, _, mon = _overflowing_fit(tmp_path, None)
    assert float(model.optimizer.dynamic_scale.numpy()) <= 1.0  # as broken as the other one
    probes = [d for d in mon.budget.decisions if d.part == "probe"]
    assert [d.action for d in probes] == ["skipped"] * 3
    findings = mpwatch.diagnose(str(tmp_path))
    assert [f.layer for f in findings if f.rule == "output-16bit"] == ["out"]


def test_the_allowance_keeps_back_what_the_recurring_parts_will_cost_the_steps_to_come():
    """A 100-step fit of 1 s steps: 5 s of budget. on_train_begin's one-off 1 s of layer
    records is not a rate; the tap's reads cost 0.02 s every call from then on, so 97 steps to
    come keep back 1.94 s, and a probe's own time (optional work) does not raise the rate."""
    b = CostBudget(0.05)
    b.begin_fit({"epochs": 1, "steps": 100}, now=0.0)
    b.charge("layers", 1.0)  # once, before the first call ends
    b.batch_end(1, now=2.0)
    assert b.recurring_step_seconds() is None
    for i in range(1, 3):
        b.charge("gradient_health", 0.02)
        b.batch_end(1, now=2.0 + 1.02 * i)
    assert b.recurring_step_seconds() == pytest.approx(0.02)
    now = 2.0 + 1.02 * 2
    spent = 1.0 + 0.04
    projected = (now) + 97 * 1.0
    assert b.allowance(now=now) == pytest.approx(0.05 * projected - spent - 97 * 0.02)
    b.charge("probe", 3.0)
    b.ran("probe", 3.0)
    b.charge("gradient_health", 0.02)
    b.batch_end(1, now=now + 4.02)
    assert b.recurring_step_seconds() == pytest.approx(0.02)
    # without a known length nothing is kept back (the fit's end is not known either)
    c = CostBudget(0.05)
    c.begin_fit({}, now=0.0)
    for i in range(1, 4):
        c.charge("gradient_health", 0.5)
        c.batch_end(1, now=1.5 * i)
    assert c.allowance(now=4.5) == pytest.approx(0.05 * 4.5 - 1.5)
