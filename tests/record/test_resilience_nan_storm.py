"""A NaN storm: many consecutive batches whose float16 forward pass overflows.

Training goes on as Keras decides (no exception, every batch runs), mpwatch counts every skipped
step (the truth: the batches the test made overflow, and the optimizer's own ``iterations``), the
probe names the first layer whose output is non-finite, and the diagnosis says both.
"""

from __future__ import annotations

import numpy as np
import pytest

BATCH = 4
BATCHES = 34
STORM = range(8, 26)  # 18 consecutive batches overflow: the scale falls from 2**15 below 1
FEATURES = 6


@pytest.fixture(scope="module")
def storm(tmp_path_factory):
    import keras

    import mpwatch

    logdir = str(tmp_path_factory.mktemp("storm"))
    x = np.full((BATCH * BATCHES, FEATURES), 0.01, np.float32)
    x[BATCH * STORM.start : BATCH * STORM.stop] = 3.0e4  # 6 x 3e4 x 1.0 = 1.8e5 > 65504 in dense
    y = np.zeros((BATCH * BATCHES, 1), np.float32)
    old = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.Sequential(
            [
                keras.Input((FEATURES,)),
                keras.layers.Dense(4, kernel_initializer="ones", name="wide"),
                keras.layers.Dense(1, dtype="float32", name="head"),
            ]
        )
        model.compile(optimizer=keras.optimizers.SGD(1e-4), loss="mse")
        seen = []

        class Count(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                seen.append(batch)

        monitor = mpwatch.MixedPrecisionMonitor(
            logdir,
            log_every=5,
            probe_every=10,
            probe_data=(x[BATCH * STORM.start :][:BATCH], y[:BATCH]),
            profile=False,
        )
        history = model.fit(
            x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[monitor, Count()]
        )
    finally:
        keras.mixed_precision.set_global_policy(old)
    return {
        "logdir": logdir,
        "seen": seen,
        "iterations": int(model.optimizer.iterations.numpy()),
        "history": history.history,
    }


def test_training_goes_on_through_the_storm(storm):
    assert len(storm["seen"]) == BATCHES  # every batch ran
    # Keras' loss-scale optimizer dropped exactly the storm's updates
    assert storm["iterations"] == BATCHES - len(STORM)


def test_every_skipped_step_is_counted(storm, read_events):
    scalars, _ = read_events(storm["logdir"])
    flags = dict(scalars["mpwatch/step_skipped"])
    assert sorted(flags) == list(range(1, BATCHES + 1))
    skipped = sorted(step for step, v in flags.items() if v)
    assert skipped == [b + 1 for b in STORM]  # batch steps are 1-based
    total = dict(scalars["mpwatch/skipped_steps_total"])
    assert total[max(total)] == len(STORM)
    scale = dict(scalars["mpwatch/loss_scale"])
    assert scale[STORM.stop] == 2.0**15 / 2 ** len(STORM)  # halved at each skipped step


def test_first_nonfinite_layer_is_named_and_diagnosed(storm):
    import mpwatch

    run = mpwatch.load_run(storm["logdir"], warn=False)
    assert set(run.probe_model["first_nonfinite_layer"].dropna()) == {"wide"}
    findings = mpwatch.diagnose(run)
    overflow = [f for f in findings if f.rule == "activation-overflow"]
    first = [f for f in overflow if "first appear" in f.title]
    assert [f.layer for f in first] == ["wide"]
    assert first[0].severity == "error"
    # the skipped steps follow from the overflow (an activation: no loss scale helps): one
    # finding for the cause, the skips its evidence (mpwatch.judge.diagnose folds them in)
    assert [f for f in findings if f.rule == "skipped-steps"] == []
    assert "skipped-steps" in first[0].data["also"]
    assert f"{len(STORM)} of " in first[0].evidence and "steps skipped" in first[0].evidence
    assert [f.layer for f in findings if f.severity == "error"] == ["wide"]
