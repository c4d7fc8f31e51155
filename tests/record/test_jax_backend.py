"""mpwatch on Keras' JAX backend: the same records as on TensorFlow, checked against the
optimizer's own state.

Keras fixes its backend at import, so the training runs in a subprocess with
``KERAS_BACKEND=jax`` (tests/jax/jax_fit.py, which also records the truth: the optimizer's
``dynamic_scale`` and ``iterations`` after every Keras call, read by an independent callback after
``model.jax_state_sync()``; run once per session by conftest's ``jax_runs``). This process parses
the event files with the independent parser (conftest ``read_events``) and reads them with
``mpwatch.load_run`` / ``mpwatch.diagnose``.
"""

from __future__ import annotations

import numpy as np
import pytest

from mpwatch import contract

pytest.importorskip("jax")

BATCHES = 24
OVERFLOW_BATCHES = {2, 3, 9, 17}  # as in tests/jax/jax_fit.py (0-based)


def _per_batch_truth(truth):
    """Per batch (spe 1): the scale after it, and whether its update was skipped."""
    t = truth["forced_spe1_every1"]
    its = [0] + t["iterations"]
    skipped = [float(its[i + 1] == its[i]) for i in range(BATCHES)]
    return t["scale"], skipped


@pytest.mark.parametrize("spe, log_every", [(1, 1), (1, 7), (4, 1), (4, 7)])
def test_loss_scale_and_skips_equal_the_optimizers(jax_runs, read_events, spe, log_every):
    out, truth = jax_runs
    scale, skipped = _per_batch_truth(truth)
    # the forced overflows, and nothing else, were skipped
    assert [i for i, s in enumerate(skipped) if s] == sorted(OVERFLOW_BATCHES)
    case = truth[f"forced_spe{spe}_every{log_every}"]
    if spe > 1:  # the per-call truth is every spe-th value of the per-batch one
        assert case["scale"] == scale[spe - 1 :: spe]
    scalars, records = read_events(str(out / f"forced_spe{spe}_every{log_every}"))
    got_scale = scalars[contract.LOSS_SCALE]
    assert got_scale[0] == (0, 32768.0)  # the scale before the first step
    assert got_scale[1:] == [(i + 1, s) for i, s in enumerate(scale)]
    assert scalars[contract.STEP_SKIPPED] == [(i + 1, s) for i, s in enumerate(skipped)]
    total = dict(scalars[contract.SKIPPED_STEPS_TOTAL])
    assert total[max(total)] == len(OVERFLOW_BATCHES)
    (info,) = [p for _, p in records["run_info"]]
    assert info["backend"] == "jax" and info["steps_per_execution"] == spe
    assert info["versions"]["jax"] and info["policy"] == "mixed_float16"


def test_gradient_health_every_log_every_steps(jax_runs, read_events):
    out, _ = jax_runs
    scalars, records = read_events(str(out / "forced_spe1_every7"))
    steps = [s for s, _ in scalars[contract.GRAD_NONFINITE_COUNT]]
    assert steps == [7, 14, 21]
    (rows_at_7,) = [p["variables"]["data"] for s, p in records["grad_variables"] if s == 7]
    sizes = [r[contract.GRAD_VARIABLE_COLUMNS.index("size")] for r in rows_at_7]
    assert sizes == [16 * 32, 32, 32, 1]  # kernel and bias of both Dense layers
    nonfinite = dict(scalars[contract.GRAD_NONFINITE_COUNT])
    assert nonfinite[7] == 0  # batch 7 (index 6) is finite


def test_the_diagnosis_names_the_float16_softmax(jax_runs, read_events):
    import mpwatch

    out, truth = jax_runs
    logdir = str(out / "softmax")
    _, records = read_events(logdir)
    (layers,) = [p for _, p in records["layers"]][-1:]
    table = {r[0]: r for r in layers["layers"]["data"]}
    assert "probs" in table
    run = mpwatch.load_run(logdir)
    assert run.warnings == []
    row = run.layers.set_index("name").loc["probs"]
    assert row["compute_dtype"] == "float16"
    findings = mpwatch.diagnose(logdir)
    out16 = [f for f in findings if f.rule == "output-16bit"]
    assert len(out16) == 1 and "probs" in out16[0].title
    # the probe ran on JAX too: against the float32 twin, in agreement with the train step
    assert not [n for n in run.notices if n["part"] == "probe"]
    probes = [p for _, p in records["probe"]]
    assert probes and all(p["reference"] == "float32_twin" and p["reliable"] for p in probes)
    assert not [n for n in run.notices if n["level"] == "error" and n["part"] != "profile"]
    assert np.isfinite(run.scalar(contract.TRAIN_LOSS)).all()


def _col(table, name):
    i = table["columns"].index(name)
    return [row[i] for row in table["data"]]


def test_the_probe_counts_the_true_underflow(jax_runs, read_events):
    """test_probe.py's known model, on JAX: which gradients float16 loses at the scale is known
    in numpy (every scaled product is a power of two or zero)."""
    out, truth = jax_runs
    t = truth["probe_known"]
    x, c, kernel = (np.array(t[k], np.float32) for k in ("x", "c", "kernel"))
    g = x.T @ (c * (x @ kernel > 0))  # d/dW sum(relu(xW) * c)
    lost = (g != 0) & (np.float16(0) == (g * t["scale"]).astype(np.float16))
    assert lost.sum() > 0
    _, records = read_events(str(out / "probe_known"))
    steps = [s for s, _ in records["probe"]]
    assert steps == [2, 3, 4, 6]  # every 2 batch steps and each epoch's end, no duplicates
    for _, p in records["probe"]:
        assert p["mode"] == "float16" and p["reference"] == "float32_twin"
        assert p["loss_scale"] == t["scale"] and p["reliable"] is True
        assert p["model"]["ref_nonzero"] == int((g != 0).sum())
        assert p["model"]["underflow_count"] == int(lost.sum())
        assert _col(p["variables"], "underflow_count") == [int(lost.sum())]
        assert p["model"]["first_nonfinite_layer"] is None
        # the histogram holds exactly the reference's nonzero gradients, at their exponents
        hist = p["histogram"]
        want = np.floor(np.log2(np.abs(g[g != 0]))).astype(int)
        got = [e for e, n in zip(hist["edges_log2"], hist["counts"]) for _ in range(n)]
        assert sorted(got) == sorted(want.tolist())


def test_the_probe_measures_the_train_steps_network_and_changes_nothing(jax_runs, read_events):
    out, truth = jax_runs
    # BatchNormalization in training mode inside the probe, Dropout off in both passes, and the
    # moving statistics and seeds left alone: the monitored fit's weights equal a plain fit's
    assert truth["probe_bn"]["identical"] and truth["probe_bn"]["n_weights"] == 8
    _, records = read_events(str(out / "probe_bn"))
    probes = records["probe"]
    assert [s for s, _ in probes] == list(range(1, 13))  # every step of 2 epochs of 6 batches
    for _, p in probes:
        assert p["reliable"] is True, p["unreliable_reason"]
        assert p["random_layers_off"] == ["drop"]
        names = _col(p["layers"], "layer")
        assert names[:2] == ["conv", "bn"] and "head" in names
        # gradients w.r.t. each layer's output were measured (float ones)
        assert all(v is not None for v in _col(p["layers"], "act_grad_underflow_fraction"))


def test_the_cost_budget_skips_the_probe_on_jax_and_training_is_identical(jax_runs, read_events):
    """Issue 27 on JAX: a short fit under the default budget records its skipped probes (each
    epoch's end) and profile, compiles no probe ahead, and trains bit-identically."""
    out, truth = jax_runs
    assert truth["budget"]["identical"] is True
    assert truth["budget"]["ahead"] is False  # no probe was going to run: nothing compiled
    _, records = read_events(str(out / "budget"))
    assert "probe" not in records
    ((step, b),) = records["budget"]
    assert step == 12 and b["fraction"] == 0.05
    probes = [d for d in b["decisions"] if d["part"] == "probe"]
    assert [(d["step"], d["action"]) for d in probes] == [(6, "skipped"), (12, "skipped")]
    assert all(d["estimate_s"] > d["allowance_s"] for d in b["decisions"])


def test_later_fits_reuse_the_tapped_step_and_plain_fits_run_keras_own(jax_runs, read_events):
    out, truth = jax_runs
    t = truth["refits"]
    # one trace with the tap (fit 0), one clean trace (the plain fit 2), none in fits 1 and 3
    assert t["traces"] == [[0, True], [2, False]]
    assert t["identical"]  # weights bit-identical to the plain twin's
    scalars, _ = read_events(str(out / "refits"))
    got = scalars[contract.LOSS_SCALE]
    assert [s for s, _ in got] == list(range(0, 25))  # 3 mpwatch fits of 8 batches
    assert [v for _, v in got[1:]] == t["scales"]
    skipped = [s for s, v in scalars[contract.STEP_SKIPPED] if v == 1.0]
    assert skipped == [2, 10, 18]
    # gradient counts every log_every (3) steps of the run, also in the later fits (the step is
    # data in the reused trace, never a constant baked into it)
    assert [s for s, _ in scalars[contract.GRAD_NONFINITE_COUNT]] == list(range(3, 25, 3))


def _same_scalars(read_events, out, case, spe):
    """``case``'s scalars equal those of ``forced`` (same spe, log_every 7), the times and memory
    aside; (its scalars, its records, forced's records)."""
    mine, mine_records = read_events(str(out / case))
    theirs, theirs_records = read_events(str(out / f"forced_spe{spe}_every7"))
    timed = {contract.STEP_TIME_MS, contract.PEAK_MEMORY_MB}
    assert set(mine) == set(theirs)
    for tag in set(mine) - timed:
        assert mine[tag] == theirs[tag], tag
    return mine, mine_records, theirs_records


@pytest.mark.parametrize("spe", [1, 4])
def test_batch_ends_on_keras_worker_thread_record_the_same_run(jax_runs, read_events, spe):
    """With the monitor alone Keras runs its batch ends on a worker thread (``async_safe``; what
    a GPU gets by default, the host then never waits for the device): the monitor only notes
    them there and does the work on the training thread, and every record equals the run whose
    batch ends ran on the training thread (beside the observer that gives the optimizer's own
    truth), the times and memory aside."""
    out, truth = jax_runs
    t = truth[f"async_spe{spe}"]
    assert t["keras_async"] and t["on_worker"] and all(t["on_worker"])
    assert len(t["on_worker"]) == 24 // spe
    mine, mine_records, theirs_records = _same_scalars(read_events, out, f"async_spe{spe}", spe)
    assert [s for s, _ in mine[contract.TRAIN_LOSS]] == list(range(spe, 25, spe))
    assert set(mine_records) == set(theirs_records)


def test_validation_waits_for_the_epochs_last_call_noted_on_the_worker_thread(
    jax_runs, read_events
):
    """Keras does not wait for its worker thread before validation: the epoch's last call (the
    fit's first here, whose step sleeps on the device side) is noted after the validation has
    begun. Its work is done first: the layer tracer records the training batch (8), not the
    validation's (5), which it would if it were still in place when the validation's step is
    traced."""
    out, truth = jax_runs
    t = truth["async_validation"]
    scalars, records = read_events(str(out / "async_validation"))
    ((step, memory),) = records["memory"]
    assert step == 1 and memory["batch_size"] == t["batch_size"]
    assert [s for s, _ in scalars[contract.TRAIN_LOSS]] == [3, 6]


def test_an_epochs_short_last_call_of_unknown_length_is_counted_as_it_ran(
    jax_runs, read_events
):
    """Data of unknown length (a generator of 10 batches), ``steps_per_execution`` 4, two fits:
    each epoch's last call runs 2 batches, though Keras' indices say 4. Each call's loss is
    written at its last batch's step (the optimizer's iterations, read by the observer; nothing
    overflows in these batches), with its value; the same with Keras' batch ends on its worker
    thread. Before, the short call's loss went to 12 and 22 (the steps after it corrected by the
    next read)."""
    out, truth = jax_runs
    training, worker = truth["unknown_training"], truth["unknown_worker"]
    expected = [4, 8, 10, 14, 18, 20]
    assert [i for i, _ in training["calls"]] == expected
    for case in ("unknown_training", "unknown_worker"):
        scalars, _ = read_events(str(out / case))
        assert scalars[contract.TRAIN_LOSS] == [
            (s, loss) for s, (_, loss) in zip(expected, training["calls"])
        ], case
    assert worker["iterations"] == training["iterations"] == 20


def test_the_train_steps_scale_loss_calls_are_counted(jax_runs, read_events):
    """The tap watches the LossScaleOptimizer's ``scale_loss`` while Keras traces the train
    step: Keras' own step calls it once; keras.io's custom stateless train step never does
    (which the judge then names, with or without a probe)."""
    out, truth = jax_runs
    for case, calls in (("forced_spe4_every7", 1), ("custom_unscaled", 0)):
        _, records = read_events(str(out / case))
        _, latest = records["train_step"][-1]
        (compiled,) = [o for o in latest["optimizers"] if o["compiled"]]
        assert compiled["class"] == "LossScaleOptimizer(SGD)", case
        assert compiled["scale_loss_calls"] == calls, case
    assert truth["custom_unscaled"]["iterations"] == 20  # it trained (no step overflowed)


def test_a_fit_that_raised_leaves_nothing_in_the_next_fit(jax_runs, read_events):
    """One monitor, a fit that raises at its 11th call (Keras then skips its wait for the batch
    ends on its worker thread) and a whole fit after it: every record of both fits equals the
    same two fits' with the batch ends on the training thread (times and memory aside), and the
    second fit's steps continue the optimizer's."""
    out, truth = jax_runs
    worker, training = truth["raised_worker"], truth["raised_training"]
    skipped = len({b for b in OVERFLOW_BATCHES if b < 10}) + len(OVERFLOW_BATCHES)
    assert worker == training and worker["iterations"] == 10 + 24 - skipped
    mine, _ = read_events(str(out / "raised_worker"))
    theirs, _ = read_events(str(out / "raised_training"))
    timed = {contract.STEP_TIME_MS, contract.PEAK_MEMORY_MB}
    assert set(mine) == set(theirs)
    for tag in set(mine) - timed:
        assert mine[tag] == theirs[tag], tag
    losses = [s for s, _ in mine[contract.TRAIN_LOSS]]
    assert losses == list(range(1, 35)), losses  # the raised fit's unwritten ones too


@pytest.mark.parametrize("way", ["select", "apart"])
@pytest.mark.parametrize("spe", [1, 4])
def test_counts_selected_or_apart_record_the_same_run(jax_runs, read_events, spe, way):
    """On a GPU the tap keeps the gradient counts out of a ``lax.cond`` (which copies its
    predicate to the host and waits for the device, every step): computed at every step and
    kept at the count steps (select), or in a second program that runs at the count steps only
    (apart). Both give the same records, bit for bit, as the conditional's, which the
    optimizer's own state checks (test_loss_scale_and_skips_equal_the_optimizers)."""
    out, truth = jax_runs
    case = f"{way}_spe{spe}_every7"
    assert truth[case]["scale"] == truth[f"forced_spe{spe}_every7"]["scale"]
    mine, mine_records, theirs_records = _same_scalars(read_events, out, case, spe)
    assert [s for s, _ in mine[contract.GRAD_NONFINITE_COUNT]] == [7, 14, 21]

    def numbers(records):  # the per-variable counts (names aside: the models' are numbered)
        return [(s, [row[2:] for row in p["variables"]["data"]]) for s, p in records]

    assert numbers(mine_records["grad_variables"]) == numbers(theirs_records["grad_variables"])
    assert len(mine_records["grad_variables"]) == 3


@pytest.mark.parametrize("where", ["worker", "training"])
def test_step_time_holds_when_the_host_runs_ahead(jax_runs, read_events, where):
    """Each step sleeps 30 ms on the device side (a host callback in the jitted step). With the
    batch ends on Keras' worker thread the host dispatches ahead of the device, so a clock on
    the training thread would read the dispatch; the recorded step time is the device's: at
    least the sleep, at most the fit's wall time per step."""
    out, truth = jax_runs
    t = truth[f"slow_{where}"]
    scalars, _ = read_events(str(out / f"slow_{where}"))
    times = [v for _, v in scalars[contract.STEP_TIME_MS]]
    assert len(times) == 4  # steps 10, 20, 30 of the run and the fit's end (its 32nd)
    ceiling = 1000.0 * t["wall"] / t["steps"]
    assert all(1000.0 * t["sleep"] <= v <= ceiling for v in times), (times, ceiling)
    # the cost budget's step time too (its projection of the fit, its estimates of a probe's
    # passes), which the training thread's clock alone would read as the dispatch
    assert t["sleep"] <= t["budget_step"] <= ceiling / 1000.0, t


def test_no_batch_hook_makes_keras_write_its_state_back(jax_runs):
    """Keras' ``Callback.model`` on JAX syncs the whole training state into the variables (and
    Keras rebuilds the state for the next step): mpwatch's batch hooks never ask for it, so a fit
    of 32 batches has no more syncs than one of 8 (the profile's part read it every batch)."""
    _, truth = jax_runs
    syncs = truth["syncs"]
    assert syncs.get("32", 0) == syncs.get("8", 0) <= 2, syncs


def test_an_unsupported_backend_is_refused_before_training(monkeypatch, tmp_path):
    """Keras' torch (or numpy) backend: a clear error at on_train_begin, nothing written."""
    import keras

    import mpwatch
    from mpwatch.record.runtime import backend

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    monitor = mpwatch.MixedPrecisionMonitor(str(tmp_path / "run"))
    monitor.set_model(model)
    monkeypatch.setattr(backend, "name", lambda: "torch")
    with pytest.raises(backend.UnsupportedBackendError, match="'torch' backend is not supported"):
        monitor.on_train_begin()
    assert not list((tmp_path / "run").glob("events.*"))


def test_recording_compiles_no_program_of_its_own(jax_runs):
    """JAX's own compile log (jax_log_compiles), each fit after jax.clear_caches(): a monitored
    fit compiles the programs a plain fit compiles, and nothing more (on a GPU each small program
    XLA compiles costs tens of milliseconds of the fit's start: the tap's buffers are copied from
    the host, and its reads copy whole buffers instead of indexing them on the device)."""
    _, truth = jax_runs
    got = truth["compiles"]
    assert "jit(train_step)" in got["plain"]  # the log was read: Keras' own step is in it
    for name in ("cond", "select"):
        assert sorted(got[name]) == sorted(got["plain"]), name
    assert sorted(got["select_spe4"]) == sorted(got["plain_spe4"])
    # apart: the every-step program in place of Keras' (named as Keras' is), and the counting
    # program, compiled once on its thread
    for name, plain in (("apart", "plain"), ("apart_spe4", "plain_spe4")):
        assert sorted(got[name]) == sorted(got[plain] + ["jit(counts_step)"]), name


def test_counts_apart_start_when_their_program_is_ready(jax_runs, read_events):
    """The counts' own program compiles on a thread after the first step while training goes
    on: the count steps before it is ready run without counts (step 1 always: the thread starts
    after it), are said in the budget record and by the diagnosis, and every other step has its
    counts; the weights are a plain fit's, bit for bit."""
    import mpwatch

    out, truth = jax_runs
    t = truth["apart_late"]
    assert t["way"] == "apart" and t["compiled"] and t["same_weights"]
    assert t["count_steps"] == BATCHES and t["missed"][0] == 1
    # nothing after it is ready (the fit waits for it before step 12)
    assert t["missed"] == list(range(1, len(t["missed"]) + 1)) and len(t["missed"]) <= 11
    scalars, records = read_events(str(out / "apart_late"))
    counted = [s for s, _ in scalars[contract.GRAD_NONFINITE_COUNT]]
    assert counted == [s for s in range(1, BATCHES + 1) if s not in t["missed"]]
    (budget,) = [p for _, p in records["budget"]]
    (d,) = [d for d in budget["decisions"] if d["part"] == "gradient_counts"]
    assert d["action"] == "skipped" and d["step"] == 1
    assert d["detail"]["missed"] == len(t["missed"]) and d["detail"]["count_steps"] == BATCHES
    found = [f for f in mpwatch.diagnose(str(out / "apart_late")) if f.rule == "budget"]
    (late,) = [f for f in found if f.data.get("part") == "gradient_counts"]
    assert late.data["skipped"] == len(t["missed"]) and late.data["chances"] == BATCHES
    assert "count steps without the counts: 1" in late.evidence


def test_counts_program_not_compiled_for_a_fit_too_short(jax_runs, read_events):
    """Under a cost budget the counts' program compiles only when the fit still to come is long
    enough beside it (tests/record/test_jax_programs.py): 24 steps of a few milliseconds after a
    first step that compiled are not, so it never starts; every count step is missed, the
    budget record says why, no gradient-health record is written, and the weights are a plain
    fit's bit for bit."""
    out, truth = jax_runs
    t = truth["apart_short"]
    assert t["started"] is None and t["same_weights"]
    assert t["missed"] == list(range(1, BATCHES + 1))
    scalars, records = read_events(str(out / "apart_short"))
    assert contract.GRAD_NONFINITE_COUNT not in scalars
    (budget,) = [p for _, p in records["budget"]]
    (d,) = [d for d in budget["decisions"] if d["part"] == "gradient_counts"]
    assert "too short" in d["reason"] and d["detail"]["compile_s"] is None


def test_a_failing_counts_dispatcher_never_stops_training(jax_runs, read_events):
    """The dispatcher's own work raising (here: taking the first step's shapes) turns the counts
    off, says so (the budget record's reason), and training goes on with the every-step
    program: every step ran, the weights are a plain fit's bit for bit."""
    out, truth = jax_runs
    t = truth["apart_broken"]
    assert "no shapes today" in t["failed"] and t["same_weights"]
    assert t["missed"] == [4, 8, 12, 16, 20, 24]
    scalars, records = read_events(str(out / "apart_broken"))
    assert [s for s, _ in scalars[contract.LOSS_SCALE]][-1] == BATCHES
    (budget,) = [p for _, p in records["budget"]]
    (d,) = [d for d in budget["decisions"] if d["part"] == "gradient_counts"]
    assert "no shapes today" in d["reason"]


def test_a_later_fit_with_other_shapes_compiles_the_counts_again(jax_runs):
    """A later fit of the model with another batch size: its batches never match the counting
    program compiled for the first fit's, so it is compiled again for them; both fits have their
    counts once it is ready (each waits for it before its 12th step)."""
    _, truth = jax_runs
    first, second = truth["apart_reshaped"]
    assert first["count_steps"] == 12 and second["count_steps"] == 24
    assert first["last"] == 12 and second["last"] == 36
    for fit, start in ((first, 1), (second, 13)):
        assert fit["missed"] == list(range(start, start + len(fit["missed"])))  # then counted
        assert len(fit["missed"]) <= 11, fit


def test_counts_program_never_traces_a_switched_model(jax_runs):
    """The counts' program traces the model on its thread while the training thread may hold
    the model's layers switched (the probe's float32 view, its random layers off, float8's
    wrapped calls): it waits for the switch to end, so the count steps compute what the plain
    step computes. The training thread holds the view 0.5 s from the second step's begin: the
    program is not ready until it ends, and the weights equal a plain fit's bit for bit (traced
    in float32, the count steps would update them differently)."""
    _, truth = jax_runs
    t = truth["apart_view"]
    assert t["ready_in_view"] is False
    assert t["missed"][:2] == [1, 2] and t["same_weights"]
