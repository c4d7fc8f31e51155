"""Under tf.distribute.MirroredStrategy (two logical CPU devices) mpwatch records what a
single-device run records. Logical devices must be set before TensorFlow initialises its devices,
hence a subprocess.

steps_per_execution > 1 is not tested under MirroredStrategy: Keras 3.15 + TF 2.21 fail there
without mpwatch too ("You must feed a value for placeholder tensor 'while/.../Placeholder'" from the
LossScaleOptimizer's merge_call inside the steps_per_execution while loop)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import os, sys
    os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])
    import keras, numpy as np
    import mpwatch

    keras.mixed_precision.set_global_policy("mixed_float16")
    rng = np.random.default_rng(0)
    x = rng.random((120, 8), dtype=np.float32)
    y = rng.integers(0, 3, 120)
    for b in (1, 5, 6):  # whole batches overflow (on every replica)
        x[b * 12:(b + 1) * 12] = 1e30

    def run(logdir, strategy, spe):
        with strategy.scope():
            keras.utils.set_random_seed(3)
            model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                      keras.layers.Dense(3, activation="softmax", dtype="float32")])
            model.compile(keras.optimizers.SGD(0.01), "sparse_categorical_crossentropy",
                          steps_per_execution=spe)
        for _ in range(2):
            model.fit(x, y, batch_size=12, epochs=1, shuffle=False, verbose=0,
                      callbacks=[mpwatch.MixedPrecisionMonitor(logdir, log_every=5)])
        assert "scale_loss" not in vars(model.optimizer)  # the scale_loss witness is gone
        return int(model.optimizer.iterations.numpy())

    out = sys.argv[1]
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert mirrored.num_replicas_in_sync == 2
    for spe in (1,):
        a = run(os.path.join(out, f"single{spe}"), tf.distribute.get_strategy(), spe)
        b = run(os.path.join(out, f"mirrored{spe}"), mirrored, spe)
        print("iterations", spe, a, b)
    """
)


@pytest.mark.slow
def test_mirrored_strategy_records_what_single_device_records(tmp_path, read_events):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    for spe in (1,):
        assert f"iterations {spe} 14 14" in proc.stdout  # 20 batches, 6 skipped, both runs
        single, srec = read_events(tmp_path / f"single{spe}")
        mirrored, mrec = read_events(tmp_path / f"mirrored{spe}")
        for tag in (
            "mpwatch/loss_scale",
            "mpwatch/step_skipped",
            "mpwatch/skipped_steps",
            "mpwatch/skipped_steps_total",
        ):
            assert mirrored[tag] == single[tag], tag
        assert [s for s, v in single["mpwatch/step_skipped"] if v] == [2, 6, 7, 12, 16, 17]
        assert len(mrec["run_info"]) == 2 and mrec["run_info"][0][1]["num_replicas"] == 2
        assert [s for s, _ in mirrored["mpwatch/grad/zero_fraction"]] == [5, 10, 15, 20]
        # Keras' train step scales the loss on each replica (traced in a thread of its own):
        # the witness counts every call, and leaves nothing on the optimizer (asserted there)
        for rec, calls in ((srec, 1), (mrec, 2)):
            (opt,) = rec["train_step"][-1][1]["optimizers"]
            assert opt["scale_loss_calls"] == calls
        # same table up to the auto-generated layer names (the name and path columns, and the
        # inbound layers' names, the last column)
        strip = lambda rec: [row[2:-1] for row in rec["layers"][0][1]["layers"]["data"]]  # noqa: E731
        assert strip(mrec) == strip(srec)
