"""Float8 readiness against real float8: the per-layer errors mpwatch predicted beside what
Keras' ``quantize("float8")`` model computes there (issue 54).

mpwatch's float8 readiness (``mpwatch/record/probe/float8.py``) predicts, per Dense/EinsumDense
layer, from the layer's float32-reference input ``x``, kernel ``W`` and output gradient ``g`` on the
probe's batch: the relative error of the layer's output ``z = x W + b`` *before the activation*
(mean over rows of ``||z8 - z32|| / ||z32||``), of ``dx`` (the same, per row) and of ``dW``
(tensor-wide), when Keras' float8 layer computes them: x and W quantized and dequantized to E4M3
and g to E5M2, each with the per-tensor scale ``amax / max`` of *this batch's own* amax, the
matmul in the compute dtype (bfloat16). mpwatch computes this in numpy (an emulation).

This script checks it against Keras itself (``KERAS_BACKEND=jax``, forced here):

1. mpwatch's record. Per model, under ``mixed_bfloat16``: build, compile (Adam, sparse categorical
   crossentropy), fit ``--steps`` steps on synthetic data with
   ``mpwatch.MixedPrecisionMonitor(logdir, probe_every=steps, probe_data=first batch,
   profile=False, budget=None)``: the one probe runs after the last step (the fit's first probe
   always measures float8 readiness), on the first batch, with the final weights. Its float8 table
   is read back with ``mpwatch.load_run(logdir).latest_float8()``.
2. The truth, on the same weights and batch (nothing of mpwatch used): a float32 copy of the model
   (same builder under the ``float32`` policy, ``set_weights``) runs the batch (``training=False``:
   these models have no BatchNormalization, and dropout is off as in mpwatch's probe) under
   ``jax.default_matmul_precision("highest")`` (no TF32 on a GPU), with every Dense/EinsumDense
   leaf's call wrapped to note its input and, by ``jax.value_and_grad`` over a zero tensor added
   to its pre-activation output, the loss' gradient there. A ``mixed_bfloat16`` copy gets
   ``model.quantize("float8")`` (Keras' own float8 layers; on a compute-capability >= 8.9 GPU XLA's
   gemm rewriter turns their quantize-dequantize + matmul into fp8 gemms, on a CPU they are
   emulated). Then, per layer, in one ``jax.jit`` function:

   - **isolated** (mpwatch's definition): each quantized layer, activation off, run on the float32
     copy's input of that layer (``layer(x)`` in a ``StatelessScope``: Keras' autocast as in the
     model), its ``dx`` and ``dW`` by ``jax.vjp`` for the captured output gradient; the same for
     the unquantized ``mixed_bfloat16`` layer (mpwatch's ``*_error_16``). Reference: float64 numpy
     from the float32 input, kernel, bias and gradient.
   - **in the model**: the quantized model's own forward pass, each layer's pre-activation output
     against the float32 reference of its float32 input (errors of the layers before included:
     what a float8 model really outputs there; not what mpwatch predicts).

   Scales. Keras' float8 layers use delayed scaling: a forward uses the scale variables, and a
   training step's gradient overwrites them with ``amax_history.max() / max`` and rolls the
   step's amax into the history (1024 long), so a fresh layer starts at scale 1.0 and step t
   uses the amax of steps <= t - 2. Two settings are measured:

   - ``batch`` (the comparison): every scale set from this batch's amax
     (``keras.quantizers.compute_float8_scale``, of the tensor cast to the layer's compute dtype),
     which is what mpwatch assumes: what the history gives for data like this batch.
   - ``history`` (shown beside, not judged; after every model's main results, and only while
     ``--deadline`` seconds have not passed): the scales and histories reset, then the quantized
     model is trained ``--history-steps`` steps by Keras with ``SGD(learning_rate=0.0)`` on the
     training batches (weights unchanged, checked; dropout on, as in training), so its scales are
     what real delayed scaling holds after that many steps (the largest amax of those batches);
     the isolated layers' output errors with them.

3. A per-layer table: mpwatch's predicted errors (output, dx, dW in float8; output in 16 bits),
   the real ones, the output's ratio, and whether each prediction is within a factor of
   ``--tolerance`` (2) of the real one, with the in-model error beside; the device kind and
   compute capability; whether XLA emitted fp8 gemms (the compiled HLO of the quantized model's
   forward and of the isolated float8 layers' forward + vjp: dots or custom calls whose operands
   are ``f8e4m3fn`` / ``f8e5m2``, and cuBLASLt's ``$f8`` matmul targets); and
   ``'tensorflow' in sys.modules`` at the end (it must be False).

Models: ``mlp`` (256 -> 1024 relu -> 1024 relu -> 10, softmax in float32; its inputs' features
spread over four decades of scale, so the largest ones set its first layer's input scale) and
``transformer`` (keras.io's classifier from ``benchmarks/real_models.py``: 4 EinsumDense of the
attention, 4 Dense, the last one in float32).

    KERAS_BACKEND=jax python benchmarks/float8_real.py [--models mlp,transformer] [--steps 4]
        [--batch-size 32] [--history-steps 8] [--deadline 30] [--tolerance 2] [--json out.json]

About 35 s on 2 CPU cores with an empty mpwatch program cache (``MPWATCH_CACHE_DIR``), most of it
the two monitored fits' first compiles; meant for a GPU of compute capability 9.0 (real fp8
gemms). Every stage is wrapped: a failure prints its traceback and the run goes on to print what
it got (and ``--json`` is rewritten after each model); the exit status is 1 if any stage failed.

On a CPU (emulated float8) every prediction equals Keras' own float8 layer to 3 digits, except
where a layer's own policy is not the run's: mpwatch computes every layer in the run's 16-bit
dtype, while Keras computes a ``dtype="float32"`` layer (the Transformer's softmax output) and
its float8 quantize-dequantize in float32 (its output error 0.026 predicted, 0.018 real; its
16-bit error 0.0023 predicted, 0 real).
"""

from __future__ import annotations

import os

os.environ["KERAS_BACKEND"] = "jax"  # the script is JAX's: jax.jit, jax.vjp, compiled HLO text
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # this checkout's mpwatch before an installed one

E4M3_MAX, E5M2_MAX = 448.0, 57344.0
ERRORS: list[str] = []  # the stages that failed, for the exit status and the summary


@contextlib.contextmanager
def stage(name: str, where: dict):
    """Times a stage into ``where["seconds"][name]``; a failure prints its traceback, is noted in
    ``where["errors"]`` and :data:`ERRORS`, and the run goes on."""
    t0 = time.perf_counter()
    print(f"-- {name} ...", flush=True)
    try:
        yield
    except Exception as e:  # noqa: BLE001  (printed, recorded, the run goes on)
        traceback.print_exc()
        msg = f"{name}: {type(e).__name__}: {e}"
        where.setdefault("errors", []).append(msg)
        ERRORS.append(msg)
        print(f"!! {name} failed: {type(e).__name__}: {e}", flush=True)
    finally:
        dt = time.perf_counter() - t0
        where.setdefault("seconds", {})[name] = round(dt, 3)
        print(f"   {name}: {dt:.2f} s", flush=True)


# --- environment ----------------------------------------------------------------------------------
def environment() -> dict:
    import jax
    import keras

    dev = jax.devices()[0]
    cc = getattr(dev, "compute_capability", None)
    info = {
        "python": platform.python_version(),
        "jax": jax.__version__,
        "keras": keras.__version__,
        "backend": keras.backend.backend(),
        "platform": dev.platform,
        "device_kind": getattr(dev, "device_kind", str(dev)),
        "compute_capability": None if cc is None else str(cc),
        "devices": len(jax.devices()),
    }
    try:
        import mpwatch

        info["mpwatch"] = getattr(mpwatch, "__version__", "?")
    except Exception as e:  # noqa: BLE001
        info["mpwatch"] = f"import failed: {e}"
    try:
        info["fp8_capable"] = cc is not None and float(cc) >= 8.9
    except (TypeError, ValueError):
        info["fp8_capable"] = None
    return info


# --- models ---------------------------------------------------------------------------------------
def _real_models() -> Any:
    spec = importlib.util.spec_from_file_location("mpwatch_bench_real_models",
                                                  f"{HERE}/real_models.py")  # fmt: skip
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_mlp():
    import keras

    inputs = keras.Input(shape=(256,), name="features")
    x = keras.layers.Dense(1024, activation="relu", name="fc1")(inputs)
    x = keras.layers.Dense(1024, activation="relu", name="fc2")(x)
    x = keras.layers.Dense(10, name="logits")(x)
    outputs = keras.layers.Activation("softmax", dtype="float32", name="softmax")(x)
    return keras.Model(inputs, outputs, name="mlp")


def build_transformer():
    return _real_models().transformer()


def data(name: str, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    if name == "transformer":
        return rng.integers(0, 20000, (n, 200)).astype("int32"), rng.integers(0, 2, n)
    # features spread over four decades (0.01 .. 100): E4M3 at the largest one's scale flushes
    # the smallest ones to zero (E4M3 spans 2^17 with its subnormals)
    scales = np.logspace(-2, 2, 256).astype(np.float32)
    rng.shuffle(scales)
    x = (rng.standard_normal((n, 256)).astype(np.float32) * scales).astype(np.float32)
    return x, rng.integers(0, 10, n)


BUILDERS = {"mlp": build_mlp, "transformer": build_transformer}


def seed_everything(seed: int) -> None:
    """``keras.utils.set_random_seed`` without its ``tf.available`` check, which imports
    TensorFlow wherever it is installed: Python's and NumPy's seeds, Keras' global seed and
    seed generator reset."""
    import random

    random.seed(seed)
    np.random.seed(seed)
    try:
        from keras.src.backend.common import global_state
        from keras.src.random import seed_generator
        from keras.src.utils import rng_utils

        global_state.set_global_attribute(rng_utils.GLOBAL_RANDOM_SEED, seed)
        global_state.set_global_attribute(seed_generator.GLOBAL_SEED_GENERATOR, None)
    except Exception:  # noqa: BLE001  (private API moved: Python's seed still makes Keras')
        traceback.print_exc()


def build(name: str, policy: str, seed: int = 0) -> Any:
    import keras

    old = keras.config.dtype_policy().name
    keras.config.set_dtype_policy(policy)
    try:
        seed_everything(seed)
        return BUILDERS[name]()
    finally:
        keras.config.set_dtype_policy(old)


def leaves(model: Any) -> list[Any]:
    """Keras' own Dense/EinsumDense leaves (what ``model.quantize`` converts), in
    ``_flatten_layers`` order: the same order for two models from one builder."""
    return [
        layer for layer in model._flatten_layers(include_self=False, recursive=True)
        if type(layer).__name__ in ("Dense", "EinsumDense")
        and type(layer).__module__.startswith("keras.")
    ]  # fmt: skip


# --- mpwatch's prediction -------------------------------------------------------------------------
def mpwatch_run(name: str, args: argparse.Namespace, out: dict) -> tuple[Any, Any, Any]:
    """Fits the model with the monitor; returns (model, x, y) and fills ``out["mpwatch"]``."""
    import keras

    import mpwatch

    model = build(name, "mixed_bfloat16")
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy")
    bs, steps = args.batch_size, args.steps
    x, y = data(name, bs * max(steps, args.history_steps))
    x_fit, y_fit = x[: bs * steps], y[: bs * steps]
    logdir = os.path.join(args.logdir, name)
    shutil.rmtree(logdir, ignore_errors=True)
    monitor = mpwatch.MixedPrecisionMonitor(
        logdir, probe_every=steps, probe_data=(x[:bs], y[:bs]), profile=False, budget=None
    )
    model.fit(x_fit, y_fit, batch_size=bs, epochs=1, shuffle=False, verbose=0,
              callbacks=[monitor])  # fmt: skip
    run = mpwatch.load_run(logdir)
    probe = run.latest_float8()
    rec = out["mpwatch"] = {"logdir": logdir, "steps_trained": steps}
    if probe is None:
        pm = run.probe_model
        rec["probe_steps"] = [int(s) for s in pm["step"]] if "step" in pm else []
        raise RuntimeError(f"no float8 readiness in the record (probes at {rec['probe_steps']})")
    rec["probe_step"] = int(probe.step)
    rec["batch_source"] = probe.model.get("batch_source")
    rec["rows"] = json.loads(probe.float8.to_json(orient="records"))
    if probe.step != steps:
        print(f"!! the float8 probe ran at step {probe.step}, not {steps}: other weights")
    return model, x, y


# --- the truth ------------------------------------------------------------------------------------
def _np32(t: Any) -> np.ndarray:
    return np.asarray(np.asarray(t).astype(np.float32), np.float32)


@contextlib.contextmanager
def wrapped(layers: list[Any], seen: dict, eps: list[Any] | None = None):
    """Each layer's (quantized_)call wrapped (an instance attribute): activation off, input and
    pre-activation output noted in ``seen[i]``, ``eps[i]`` added to the output, activation
    applied."""
    import keras

    linear = keras.activations.get("linear")
    names = []
    for i, layer in enumerate(layers):
        attr = "quantized_call" if getattr(layer, "quantization_mode", None) else "call"
        orig = getattr(layer, attr)

        def call(inputs, *a, _i=i, _layer=layer, _orig=orig, **k):
            act, _layer.activation = _layer.activation, linear
            try:
                z = _orig(inputs, *a, **k)
            finally:
                _layer.activation = act
            if eps is not None:
                z = z + eps[_i]
            seen[_i] = (inputs, z)
            return act(z) if act is not None else z

        object.__setattr__(layer, attr, call)
        names.append(attr)
    try:
        yield
    finally:
        for layer, attr in zip(layers, names):
            if attr in layer.__dict__:
                object.__delattr__(layer, attr)


def capture_float32(model32: Any, x: Any, y: Any) -> list[tuple[np.ndarray, np.ndarray]]:
    """(input, loss gradient w.r.t. the pre-activation output) of each leaf of the float32 copy,
    ``training=False``, float32 matmuls at full precision."""
    import jax
    import jax.numpy as jnp
    import keras

    layers = leaves(model32)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    tv = [v.value for v in model32.trainable_variables]
    ntv = [v.value for v in model32.non_trainable_variables]

    def shapes(tv, ntv, x):
        seen: dict = {}
        with wrapped(layers, seen):
            model32.stateless_call(tv, ntv, x, training=False)
        return [seen[i][1] for i in range(len(layers))]

    def run(eps, tv, ntv, x, y):
        seen: dict = {}
        with wrapped(layers, seen, eps):
            y_pred, _ = model32.stateless_call(tv, ntv, x, training=False)
        return loss_fn(y, y_pred), [seen[i][0] for i in range(len(layers))]

    with jax.default_matmul_precision("highest"):
        eps = [jnp.zeros(s.shape, s.dtype) for s in jax.eval_shape(shapes, tv, ntv, x)]
        fn = jax.jit(jax.value_and_grad(run, has_aux=True))
        (_, inputs), grads = fn(eps, tv, ntv, jnp.asarray(x), jnp.asarray(y))
    return [(_np32(a), _np32(g)) for a, g in zip(inputs, grads)]


def _equations(layer: Any, x: np.ndarray) -> tuple[str, str, str]:
    """(forward, dx, dW) einsum equations, ``...`` spelled out."""
    eq = getattr(layer, "equation", None) or "...i,ij->...j"
    lhs, out = eq.replace(" ", "").split("->")
    a, b = lhs.split(",")
    free = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in eq]
    dots = "".join(free[: max(0, x.ndim - len(a.replace("...", "")))])
    a, b, out = (s.replace("...", dots) for s in (a, b, out))
    return f"{a},{b}->{out}", f"{out},{b}->{a}", f"{a},{out}->{b}"


def reference(layer32: Any, x: np.ndarray, g: np.ndarray) -> dict[str, np.ndarray]:
    """The float32 layer's z (with bias), dx and dW in float64 numpy."""
    fwd, dx_eq, dw_eq = _equations(layer32, x)
    w = _np32(layer32.kernel).astype(np.float64)
    x64, g64 = x.astype(np.float64), g.astype(np.float64)
    z = np.einsum(fwd, x64, w, optimize=True)
    bias = getattr(layer32, "bias", None)
    if bias is not None:
        z = z + _np32(bias).astype(np.float64)
    return {"out": z, "dx": np.einsum(dx_eq, g64, w, optimize=True),
            "dw": np.einsum(dw_eq, x64, g64, optimize=True)}  # fmt: skip


def row_error(a: np.ndarray, ref: np.ndarray) -> float:
    """Mean over rows (all axes but the last) of ``||a - ref|| / ||ref||``, zero rows left out."""
    r = np.asarray(ref, np.float64).reshape(-1, ref.shape[-1])
    d = np.asarray(a, np.float64).reshape(-1, ref.shape[-1]) - r
    den = np.linalg.norm(r, axis=1)
    keep = den > 0
    return float(np.mean(np.linalg.norm(d[keep], axis=1) / den[keep])) if keep.any() else 0.0


def tensor_error(a: np.ndarray, ref: np.ndarray) -> float:
    ref = np.asarray(ref, np.float64)
    den = float(np.linalg.norm(ref))
    return float(np.linalg.norm(np.asarray(a, np.float64) - ref) / den) if den else 0.0


def errors_of(got: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> dict[str, float]:
    out = {}
    for k, fn in (("out", row_error), ("dx", row_error), ("dw", tensor_error)):
        if k in got:
            with np.errstate(all="ignore"):
                out[k] = fn(got[k], ref[k])
    return out


def _layer_vars(layer: Any) -> list[Any]:
    return [*layer.trainable_variables, *layer.non_trainable_variables]


def layer_function(layers: list[Any]) -> Any:
    """A jitted ``f(values, xs, gs)``: for each layer, its pre-activation output on ``xs[i]``
    (``layer(x)`` in a StatelessScope: Keras' autocast as in a model) and, by ``jax.vjp``, the
    gradients w.r.t. its input and kernel for the output gradient ``gs[i]``."""
    import jax
    import keras

    kernel_at = [[id(v) for v in _layer_vars(layer)].index(id(layer._kernel)) for layer in layers]

    def f(values, xs, gs):
        outs = []
        for i, layer in enumerate(layers):
            vals = list(values[i])

            def z_of(x, k, _layer=layer, _vals=vals, _i=i):
                vs = list(_vals)
                vs[kernel_at[_i]] = k
                seen: dict = {}
                with keras.StatelessScope(state_mapping=list(zip(_layer_vars(_layer), vs))):
                    with wrapped([_layer], seen):
                        _layer(x)
                return seen[0][1]  # the output before the activation

            z, back = jax.vjp(z_of, xs[i], vals[kernel_at[i]])
            dx, dw = back(gs[i].astype(z.dtype))
            outs.append((z, dx, dw))
        return outs

    return jax.jit(f)


def values(layers: list[Any]) -> list[list[Any]]:
    return [[v.value for v in _layer_vars(layer)] for layer in layers]


def compute_scale(t: Any, dtype: str, fmax: float) -> Any:
    """Keras' delayed-scaling scale for a history holding only ``t``'s amax (in ``dtype``)."""
    import keras

    amax = keras.ops.max(keras.ops.abs(keras.ops.cast(keras.ops.cast(t, dtype), "float32")))
    return keras.quantizers.compute_float8_scale(
        amax, keras.ops.convert_to_tensor(np.float32(1.0)),
        keras.ops.convert_to_tensor(np.float32(fmax)),
    )  # fmt: skip


def set_batch_scales(qlayers: list[Any], captured: list[tuple[np.ndarray, np.ndarray]]) -> list:
    rows = []
    for layer, (x, g) in zip(qlayers, captured):
        cd = layer.compute_dtype
        layer.inputs_scale.assign(compute_scale(x, cd, E4M3_MAX))
        layer.kernel_scale.assign(compute_scale(layer._kernel.value, cd, E4M3_MAX))
        layer.outputs_grad_scale.assign(compute_scale(g, cd, E5M2_MAX))
        rows.append(scales_of(layer))
    return rows


def scales_of(layer: Any) -> dict[str, float]:
    return {k: float(np.asarray(getattr(layer, k).value))
            for k in ("inputs_scale", "kernel_scale", "outputs_grad_scale")}  # fmt: skip


def reset_scales(qlayers: list[Any]) -> None:
    for layer in qlayers:
        for k in ("inputs", "kernel", "outputs_grad"):
            getattr(layer, f"{k}_scale").assign(np.float32(1.0))
            hist = getattr(layer, f"{k}_amax_history")
            hist.assign(np.zeros(hist.shape, np.float32))


def model_forward(model: Any) -> Any:
    """A jitted forward of the whole model (``training=False``) that also returns each leaf's
    pre-activation output."""
    import jax

    layers = leaves(model)

    def f(tv, ntv, x):
        seen: dict = {}
        with wrapped(layers, seen):
            y, _ = model.stateless_call(tv, ntv, x, training=False)
        return y, [seen[i][1] for i in range(len(layers))]

    return jax.jit(f)


F8_TYPES = ("f8e4m3fn", "f8e5m2", "f8e4m3fnuz", "f8e5m2fnuz", "f8e4m3")
_OP = re.compile(r"\b(dot|custom-call|fusion)\(([^)]*)\)")


def fp8_gemms(hlo: str) -> dict:
    """What the optimized HLO says of fp8. ``f8e4m3`` / ``f8e5m2`` mentions: the quantize half
    (a convert to f8) is there on a CPU too. The real fp8 gemms: a ``dot`` whose operands are f8
    (in a Triton gemm fusion, or a CPU/GPU dot), a custom call on f8 operands (cuBLASLt's
    ``__cublas$lt$matmul$f8``), a gemm fusion called on f8 operands; a few such lines kept."""
    lines = hlo.splitlines()
    gemm_lines = []
    for line in lines:
        for m in _OP.finditer(line):
            if m.group(1) == "fusion" and "gemm" not in line:
                continue  # an elementwise fusion of f8 (the dequantize) is no gemm
            if any(f"{t}[" in m.group(2) for t in F8_TYPES):
                gemm_lines.append(line.strip())
                break
    cublas_f8 = [ln.strip() for ln in lines if "$f8" in ln and "custom-call" in ln]
    return {
        "f8e4m3_mentions": hlo.count("f8e4m3"),
        "f8e5m2_mentions": hlo.count("f8e5m2"),
        "f8_operand_gemms": len(gemm_lines),
        "cublaslt_f8_calls": len(cublas_f8),
        "fp8_gemm": bool(gemm_lines or cublas_f8),
        "examples": [ln[:400] for ln in (cublas_f8 or gemm_lines)[:4]],
    }


def hlo_text(jitted: Any, *args: Any) -> str:
    return jitted.lower(*args).compile().as_text()


def truth(name: str, model: Any, x: np.ndarray, y: np.ndarray, args: argparse.Namespace,
          out: dict) -> dict | None:  # fmt: skip
    """The real errors of every leaf (``out["truth"]``); the context :func:`history` needs, or
    None where a stage it needs failed."""
    import jax.numpy as jnp

    bs = args.batch_size
    xb, yb = x[:bs], y[:bs]
    t = out["truth"] = {}
    weights = model.get_weights()
    lmix = leaves(model)
    t["layers"] = [
        {"index": i, "name": layer.name, "keras_path": layer.path, "class": type(layer).__name__,
         "compute_dtype": layer.compute_dtype, "kernel_shape": list(layer.kernel.shape)}
        for i, layer in enumerate(lmix)
    ]  # fmt: skip
    got: Any = None
    with stage(f"{name}: float32 copy: each layer's input and output gradient", out):
        model32 = build(name, "float32")
        model32.set_weights(weights)
        captured = capture_float32(model32, xb, yb)
        refs = [reference(layer, xi, gi) for layer, (xi, gi) in zip(leaves(model32), captured)]
        xs, gs = [jnp.asarray(c[0]) for c in captured], [jnp.asarray(c[1]) for c in captured]
        got = True
    if got is None:
        return None
    with stage(f"{name}: the mixed_bfloat16 layers as they are (16-bit)", out):
        got = layer_function(lmix)(values(lmix), xs, gs)
        for row, r, (z, dx, dw) in zip(t["layers"], refs, got):
            e = errors_of({"out": _np32(z), "dx": _np32(dx), "dw": _np32(dw)}, r)
            row.update({f"real_{k}_error_16": v for k, v in e.items()})
    got = None
    with stage(f"{name}: model.quantize('float8') on a mixed_bfloat16 copy", out):
        mq = build(name, "mixed_bfloat16")
        mq.set_weights(weights)
        with warnings.catch_warnings():  # "Layer Dropout does not have a `quantize` method"
            warnings.simplefilter("ignore", UserWarning)
            mq.quantize("float8")
        lq = leaves(mq)
        t["quantized"] = sum(getattr(q, "quantization_mode", None) == "float8" for q in lq)
        print(f"   {t['quantized']} of {len(lq)} Dense/EinsumDense layers in float8")
        for row, sc in zip(t["layers"], set_batch_scales(lq, captured)):
            row["batch_scales"] = sc
        got = True
    if got is None:
        return None
    fn8 = args8 = None
    with stage(f"{name}: float8, batch scales, each layer on its float32 input", out):
        fn8, args8 = layer_function(lq), (values(lq), xs, gs)
        for row, r, (z, dx, dw) in zip(t["layers"], refs, fn8(*args8)):
            e = errors_of({"out": _np32(z), "dx": _np32(dx), "dw": _np32(dw)}, r)
            row.update({f"real_{k}_error_8": v for k, v in e.items()})
    if fn8 is not None:
        with stage(f"{name}: HLO of those float8 layers (forward + vjp)", out):
            t["hlo_layers"] = fp8_gemms(hlo_text(fn8, *args8))
    fwd = None
    with stage(f"{name}: float8, batch scales, in the quantized model's forward", out):
        fwd = model_forward(mq)
        tv = [v.value for v in mq.trainable_variables]
        ntv = [v.value for v in mq.non_trainable_variables]
        xj = jnp.asarray(xb)
        _, zs = fwd(tv, ntv, xj)
        for row, r, z in zip(t["layers"], refs, zs):
            row["real_out_error_8_in_model"] = row_error(_np32(z), r["out"])
    if fwd is not None:
        with stage(f"{name}: HLO of the quantized model's forward", out):
            t["hlo_model"] = fp8_gemms(hlo_text(fwd, tv, ntv, xj))
    if fn8 is None:
        return None
    return {"mq": mq, "lq": lq, "fn8": fn8, "args8": args8, "refs": refs, "x": x, "y": y}


def history(name: str, ctx: dict, args: argparse.Namespace, out: dict) -> None:
    """The quantized copy's scales and histories reset, then ``--history-steps`` steps of Keras'
    own training with ``SGD(learning_rate=0.0)`` (weights unchanged; the scale variables are
    overwritten by their "gradients", as in any float8 training step): its isolated layers'
    output errors with the scales delayed scaling then holds."""
    import keras

    t, mq, lq, bs = out["truth"], ctx["mq"], ctx["lq"], args.batch_size
    with stage(f"{name}: float8, scales after {args.history_steps} steps of delayed scaling", out):
        reset_scales(lq)
        before = [_np32(layer._kernel.value) for layer in lq]
        mq.compile(keras.optimizers.SGD(learning_rate=0.0), "sparse_categorical_crossentropy")
        n = bs * args.history_steps
        mq.fit(ctx["x"][:n], ctx["y"][:n], batch_size=bs, epochs=1, shuffle=False, verbose=0)
        t["history_kernels_unchanged"] = all(
            np.array_equal(a, _np32(layer._kernel.value)) for a, layer in zip(before, lq)
        )
        got = ctx["fn8"](values(lq), *ctx["args8"][1:])
        for row, r, layer, (z, _, _) in zip(t["layers"], ctx["refs"], lq, got):
            row["history_scales"] = scales_of(layer)
            row["real_out_error_8_history"] = row_error(_np32(z), r["out"])


# --- the comparison -------------------------------------------------------------------------------
def compare(out: dict, tol: float) -> None:
    rows = out.get("mpwatch", {}).get("rows") or []
    by_path = {r.get("keras_path"): r for r in rows}
    by_name = {str(r.get("layer", "")).rsplit("/", 1)[-1]: r for r in rows}
    table = out["table"] = []
    for row in out.get("truth", {}).get("layers", []):
        pred = by_path.get(row["keras_path"]) or by_name.get(row["name"])
        entry = {"layer": row["keras_path"], "class": row["class"],
                 "compute_dtype": row["compute_dtype"]}  # fmt: skip
        for k in ("out_error_8", "dx_error_8", "dw_error_8", "out_error_16", "dx_error_16",
                  "dw_error_16"):  # fmt: skip
            p = None if pred is None else pred.get(k)
            r = row.get(f"real_{k}")
            ratio = p / r if p is not None and r and math.isfinite(p) and r > 0 else None
            entry[k] = {
                "mpwatch": p,
                "real": r,
                "ratio": ratio,
                "within": None if ratio is None else 1 / tol <= ratio <= tol,
            }
        entry["out_error_8_in_model"] = row.get("real_out_error_8_in_model")
        entry["out_error_8_history"] = row.get("real_out_error_8_history")
        entry["mpwatch_ready"] = None if pred is None else pred.get("ready")
        entry["mpwatch_reason"] = None if pred is None else pred.get("reason")
        table.append(entry)


def _f(v: Any, spec: str = ".4f") -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    try:
        return format(v, spec)
    except (TypeError, ValueError):
        return str(v)


def print_model(name: str, out: dict, tol: float) -> None:
    table = out.get("table") or []
    print(
        f"\n=== {name}: mpwatch's prediction (probe at step "
        f"{out.get('mpwatch', {}).get('probe_step')}) vs Keras' quantize('float8') ==="
    )
    if not table:
        print("   (no table: see the errors above)")
        return
    head = (f"{'layer':<44} {'cd':<8} {'pred out8':>9} {'real out8':>9} {'ratio':>6} "
            f"{'ok':>3} | {'pred dx8':>8} {'real dx8':>8} {'ok':>3} | {'pred dW8':>8} "
            f"{'real dW8':>8} {'ok':>3} | {'in-model':>8} | {'pred o16':>8} {'real o16':>8} "
            f"{'ok':>3}")  # fmt: skip
    print(head)
    print("-" * len(head))
    # pred: mpwatch's record; real: Keras' layer on the same input (isolated); in-model: the
    # quantized model's own forward (earlier layers' float8 errors included); ok: within tol
    for e in table:
        o, dx, dw, o16 = e["out_error_8"], e["dx_error_8"], e["dw_error_8"], e["out_error_16"]
        print(f"{e['layer'][-44:]:<44} {e['compute_dtype']:<8} {_f(o['mpwatch']):>9} "
              f"{_f(o['real']):>9} {_f(o['ratio'], '.3f'):>6} {_f(o['within']):>3} | "
              f"{_f(dx['mpwatch']):>8} {_f(dx['real']):>8} {_f(dx['within']):>3} | "
              f"{_f(dw['mpwatch']):>8} {_f(dw['real']):>8} {_f(dw['within']):>3} | "
              f"{_f(e['out_error_8_in_model']):>8} | {_f(o16['mpwatch']):>8} "
              f"{_f(o16['real']):>8} {_f(o16['within']):>3}")  # fmt: skip
    t = out.get("truth", {})
    for key, what in (("hlo_model", "quantized model's forward"),
                      ("hlo_layers", "isolated float8 layers, forward + vjp")):  # fmt: skip
        h = t.get(key)
        if h:
            print(
                f"   HLO, {what}: fp8 gemms {_f(h['fp8_gemm'])} ({h['f8_operand_gemms']} "
                f"matmuls on f8 operands, {h['cublaslt_f8_calls']} cuBLASLt f8 calls; "
                f"f8e4m3 x{h['f8e4m3_mentions']}, f8e5m2 x{h['f8e5m2_mentions']})"
            )
            for ex in h["examples"][:2]:
                print(f"      {ex}")
    oks = [e["out_error_8"]["within"] for e in table if e["out_error_8"]["within"] is not None]
    print(
        f"   output error predicted within a factor {tol:g} of the real one: "
        f"{sum(oks)} of {len(table)} layers"
    )


def print_history(name: str, out: dict) -> None:
    rows = out.get("truth", {}).get("layers") or []
    if not any("real_out_error_8_history" in r for r in rows):
        return
    print(
        f"\n=== {name}: output error with delayed scaling's scales (history) beside this "
        f"batch's (batch) ==="
    )
    print(f"{'layer':<44} {'mpwatch':>8} {'batch':>8} {'history':>8} {'hist/batch':>10}  "
          f"inputs scale batch -> history")  # fmt: skip
    by = {e["layer"]: e for e in out.get("table", [])}
    for r in rows:
        pred = by.get(r["keras_path"], {}).get("out_error_8", {}).get("mpwatch")
        b, h = r.get("real_out_error_8"), r.get("real_out_error_8_history")
        ratio = h / b if b and h is not None else None
        bs, hs = r.get("batch_scales") or {}, r.get("history_scales") or {}
        print(f"{r['keras_path'][-44:]:<44} {_f(pred):>8} {_f(b):>8} {_f(h):>8} "
              f"{_f(ratio, '.3f'):>10}  {_f(bs.get('inputs_scale'), '.3g')} -> "
              f"{_f(hs.get('inputs_scale'), '.3g')}")  # fmt: skip
    print(
        f"   kernels unchanged by the SGD(0) steps: "
        f"{_f(out['truth'].get('history_kernels_unchanged'))}"
    )


def dump(result: dict, path: str | None) -> None:
    if not path:
        return
    try:
        with open(path, "w") as f:
            json.dump(result, f, indent=1, default=str)
    except Exception:  # noqa: BLE001  (printed; the run's printout stands)
        traceback.print_exc()
        if "json" not in ERRORS:
            ERRORS.append("json")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="mlp,transformer", help="of: " + ", ".join(BUILDERS))
    p.add_argument("--steps", type=int, default=4, help="training steps; the probe is after them")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--history-steps", type=int, default=8,
                   help="SGD(0) steps filling the amax histories (0: skip)")  # fmt: skip
    p.add_argument("--deadline", type=float, default=30.0,
                   help="seconds after which the history measurements are skipped")  # fmt: skip
    p.add_argument("--tolerance", type=float, default=2.0,
                   help="a prediction passes within this factor of the real error")  # fmt: skip
    p.add_argument("--logdir", default=None, help="where the runs go (default: a temporary one)")
    p.add_argument("--json", default=None, help="write everything here")
    args = p.parse_args(argv)
    t_start = time.perf_counter()
    result: dict = {"args": vars(args), "models": {}}
    tmp = None
    if args.logdir is None:
        tmp = args.logdir = tempfile.mkdtemp(prefix="mpwatch_float8_real_")
    try:
        with stage("environment", result):
            result["environment"] = env = environment()
            print("   " + ", ".join(f"{k}={v}" for k, v in env.items()))
        contexts = {}
        for name in [m.strip() for m in args.models.split(",") if m.strip()]:
            out = result["models"][name] = {}
            model = None
            with stage(f"{name}: fit with MixedPrecisionMonitor, read mpwatch's float8 table", out):
                if name not in BUILDERS:
                    raise ValueError(f"unknown model {name!r} (known: {', '.join(BUILDERS)})")
                model, x, y = mpwatch_run(name, args, out)
            if model is None:
                continue
            ctx = truth(name, model, x, y, args, out)
            if ctx is not None:
                contexts[name] = ctx
            with stage(f"{name}: compare", out):
                compare(out, args.tolerance)
            print_model(name, out, args.tolerance)
            dump(result, args.json)
        for name, ctx in contexts.items():
            out = result["models"][name]
            elapsed = time.perf_counter() - t_start
            if args.history_steps <= 0:
                continue
            if elapsed > args.deadline:
                out["history_skipped"] = f"{elapsed:.1f} s elapsed > --deadline {args.deadline:g}"
                print(f"-- {name}: history skipped ({out['history_skipped']})")
                continue
            history(name, ctx, args, out)
            with stage(f"{name}: compare", out):
                compare(out, args.tolerance)
            print_history(name, out)
    except BaseException:  # noqa: BLE001  (printed, then the summary of what it got)
        traceback.print_exc()
        ERRORS.append("main: " + traceback.format_exc(limit=1).strip().splitlines()[-1])
    env = result.get("environment", {})
    result["tensorflow_imported"] = "tensorflow" in sys.modules
    result.setdefault("seconds", {})["total"] = round(time.perf_counter() - t_start, 3)
    result["errors_all"] = list(ERRORS)
    print(f"\ndevice: {env.get('device_kind')} (platform {env.get('platform')}, compute "
          f"capability {env.get('compute_capability')}); jax {env.get('jax')}, keras "
          f"{env.get('keras')}")  # fmt: skip
    for name, out in result["models"].items():
        table = out.get("table") or []
        oks = sum(bool(e["out_error_8"]["within"]) for e in table)
        h = out.get("truth", {}).get("hlo_model") or {}
        print(
            f"{name}: output error within a factor {args.tolerance:g}: {oks} of {len(table)} "
            f"layers; XLA fp8 gemms in the quantized forward: {_f(h.get('fp8_gemm'))}"
        )
    print(f"'tensorflow' in sys.modules: {result['tensorflow_imported']}")
    print(f"total {result['seconds']['total']:.1f} s; failed stages: {len(ERRORS)}")
    for e in ERRORS:
        print(f"   {e}")
    dump(result, args.json)
    if args.json:
        print(f"wrote {args.json}")
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if ERRORS else 0


if __name__ == "__main__":
    sys.exit(main())
