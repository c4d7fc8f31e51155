"""Sequential, Functional and subclassed models under mixed_float16, mixed_bfloat16 and float32; and
the quick start run (a real CNN fit with the float16 softmax mistake)."""

from __future__ import annotations

import numpy as np
import pytest


def _make(kind):
    import keras

    if kind == "sequential":
        return keras.Sequential(
            [keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)]
        )
    if kind == "functional":
        x = keras.Input((6,))
        h = keras.layers.Dense(8, activation="relu")(x)
        return keras.Model(x, keras.layers.Dense(2)(h))

    class Sub(keras.Model):
        def __init__(self):
            super().__init__()
            self.a = keras.layers.Dense(8, activation="relu")
            self.b = keras.layers.Dense(2)

        def call(self, x):
            return self.b(self.a(x))

    return Sub()


@pytest.mark.parametrize("kind", ["sequential", "functional", "subclassed"])
@pytest.mark.parametrize("name", ["mixed_float16", "mixed_bfloat16", "float32"])
def test_model_kinds_and_policies(tmp_path, policy, read_events, kind, name):
    import mpwatch

    with policy(name):
        model = _make(kind)
        model.compile("adam", "mse")
        x = np.random.rand(30, 6).astype("float32")
        y = np.random.rand(30, 2).astype("float32")
        model.fit(x, y, batch_size=10, epochs=2, verbose=0,
                  callbacks=[mpwatch.MixedPrecisionMonitor(tmp_path, log_every=3)])
    scalars, records = read_events(tmp_path)
    info = records["run_info"][0][1]
    assert info["policy"] == name and info["model"]["kind"] == kind
    assert [s for s, _ in scalars["mpwatch/train/loss"]] == list(range(1, 7))
    assert [s for s, _ in scalars["mpwatch/grad/zero_fraction"]] == [3, 6]
    assert [s for s, _ in scalars["mpwatch/perf/peak_memory_mb"]] == [3, 6]
    if name == "mixed_float16":
        assert [s for s, _ in scalars["mpwatch/loss_scale"]] == list(range(0, 7))  # 0: the start
        assert info["loss_scale"]["kind"] == "dynamic"
    else:
        assert "mpwatch/loss_scale" not in scalars
        assert any(p["part"] == "loss_scale" for _, p in records["notice"])
    rows = records["layers"][-1][1]["layers"]
    cols = rows["columns"]
    compute = {r[cols.index("compute_dtype")] for r in rows["data"]}
    outputs = {r[cols.index("output_dtype")] for r in rows["data"]}
    expected = {"mixed_float16": "float16", "mixed_bfloat16": "bfloat16", "float32": "float32"}
    assert compute == {expected[name]} and outputs == {expected[name]}
    assert sum(r[cols.index("params")] for r in rows["data"]) == 6 * 8 + 8 + 8 * 2 + 2


def test_quickstart_run_shows_the_float16_softmax(quickstart_logdir, read_events):
    scalars, records = read_events(quickstart_logdir)
    rows = records["layers"][-1][1]["layers"]
    table = [dict(zip(rows["columns"], r)) for r in rows["data"]]
    out = [r for r in table if r["is_output"]]
    assert len(out) == 1 and out[0]["class"] == "Dense"
    assert out[0]["output_dtype"] == "float16" and out[0]["policy"] == "mixed_float16"
    conv = [r for r in table if r["class"] == "Conv2D"]
    assert [r["tc_dims"]["filters"] for r in conv] == [32, 64]
    assert conv[0]["tc_dims"]["input_channels"] == 1 and conv[0]["tc_aligned"] is False
    assert len(scalars["mpwatch/loss_scale"]) == 1 + 8  # step 0, then 512 samples / 64
    assert records["run_info"][0][1]["policy"] == "mixed_float16"
