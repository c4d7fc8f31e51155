"""Float8 readiness, against Keras' own float8 layers on the same batch.

tests/beyond/beyond_fit.py trains keras.io's Transformer under mixed_bfloat16 with a probe every
4 steps; after the first probe (step 4, on the first training batch: the probe that measures
float8 readiness; the next ones at 8 and 12 do not) its truth has, for
every Dense and EinsumDense layer, the errors a Keras float8 copy of that layer makes there
(tests/beyond/float8_truth.py: a float32 copy of the model gives each layer's input and output
gradient; Keras' ``quantize("float8")`` with the scales this batch's amax gives). mpwatch's
record must say the same, within 0.006 absolute: the two captures of a layer's input and
gradient come from different float32 computations, and one E5M2 rounding flipped among the few
dozen elements of the 2-unit output layer moves its error by that much (0.005, measured on JAX).
"""

from __future__ import annotations

import numpy as np
import pytest

import mpwatch
from mpwatch.record.probe import float8

TOLERANCE = 0.006


@pytest.fixture(autouse=True, scope="module")
def _fresh_names():
    """The models built here take Keras' layer names (``dense``, ``token_and_position_embedding``):
    the global name counters are reset afterwards, so later tests' models are named as if built
    first."""
    yield
    import keras

    keras.backend.clear_session()


def test_float8_errors_equal_keras_own_float8_layers(beyond_runs):
    out, truth = beyond_runs
    want = truth["mixed"]["float8"]
    run = mpwatch.load_run(str(out / "mixed"))
    probe = run.latest_float8()  # the first probe measures it, the next ones not (FLOAT8_EVERY)
    assert probe.step == 4 and probe.model["batch_source"] == "training"
    assert sorted(int(s) for s in run.probe_model["step"]) == [4, 8, 12]
    got = {row["layer"].rsplit("/", 1)[-1]: row for row in probe.float8.to_dict("records")}
    assert sorted(got) == sorted(want) and len(want) == 8  # 4 EinsumDense of attention, 4 Dense
    classes = {name: row["class"] for name, row in got.items()}
    assert sorted(set(classes.values())) == ["Dense", "EinsumDense"]
    for name, errors in want.items():
        for key, value in errors.items():
            assert got[name][key] == pytest.approx(value, abs=TOLERANCE), (name, key)
        # float8 loses about ten times what bfloat16 loses on the same layer
        assert got[name]["out_error_16"] < got[name]["out_error_8"] / 4


@pytest.mark.parametrize(
    "outlier, ready", [(None, True), (1e6, False)], ids=["spread", "one_outlier"]
)
def test_the_numpy_arithmetic_is_keras_float8(outlier, ready):
    """Known tensors, Keras' float8 Dense (this process' backend) against
    :func:`mpwatch.record.probe.float8.layer_errors`; one input a million times the rest sets the
    scale so the others fall below E4M3's range (2^-9 of 448 / 1e6): not ready, for that reason,
    though a tensor-wide norm, which that one row dominates, would call the output fine."""
    import keras
    from float8_truth import keras_float8_errors

    rng = np.random.default_rng(7)
    x = rng.standard_normal((32, 64)).astype(np.float32)
    if outlier is not None:
        x[0, 0] = outlier
    w = (0.05 * rng.standard_normal((64, 24))).astype(np.float32)
    b = (0.1 * rng.standard_normal(24)).astype(np.float32)
    g = (1e-3 * rng.standard_normal((32, 24))).astype(np.float32)
    layer = keras.layers.Dense(24, dtype="mixed_bfloat16")
    layer.build((None, 64))
    want = keras_float8_errors(layer, w, b, x, g)
    got = float8.layer_errors("...i,ij->...j", x, w, b, g, "bfloat16")
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-3, abs=1e-5), key
    is_ready, why = float8.verdict(got)
    assert is_ready is ready
    if not ready:
        assert got["x_flush"] > 0.5 and "flush to zero in E4M3" in why and "inputs" in why


def test_rows_the_float16_run_already_loses_are_not_float8s_doing():
    """A float16 layer whose output gradient has 24 of 64 rows (examples the model already fits)
    below float16's range even scaled: the float16 run loses those rows of dx whole (numpy: they
    cast to zeros), so against float32 both float16 and float8 are ~37.5% off and the old verdict
    blamed "E5M2's 2 mantissa bits". What float8 adds is Keras' own float8 layer's error on the
    gradient as float16 holds it (those rows zero): a few percent, so ready."""
    import keras
    from float8_truth import keras_float8_errors

    rng = np.random.default_rng(7)
    x = rng.standard_normal((64, 32)).astype(np.float32)
    w = (0.1 * rng.standard_normal((32, 16))).astype(np.float32)
    g = (1e-3 * rng.standard_normal((64, 16))).astype(np.float32)
    g[:24] *= 1e-6
    lost = np.all(g.astype(np.float16) == 0, axis=1)
    assert lost.sum() == 24 and not lost[24:].any()
    held = np.where(lost[:, None], 0.0, g).astype(np.float32)  # the gradient as float16 holds it
    layer = keras.layers.Dense(16, use_bias=False, dtype="mixed_float16")
    layer.build((None, 32))
    against_f32 = keras_float8_errors(layer, w, None, x, g)
    added = keras_float8_errors(layer, w, None, x, held)
    got = float8.layer_errors("...i,ij->...j", x, w, None, g, "float16")
    assert got["dx_error_8"] == pytest.approx(against_f32["dx_error_8"], rel=1e-3)
    assert got["dx_error_8"] > float8.READY_GRAD  # what the old verdict judged: not ready
    assert got["dx_error_16"] == pytest.approx(lost.mean(), abs=1e-3)  # those rows, whole
    assert got["dx_change_8"] == pytest.approx(added["dx_error_8"], rel=2e-2)
    assert got["dx_change_8"] < float8.READY_GRAD
    assert float8.verdict(got, "float16") == (True, "")


def test_the_finding_lists_the_ready_layers_and_its_code_converts_them(beyond_runs):
    out, truth = beyond_runs
    (f,) = [f for f in mpwatch.diagnose(str(out / "mixed")) if f.rule == "float8-readiness"]
    # the 2-unit softmax output layer is kept out (float8 recipes keep the last layer)
    assert f.severity == "info"
    assert f.title == "float8: 7 of 8 Dense/EinsumDense layers are ready to convert"
    assert "compute capability 8.9" in f.evidence  # a CPU run says where float8 pays
    assert "kept out: dense_" in f.evidence and "the model's output" in f.evidence
    assert "filters=lambda layer: layer.name not in keep" in f.fix
    # the code, run on the model as its user builds it: every layer named is float8 and trains
    import keras
    from repo_scripts import load_script

    real = load_script("examples/real_models.py")
    with real.policy_scope("mixed_bfloat16"):
        model, x, y = real.build_transformer(seed=0, n=32)
        model(x[:2])
        # the fix names the probe's model's output layer; this model's is its last Dense
        out_name = model.layers[-1].name
        code = f.fix.replace(f.data["kept_out"][0].rsplit("/", 1)[-1], out_name)
        exec(code, {"model": model, "keras": keras})  # noqa: S102
        quantized = {
            layer.name for layer in model._flatten_layers()
            if getattr(layer, "quantization_mode", None) == "float8"
        }  # fmt: skip
        # the same layers (Keras numbers the Dense names of a second model on: dense_8, ...)
        assert len(quantized) == len(f.data["ready"]) == 7 and out_name not in quantized
        assert {"query", "key", "value", "attention_output"} <= quantized
        real._compile(model)
        history = model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][-1])


def test_a_float16_overflow_is_judged_against_float32():
    """An input of 1e5 overflows float16 (numpy: inf): the run's own 16-bit values are no
    reference, so float8 is judged against float32, and the reason says why."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    x[0] *= 1e5
    assert np.isinf(x.astype(np.float16)).any()
    w = rng.standard_normal((16, 4)).astype(np.float32)
    g = rng.standard_normal((8, 4)).astype(np.float32)
    with np.errstate(all="ignore"):
        got = float8.layer_errors("...i,ij->...j", x, w, None, g, "float16")
    assert not np.isfinite(got["out_error_16"]) and got["out_error_8"] > float8.READY_OUT
    ready, why = float8.verdict(got, "float16")
    assert not ready and f"output error {got['out_error_8']:.1%}" in why
    assert "the float16 run's own values are not finite" in why
