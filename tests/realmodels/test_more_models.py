"""mpwatch on more models nobody here wrote (issue 24's acceptance): keras.applications'
EfficientNetB0, a keras.io-style ViT on TensorFlow and on JAX, keras.io's Bidirectional LSTM, and
MobileNetV2 under mixed_bfloat16 on JAX, each trained by ``examples/more_models.py``.

Every finding a run produces is checked against truth computed here, independently of mpwatch:
the model's own layers and dtypes, an observer callback's reading of the optimizer's iterations
and loss scale after every batch (a skipped step is a batch after which ``iterations`` did not
advance), the train step's gradients in plain TensorFlow (``examples/real_models.py``'s helpers)
and the device. :func:`check_every_finding` fails on a finding of a rule it has no check for, so
a new finding cannot pass unchecked. Every fix that changes the model is applied (the example's
``fixed=True`` builds it as the finding's fix says) and retrained, and the problem is measured
gone.

What is still short of the truth is pinned by a strict xfail test (it passes when mpwatch is
fixed): the ViT's skips, the float16 softmax's, are the model's own overflow but tied to no layer.

JAX runs in its own process (``tests/realmodels/more_models_jax.py`` with ``KERAS_BACKEND=jax``),
started when the module's first test starts, so that it trains beside the TensorFlow models.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from repo_scripts import ROOT, load_script

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

from preflown import (  # noqa: E402
    check_same_causes,
    check_the_change,
    fit_with_the_change,
    steps_for,
)
from printed_fix import every_fix_alike  # noqa: E402

import mpwatch  # noqa: E402
from mpwatch import words  # noqa: E402
from mpwatch.judge.evidence.skip_causes import skip_causes  # noqa: E402
from mpwatch.judge.rules import ALL_RULES  # noqa: E402

pytestmark = pytest.mark.slow

RULE_IDS = [m.RULE.id for m in ALL_RULES]
JAX_SPECS = ("vit", "mobilenet_v2_bf16", "mobilenet_v2_bf16:fixed")
JAX_TESTS = ("jax",)  # tests whose name holds one of these need the JAX process


# --- fixtures ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mm():
    return load_script("examples/more_models.py")


@pytest.fixture(scope="module")
def rm():
    return load_script("examples/real_models.py")


class _JaxProcess:
    """tests/realmodels/more_models_jax.py running under Keras' JAX backend (its output to a
    file, so that it never waits on a pipe while this process trains)."""

    def __init__(self, out):
        self.out = out
        env = dict(os.environ, KERAS_BACKEND="jax", PYTHONPATH=str(ROOT))
        script = ROOT / "tests" / "realmodels" / "more_models_jax.py"
        self.log = open(out / "log.txt", "w+")  # noqa: SIM115  (closed in close())
        self.proc = subprocess.Popen(
            [sys.executable, str(script), str(out), *JAX_SPECS],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._truth = None

    def truth(self):
        if self._truth is None:
            self.proc.wait(timeout=900)
            self.log.seek(0)
            assert self.proc.returncode == 0, self.log.read()[-4000:]
            with open(self.out / "truth.json") as f:
                self._truth = json.load(f)
        return self._truth

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module", autouse=True)
def jax_process(request, tmp_path_factory):
    """The JAX process, started with the module's first test when a selected test needs it."""
    items = request.session.items
    wanted = any(
        item.module is request.module and any(k in item.name for k in JAX_TESTS) for item in items
    )
    if not wanted:
        yield None
        return
    pytest.importorskip("jax")
    proc = _JaxProcess(tmp_path_factory.mktemp("more_models_jax"))
    yield proc
    proc.close()


@pytest.fixture(scope="module")
def jax_truth(jax_process):
    if jax_process is None:
        pytest.skip("the JAX process was not started")
    return jax_process.truth()


class Observer(keras.callbacks.Callback):
    """After each batch: the optimizer's own iterations and loss scale (the truth)."""

    def __init__(self):
        super().__init__()
        self.iterations, self.scale = [], []

    def on_train_batch_end(self, batch, logs=None):
        opt = self.model.optimizer
        self.iterations.append(int(opt.iterations.numpy()))
        scale = getattr(opt, "dynamic_scale", None)
        self.scale.append(None if scale is None else float(scale.numpy()))


def show(label, logdir, findings, iterations, scales):
    """The run's findings and skips, printed (``pytest -rP`` shows them)."""
    print(f"== {label}: skipped {skipped_steps(iterations)}, scales {scales}")
    for f in findings:
        also = f" (also: {', '.join(f.data['also'])})" if f.data.get("also") else ""
        print(f"  {f.severity:7s} {f.rule} [{f.layer}] {f.title}{also}")
    for c in skip_causes(mpwatch.load_run(logdir)):
        print(f"    skip {c.step} at {c.scale}: {c.cause} ({c.detail})")


class Trained:
    """One training run: the model, its history, findings, logdir, and the observer's truth."""

    def __init__(self, mm, name, fixed, logdir, **kwargs):
        self.name, self.fixed, self.logdir = name, fixed, logdir
        observer = Observer()
        keras.backend.clear_session()  # names as in a fresh process: a fresh build's
        self.model, self.history = mm.train(
            name, logdir, fixed=fixed, callbacks=[observer], **kwargs
        )
        self.iterations, self.scales = observer.iterations, observer.scale
        self.findings = mpwatch.diagnose(logdir)
        self.run = mpwatch.load_run(logdir)
        show(
            f"{name}{' (fixed)' if fixed else ''}",
            logdir,
            self.findings,
            self.iterations,
            self.scales,
        )
        self.x, self.y = mm.data(name)
        self.batch = mm.BATCH_SIZES[name]


def _reference_max_grad(rm, mm, t):
    """max |g| of the float32 reference's gradients at the final weights (the last probe's), on
    the probe's batch (the first), by hand; None for a run without a float16 probe."""
    if not len(t.run.probe_model) or mm.POLICIES[t.name] != "mixed_float16":
        return None
    twin = mm.build(t.name, policy="float32")[0]
    grads, _ = rm.float32_reference_gradients(t.model, t.x[: t.batch], t.y[: t.batch], twin=twin)
    return max(float(np.abs(g).max()) for g in grads)


@pytest.fixture(scope="module")
def trained(mm, rm, tmp_path_factory):
    """(name, fixed) -> Trained: each trained once, on demand, on TensorFlow."""
    cache = {}

    def get(name, fixed=False, **kwargs):
        key = (name, fixed)
        if key not in cache:
            logdir = str(tmp_path_factory.mktemp(f"{name}{'_fixed' if fixed else ''}"))
            t = Trained(mm, name, fixed, logdir, **kwargs)
            t.floor = reference_floor(_reference_max_grad(rm, mm, t))
            cache[key] = t
        return cache[key]

    return get


# --- truth helpers -------------------------------------------------------------------------------
def skipped_steps(iterations):
    """The 1-based batches after which the optimizer's iterations did not advance."""
    its = [0, *iterations]
    return [i + 1 for i in range(len(iterations)) if its[i + 1] == its[i]]


def scale_before(scales, step, initial=2.0**15):
    """The loss scale batch ``step`` (1-based) ran at: the one the batch before it left."""
    return initial if step == 1 else scales[step - 2]


def consecutive_from_start(skipped):
    """The consecutive skips the run starts with."""
    out = []
    for i, s in enumerate(skipped):
        if s != i + 1:
            break
        out.append(s)
    return out


def reference_floor(max_grad):
    """Where a sound model's descent ends, from the float32 reference's largest gradient |g| on
    the probe's batch (computed by hand): its gradients overflow float16 (|g| x 2^k >= 2^16, with
    |g| rounded down to a power of two, as the sweep bins it) from 2^k on, and the activation
    gradients of the backward pass run up to 2 bits larger; None without a reference."""
    if max_grad is None or not max_grad > 0:
        return None
    e = math.floor(math.log2(max_grad))
    k = [k for k in range(-8, 41) if e + k >= 16]
    return (2.0 ** k[0] if k else 2.0**41) / 4.0


def descent_of(t, limit=100):
    """The skips mpwatch counts as the scale's descent (skip_causes' definition), applied to the
    optimizer's own record: the consecutive skips the run starts with, and within the first
    ``limit`` steps every skip at a scale lower than any skip before it ran at; where the float32
    reference is known (``t.floor``), only those at a scale it overflows at too."""
    skipped = skipped_steps(t.iterations)
    start = consecutive_from_start(skipped)
    floor = getattr(t, "floor", None)
    out, low = [], math.inf
    for s in skipped:
        scale = scale_before(t.scales, s)
        if (s in start or (s <= limit and scale < low)) and (floor is None or scale >= floor):
            out.append(s)
        low = min(low, scale)
    return out


def on_cpu_only():
    """No GPU anywhere: what TensorFlow and (when installed) JAX see."""
    if tf.config.list_physical_devices("GPU"):
        return False
    try:
        import jax

        return all(d.platform == "cpu" for d in jax.devices())
    except ImportError:
        return True


def _text(f):
    return "\n".join([f.title, f.evidence, f.fix])


def _rules_named(f):
    """The rule ids a finding's words name."""
    return {r for r in RULE_IDS if re.search(rf"(?<![\w-]){re.escape(r)}(?![\w-])", _text(f))}


def assert_no_pointer_to_absent_findings(findings):
    """No finding names a rule that is not in the list, unless it folded that rule's finding in
    as its own evidence (``data["also"]``); no 'see the ... findings' pointer to absent ones."""
    present = {f.rule for f in findings}
    for f in findings:
        folded = set(f.data.get("also") or [])
        named = _rules_named(f) - {f.rule}
        assert named <= present | folded, (f.rule, named - present - folded, _text(f))
        for m in re.finditer(r"the ([\w-]+) findings?", _text(f)):
            assert m.group(1) in present, (f.rule, m.group(0))


def percent_in(text):
    """The first percentage written in ``text``, as a fraction."""
    m = re.search(r"(\d+(?:\.\d+)?)%", text)
    assert m, text
    return float(m.group(1)) / 100.0


def layer_classes(model):
    return {ly.name: type(ly).__name__ for ly in model._flatten_layers(include_self=False)}


def output_dtype(mm, policy_name, model, x):
    """The dtype of the model's output on two samples, under its policy (the truth)."""
    with mm.policy_scope(policy_name):
        return keras.backend.standardize_dtype(model(x[:2]).dtype)


FLOAT16_INPUT_ADVICE = re.compile(
    r'Input\([^)]*dtype="float16"|feed (?:it |them )?(?:as )?float16|float16 inputs', re.I
)


def check_output_16bit(f, model, mm, t, *, activation, application=None):
    """An output-16bit finding: the layer is the model's output, computes in 16 bits, has this
    activation; the fix applies *that* activation in float32 (never another)."""
    layer = mm.output_layer(model)
    assert f.layer == layer.name
    assert layer.compute_dtype in ("float16", "bfloat16")
    assert output_dtype(mm, mm.POLICIES[t.name], model, t.x) == layer.compute_dtype
    _check_output_severity(f, model, t, layer.compute_dtype)
    assert layer.activation.__name__ == activation == f.data["activation"]
    assert f"({activation}, width {layer.units})" in f.evidence
    assert re.search(rf'Activation\(\s*"{activation}", dtype="float32"', f.fix), f.fix
    other = {"softmax": "sigmoid", "sigmoid": "softmax"}[activation]
    assert other not in f.fix
    if application:
        assert f.data["application"] == application
        assert f"keras.applications.{application}(..., classifier_activation=None)" in f.fix
        assert "keras.Model(model.input, outputs)" in f.fix
    else:
        assert f.data["application"] is None
        assert f'Dense({layer.units}, ..., activation=None, name="{layer.name}_logits")' in f.fix


def _check_output_severity(f, model, t, dtype):
    """Severity from the measured effect (issue 50): info only where harm is not measured,
    checked here independently: no step skipped (the optimizer's iterations) and, on the first
    batch with the final weights, the 16-bit model's loss within 1% of a float32 twin's (the rule
    reads its probe's batch at the probe's step against 0.1%); else error (float16) or warning
    (bfloat16)."""
    if f.severity != "info":
        assert f.severity == ("error" if dtype == "float16" else "warning")
        return
    mm = load_script("examples/more_models.py")
    twin = mm.build(t.name, policy="float32")[0]  # the same model built under float32
    twin.set_weights(model.get_weights())
    xb, yb = t.x[: t.batch], t.y[: t.batch]
    loss16 = float(model.evaluate(xb, yb, batch_size=len(xb), verbose=0, return_dict=True)["loss"])
    loss32 = float(twin.evaluate(xb, yb, batch_size=len(xb), verbose=0, return_dict=True)["loss"])
    assert abs(loss16 - loss32) / abs(loss32) < 0.01, (loss16, loss32)
    assert skipped_steps(t.iterations) == []
    assert "no measurable harm yet" in f.evidence


def check_no_tensor_cores(f, t):
    assert on_cpu_only()  # truth: this machine has no GPU at all
    assert "device CPU" in f.evidence
    policy = mpwatch.load_run(t.logdir).info.get("policy")
    assert f"{policy} on a CPU" in f.title


def check_float32_inside(f, model, cls):
    """The layers named are exactly the model's layers of class ``cls``, computing in 16 bits."""
    truth = sorted(n for n, c in layer_classes(model).items() if c == cls)
    assert sorted(f.data["layers"]) == truth
    assert f.data["by_class"] == {cls: len(truth)}
    assert f.title.startswith(f"{len(truth)} {cls} layers")
    for name in truth:
        assert model.get_layer(name).compute_dtype in ("float16", "bfloat16")
    # "return float16" (or bfloat16): the first of them, called on a 16-bit tensor of its shape;
    # and its float32 math, by hand, rounds to what it returns (Keras upcasts inside)
    layer = model.get_layer(truth[0])
    dtype = layer.compute_dtype
    shape = [2 if d is None else d for d in layer.input.shape]
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    y = layer(keras.ops.cast(x, dtype), training=False)
    assert keras.backend.standardize_dtype(y.dtype) == dtype
    x16 = np.asarray(keras.ops.cast(keras.ops.cast(x, dtype), "float32"))
    gamma = np.asarray(layer.gamma, np.float32)
    beta = np.asarray(layer.beta, np.float32)
    if cls == "BatchNormalization":
        mean = np.asarray(layer.moving_mean, np.float32)
        var = np.asarray(layer.moving_variance, np.float32)
    else:
        mean = x16.mean(axis=-1, keepdims=True)
        var = x16.var(axis=-1, keepdims=True)
    want = (x16 - mean) / np.sqrt(var + np.float32(layer.epsilon)) * gamma + beta
    got = np.asarray(keras.ops.cast(y, "float32"))
    np.testing.assert_allclose(got, want, rtol=2.0**-7, atol=2.0**-7)


def check_tensor_core_alignment(f, model):
    """A width the user may change, not a multiple of 8, and the next multiple of 8 proposed; a
    keras.applications model's own widths (every layer named really has that width, not a
    multiple of 8): one info naming the application, nothing to change."""
    if "application" in f.data:
        assert (
            f.severity == "info"
            and f.layer is None
            and model.name.startswith(f.data["application"].lower())
        )
        for name, dims in f.data["layers"].items():
            for dim, value in dims.items():
                assert getattr(model.get_layer(name), dim) == value and value % 8 != 0
        assert f.fix.startswith("# nothing to change")
        return
    layer = model.get_layer(f.layer)
    ((dim, value),) = f.data["dims"].items()
    assert getattr(layer, dim) == value and value % 8 != 0
    assert f"{dim}={value} -> {-(-value // 8) * 8}" in f.evidence
    assert layer is not model.layers[-1]  # never a class count


def check_skip_numbers(f, t):
    """A skipped-steps finding's data: every count against the optimizer's own record."""
    skipped = skipped_steps(t.iterations)
    early = descent_of(t)
    after = len(t.iterations) - (early[-1] if early else 0)
    judged = [s for s in skipped if s not in early]
    assert f.data["total"] == len(skipped)
    assert f.data["early"] == len(early)
    assert f.data["steps"] == after and f.data["skipped"] == len(judged)
    assert f.data["rate"] == pytest.approx(len(judged) / after if after else 0.0)
    assert sorted(sum(f.data["by_cause"].values(), [])) == skipped
    return skipped, early, judged


def check_skip_title(title, t):
    """A skipped-steps title against the optimizer's record: the skips after the descent and
    the steps after it, or the descent's length and the scale it ended at."""
    skipped = skipped_steps(t.iterations)
    early = descent_of(t)
    m = re.fullmatch(r"(\d+) steps skipped before the first finite step", title)
    if m:
        assert int(m.group(1)) == len(consecutive_from_start(skipped))
        return
    m = re.fullmatch(
        r"(\d+) steps skipped while the loss scale fell from 2\^15 \(32768\) to (.+)", title
    )
    if m:
        n = int(m.group(1))
        assert n == len(early)
        low = t.scales[early[-1] - 1]  # the optimizer's scale after the last of them
        assert low == 2.0**15 / 2.0**n and m.group(2) == words.loss_scale(low)
        return
    judged = [s for s in skipped if s not in early]
    after = len(t.iterations) - (early[-1] if early else 0)
    m = re.fullmatch(r"(\d+) of (\d+) steps skipped for non-finite gradients \((.+)\)", title)
    assert m, title
    assert (int(m.group(1)), int(m.group(2))) == (len(judged), after)
    assert percent_in(m.group(3)) == pytest.approx(len(judged) / after, abs=5e-4)


def check_folded_skip_titles(findings, t):
    """The skipped-steps titles folded into other findings, against the optimizer's record."""
    for f in findings:
        for rule, title in f.data.get("also_titles") or []:
            if rule == "skipped-steps":
                check_skip_title(title, t)


def check_float8(f, counts, outputs):
    """float8-readiness (info) against the model: ``counts`` of its Keras Dense and EinsumDense
    layers by class; ``outputs`` the names of the layers producing its outputs. Every such layer
    is listed once (ready, not ready, or kept out as an output) and the output layers are the
    ones kept out."""
    ready, kept, not_ready = f.data["ready"], f.data["kept_out"], list(f.data["not_ready"])
    assert f.severity == "info"
    listed = ready + kept + not_ready  # mpwatch's layer paths: unique where names repeat
    total = sum(counts.get(c, 0) for c in ("Dense", "EinsumDense"))
    assert len(listed) == len(set(listed)) == total
    assert {p.rsplit("/", 1)[-1] for p in kept} <= set(outputs)
    assert not {p.rsplit("/", 1)[-1] for p in ready} & set(outputs)
    assert f.title.startswith(f"float8: {len(ready)} of {len(listed)} ")


def _float8_facts(model):
    """(Keras Dense/EinsumDense counts by class, output layer names) of a model, counted here."""
    counts: dict[str, int] = {}
    for layer in model._flatten_layers(include_self=False, recursive=True):
        cls = type(layer)
        if cls.__name__ in ("Dense", "EinsumDense") and cls.__module__.startswith("keras."):
            counts[cls.__name__] = counts.get(cls.__name__, 0) + 1
    outputs = {t._keras_history[0].name for t in getattr(model, "outputs", None) or []}
    return counts, outputs


def check_every_finding(t, mm, checks):
    """Run ``checks[rule](finding)`` on every finding; a finding of a rule without a check fails.
    float8-readiness (an opportunity every model with Dense layers gets) is checked against the
    model by :func:`check_float8` unless ``checks`` has its own."""
    assert_no_pointer_to_absent_findings(t.findings)
    check_folded_skip_titles(t.findings, t)
    if "float8-readiness" not in checks and getattr(t, "model", None) is not None:
        checks = {**checks, "float8-readiness": lambda f: check_float8(f, *_float8_facts(t.model))}
    unchecked = [(f.rule, f.title) for f in t.findings if f.rule not in checks]
    assert unchecked == [], unchecked
    for f in t.findings:
        checks[f.rule](f)


# --- EfficientNetB0 ------------------------------------------------------------------------------
def test_efficientnet_b0_float16_softmax_named_and_fixed(mm, rm, trained):
    t = trained("efficientnet_b0")
    model = t.model
    skipped = skipped_steps(t.iterations)
    early = descent_of(t)

    def output16(f):
        check_output_16bit(f, model, mm, t, activation="softmax", application="EfficientNetB0")
        # its evidence: the probe's check on its batch, re-done here by hand at the last probe's
        # weights (the model's final ones) and scale: as it is, the train step's scaled
        # gradients are not finite; with the fix applied (the same weights in the fixed model)
        # they are, and nothing is lost that the float32 reference keeps
        m = re.search(r"checked on step (\d+)'s batch", f.evidence)
        assert m and int(m.group(1)) == len(t.iterations)
        scale = t.scales[-1]
        assert "as it is, the scaled gradients are not finite" in f.evidence
        assert "keeping 'predictions' float32: finite" in f.evidence
        x0, y0 = t.x[: t.batch], t.y[: t.batch]
        with rm.policy_scope("mixed_float16"):
            grads, _ = rm.train_mode_gradients(model, x0, y0, scale)
            fixed_model = mm.build("efficientnet_b0", fixed=True)[0]
        assert not all(np.isfinite(g).all() for g in grads)
        # the first non-finite gradient in backprop order: the classifier's own
        kernel = model.get_layer("predictions").kernel
        i = next(i for i, v in enumerate(model.trainable_variables) if v is kernel)
        assert not np.isfinite(grads[i]).all()
        fixed_model.set_weights(model.get_weights())
        with rm.policy_scope("mixed_float16"):
            fixed_grads, _ = rm.train_mode_gradients(fixed_model, x0, y0, scale)
        assert all(np.isfinite(g).all() for g in fixed_grads)
        # "16-bit activations peak at N (M as it is)": M, the largest |16-bit layer output| of
        # the pass as it is, by hand
        peak = re.search(r"peak at [\d.]+ \(([\d.]+) as it is\)", f.evidence)
        if peak:
            assert _peak_16bit(rm, model, x0) == pytest.approx(float(peak.group(1)), rel=0.05)
        # what it folded in is true: the overflow, the scale that fell to 1 or below, the skips
        assert {"activation-overflow", "skipped-steps"} <= set(f.data["also"])
        titles = dict(f.data["also_titles"])
        if "loss-scale" in titles:  # "Loss scale stuck at 1": the optimizer's own scale
            stuck = re.search(r"stuck at ([\d.]+)", titles["loss-scale"])
            assert stuck and min(t.scales[-5:]) <= float(stuck.group(1)) <= max(t.scales[-5:])
        check_skip_title(titles["skipped-steps"], t)

    check_every_finding(
        t,
        mm,
        {
            "output-16bit": output16,
            "no-tensor-cores": lambda f: check_no_tensor_cores(f, t),
            "float32-inside": lambda f: check_float32_inside(f, model, "BatchNormalization"),
            "tensor-core-alignment": lambda f: check_tensor_core_alignment(f, model),
        },
    )
    (out16,) = [f for f in t.findings if f.rule == "output-16bit"]
    # the skips after the descent are the float16 softmax's: each attributed to it
    causes = skip_causes(t.run)
    assert [c.step for c in causes] == skipped  # mpwatch's steps are the optimizer's
    later = [c for c in causes if c.step not in early]
    assert all(c.cause == "model_overflow" and "'predictions'" in c.detail for c in later)
    assert [f for f in t.findings if f.rule == "skipped-steps"] == []  # folded into its cause
    assert out16.data["also"].count("skipped-steps") == 1

    # the fix, applied as written and retrained (without the probe, whose traces cost as much as
    # the fit's own): a float32 output, the finding gone, fewer skips, and none after the descent
    # at a scale lower than the original run's, where the float16 softmax overflowed
    fx = trained("efficientnet_b0", fixed=True, probe=False)
    assert mm.output_layer(fx.model).compute_dtype == "float32"
    assert output_dtype(mm, "mixed_float16", fx.model, fx.x) == "float32"
    assert [f for f in fx.findings if f.rule == "output-16bit"] == []
    fixed_skipped = skipped_steps(fx.iterations)
    assert len(fixed_skipped) < len(skipped)
    # the scales the float16 softmax overflowed at after the descent (or at its end) now hold:
    # the fixed model stepped at one at least as large (a scale that fits, fits below it too)
    low = [scale_before(t.scales, s) for s in skipped if s not in early] or [min(t.scales)]
    stepped = [scale_before(fx.scales, s) for s in range(1, len(fx.iterations) + 1)
               if s not in fixed_skipped]  # fmt: skip
    assert max(stepped) >= max(low)

    def fixed_skips(f):
        check_skip_title(f.title, fx)
        sk, ea, judged = check_skip_numbers(f, fx)
        for s in judged:  # "at a scale that had worked": a batch before it stepped at that scale
            if s in f.data["by_cause"]["unexplained"]:
                sc = scale_before(fx.scales, s)
                assert any(scale_before(fx.scales, b) == sc and b not in sk for b in range(1, s)), s

    check_every_finding(
        fx,
        mm,
        {
            "no-tensor-cores": lambda f: check_no_tensor_cores(f, fx),
            "float32-inside": lambda f: check_float32_inside(f, fx.model, "BatchNormalization"),
            "tensor-core-alignment": lambda f: check_tensor_core_alignment(f, fx.model),
            "skipped-steps": fixed_skips,
        },
    )


def _inputs_of(layer):
    """The names of the layers whose outputs feed ``layer`` in its (first) Functional node."""
    return [kt._keras_history[0].name for kt in layer._inbound_nodes[0].input_tensors]


def _peak_16bit(rm, model, x):
    """The largest |output| of the model's layers whose output is 16-bit, training mode, Dropout
    off (the probe's pass), by hand."""
    layers = [ly for ly in model.layers if not isinstance(ly, keras.layers.InputLayer)]
    tap = keras.Model(model.inputs, [ly.output for ly in layers])
    with rm.dropout_off(model), rm.state_kept(model), rm.policy_scope("mixed_float16"):
        outs = tap(x, training=True)
    return max(
        float(np.abs(np.asarray(o, np.float32)).max())
        for o in outs
        if keras.backend.standardize_dtype(o.dtype) in ("float16", "bfloat16")
    )


def _relative_errors(mm, rm, t, names):
    """Each named layer's output relative error, float16 against a float32 twin with the same
    weights, on the probe's batch (the first), training mode, Dropout off: by hand."""
    model = t.model
    twin = mm.build(t.name, policy="float32")[0]
    twin.set_weights(model.get_weights())
    x0 = t.x[: t.batch]
    outs = []
    for m in (model, twin):
        tap = keras.Model(m.inputs, [m.get_layer(n).output for n in names])
        with rm.dropout_off(m), rm.state_kept(m):
            outs.append([np.asarray(a, np.float64) for a in tap(x0, training=True)])
    return {n: float(np.linalg.norm(a - b) / np.linalg.norm(b)) for n, a, b in zip(names, *outs)}


def test_efficientnet_b0_squeeze_excite_multiply_never_advised(mm, rm, trained):
    t = trained("efficientnet_b0")
    multiplies = [ly for ly in t.model.layers if type(ly).__name__ == "Multiply"]
    assert len(multiplies) == 16  # one per MBConv block's squeeze-excite
    feeds = {ly.name: _inputs_of(ly) for ly in multiplies}
    names = list(dict.fromkeys([n for m, ins in feeds.items() for n in (m, *ins)]))
    err = _relative_errors(mm, rm, t, names)
    # truth: each Multiply's float16 error is about what its inputs bring; none makes it grow
    # output-rel-error's 2x (so none is a cause), though several are over its 1% threshold
    grows = {m: err[m] / max(err[n] for n in ins) for m, ins in feeds.items()}
    assert max(grows.values()) < 2.0, grows
    # mpwatch measured the same errors (its probe at the last step, on the same batch)
    probe = t.run.latest_probe()
    recorded = dict(zip(probe.layers["layer"], probe.layers["output_rel_error"]))
    for m in feeds:
        assert recorded[m] == pytest.approx(err[m], rel=0.25, abs=1e-3), m
    advised = [f for f in t.findings if f.layer in feeds]
    assert advised == [], [(f.rule, f.layer) for f in advised]
    assert [f for f in t.findings if f.rule == "output-rel-error"] == []
    # only the output is advised float32
    keep = [f.layer for f in t.findings if f.action.get("dtype") == "float32"]
    assert keep == ["predictions"]


def test_efficientnet_b0_skips_of_the_float16_softmax_are_not_called_descent(trained):
    """The descent mpwatch names ends where the float32 reference's gradients fit (its sweep):
    no longer than the same model's descent with its softmax in float32 (the fixed model, a
    run of its own: within one halving, the sweep's 2-bit margin for activation gradients is an
    estimate), where calling every skip from step 1 on the descent gave 16 against 7."""
    t = trained("efficientnet_b0")
    fx = trained("efficientnet_b0", fixed=True, probe=False)
    called_descent = [c for c in skip_causes(t.run) if c.cause == "descent"]
    assert len(called_descent) <= len(descent_of(fx)) + 1
    rest = [c for c in skip_causes(t.run) if c.cause != "descent"]
    assert rest and all(c.cause == "model_overflow" and "'predictions'" in c.detail for c in rest)


# --- ViT on TensorFlow ---------------------------------------------------------------------------
def _vit_checks(t, mm, model):
    return {
        "output-16bit": lambda f: check_output_16bit(f, model, mm, t, activation="softmax"),
        "no-tensor-cores": lambda f: check_no_tensor_cores(f, t),
        "float32-inside": lambda f: check_float32_inside(f, model, "LayerNormalization"),
        "skipped-steps": lambda f: (check_skip_title(f.title, t), check_skip_numbers(f, t)),
    }


def test_vit_tensorflow_float16_softmax_named_and_fixed(mm, trained):
    t = trained("vit")
    check_every_finding(t, mm, _vit_checks(t, mm, t.model))
    (out16,) = [f for f in t.findings if f.rule == "output-16bit"]
    assert out16.layer == t.model.layers[-1].name
    skipped = skipped_steps(t.iterations)
    assert skipped  # the float16 softmax makes steps skip
    # mpwatch's skipped steps are the optimizer's
    assert [c.step for c in skip_causes(t.run)] == skipped
    # the fix, applied as written (Dense(10, activation=None) then a float32 softmax) and
    # retrained: float32 output, the finding gone, and not one step skipped
    fx = trained("vit", fixed=True)
    assert mm.output_layer(fx.model).compute_dtype == "float32"
    assert output_dtype(mm, "mixed_float16", fx.model, fx.x) == "float32"
    assert [f for f in fx.findings if f.rule == "output-16bit"] == []
    assert skipped_steps(fx.iterations) == []
    assert fx.scales[-1] == 2.0**15
    check_every_finding(
        fx,
        mm,
        {
            "no-tensor-cores": lambda f: check_no_tensor_cores(f, fx),
            "float32-inside": lambda f: check_float32_inside(f, fx.model, "LayerNormalization"),
        },
    )


def _dropout_on_gradients(rm, model, x, y, scale):
    """The scaled gradients as Keras' train step computes them, Dropout active (one draw)."""
    with rm.state_kept(model):
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            loss = model.compute_loss(x=x, y=y, y_pred=y_pred, training=True)
            scaled = tf.cast(loss, tf.float32) * scale
        grads = tape.gradient(scaled, model.trainable_variables)
    return [np.asarray(tf.cast(tf.convert_to_tensor(g), tf.float32)) for g in grads]


def _excess(mixed, reference, scale):
    """Median over variables of log2(max |scaled gradient| / (scale x max |reference|)): 0 when
    the gradients are the reference's times the scale (the loss scaled once)."""
    r = [
        math.log2(np.abs(m).max() / (scale * np.abs(g).max()))
        for m, g in zip(mixed, reference)
        if np.abs(g).max() > 0 and np.isfinite(m).all() and np.abs(m).max() > 0
    ]
    return float(np.median(r))


def test_vit_builtin_train_step_scales_the_loss_once(rm, mm, trained):
    """Truth for the train-step finding the ViT gets: Keras' built-in train step scales the loss
    once. On the same batch, Dropout off, its scaled gradients are the float32 reference's times
    the scale; what lifts mpwatch's comparison (the gradients the optimizer received on training
    batches against the probe batch's reference) is Dropout, active in the train step only."""
    t = trained("vit")
    scale = t.scales[-1]
    twin = mm.build("vit", policy="float32")[0]
    b, n = t.batch, len(t.iterations)
    x0, y0 = t.x[:b], t.y[:b]
    ref0, _ = rm.float32_reference_gradients(t.model, x0, y0, twin=twin)
    same_batch, dropout_on = [], []
    for step in (n - 2, n - 1, n):
        xb, yb = t.x[(step - 1) * b : step * b], t.y[(step - 1) * b : step * b]
        with rm.policy_scope("mixed_float16"):
            mixed, _ = rm.train_mode_gradients(t.model, xb, yb, scale)
            on = _dropout_on_gradients(rm, t.model, xb, yb, scale)
        ref, _ = rm.float32_reference_gradients(t.model, xb, yb, twin=twin)
        same_batch.append(_excess(mixed, ref, scale))
        dropout_on.append(_excess(on, ref0, scale))
    assert max(abs(e) for e in same_batch) < 0.25, same_batch  # scaled once, exactly
    assert min(dropout_on) > 1.0, dropout_on  # Dropout's doubled activations, not a 2nd scale
    for f in [f for f in t.findings if f.rule == "train-step"]:
        # what mpwatch compared: about the Dropout-on excess, far from log2 S more
        assert f.data["cause"] == "loss_scaled_twice" and f.data["loss_scale"] == scale
        excess = f.data["log2_ratio"] - math.log2(scale)
        assert abs(excess - float(np.median(dropout_on))) < 2.0
        assert excess < 0.75 * math.log2(scale)  # a 2nd scale would add log2 S = 4 bits
    # the same model and train step with the float32 softmax keeps 2^15: no such finding
    fx = trained("vit", fixed=True)
    assert fx.scales[-1] == 2.0**15
    assert [f for f in fx.findings if f.rule == "train-step"] == []


def test_vit_builtin_train_step_is_not_called_double_scaling(trained):
    """Keras' own train step scales the loss once (test_vit_builtin_train_step_scales_the_loss_once
    is the truth): train-step compares each probe's received gradients with its reference at
    that probe's own scale, the excess over the scale, so Dropout's 2^2 is no second scale."""
    t = trained("vit")
    assert [f for f in t.findings if f.rule == "train-step"] == []


def test_vit_skips_attributed_to_the_float16_softmax(rm, trained):
    """The ViT's skips (every one: the fixed model skips none) are its float16 softmax's: the
    probe's own pass, Dropout off, stays finite; its pass as the train step runs it, Dropout on,
    at the scale the skips began at, overflows, and is finite with the output in float32."""
    t = trained("vit")
    fixed = trained("vit", fixed=True)
    assert skipped_steps(t.iterations) and skipped_steps(fixed.iterations) == []
    # truth, by hand: Dropout on (as the train step runs), the probe's batch at 2^15 is not
    # finite; Dropout off it is (the probe's own pass)
    xb, yb = t.x[: t.batch], t.y[: t.batch]
    with rm.policy_scope("mixed_float16"):
        on = _dropout_on_gradients(rm, t.model, xb, yb, 2.0**15)
    assert not all(np.isfinite(g).all() for g in on)
    out = t.model.layers[-1].name
    causes = skip_causes(t.run)
    assert all(c.cause == "model_overflow" and f"'{out}'" in c.detail for c in causes)
    (out16,) = [f for f in t.findings if f.rule == "output-16bit"]
    assert "skipped-steps" in out16.data.get("also", [])


# --- ViT on JAX ----------------------------------------------------------------------------------
def test_vit_jax_findings_true_and_of_the_same_kind_as_tensorflow(mm, trained, jax_truth):
    jt = jax_truth["vit"]
    findings = mpwatch.diagnose(jt["logdir"])
    show("vit (jax)", jt["logdir"], findings, jt["iterations"], jt["scale"])
    run = mpwatch.load_run(jt["logdir"])
    assert run.info["backend"] == "jax"
    assert_no_pointer_to_absent_findings(findings)
    skipped = skipped_steps(jt["iterations"])
    assert jt["batches"] == mm.STEPS["vit"] and skipped
    assert [c.step for c in skip_causes(run)] == skipped
    record = SimpleNamespace(
        iterations=jt["iterations"], scales=jt["scale"], floor=reference_floor(jt["ref_max_grad"])
    )
    check_folded_skip_titles(findings, record)
    for f in findings:
        if f.rule == "output-16bit":
            assert f.layer == jt["output_layer"] and jt["output_dtype"] == "float16"
            assert jt["output_activation"] == "softmax" == f.data["activation"]
            assert re.search(r'Activation\(\s*"softmax", dtype="float32"', f.fix)
            assert "sigmoid" not in f.fix
        elif f.rule == "no-tensor-cores":
            assert on_cpu_only() and "mixed_float16 on a CPU" in f.title
        elif f.rule == "float32-inside":
            n = jt["classes"]["LayerNormalization"]
            assert f.data["by_class"] == {"LayerNormalization": n} and len(f.data["layers"]) == n
        elif f.rule == "skipped-steps":
            check_skip_title(f.title, record)
            check_skip_numbers(f, record)
        elif f.rule == "float8-readiness":
            check_float8(f, jt["classes"], {jt["output_layer"]})
        else:
            pytest.fail(f"unchecked finding {f.rule}: {f.title}")
    # the two backends agree in kind: the same rules, severities and layers (by role)
    t = trained("vit")

    def kinds(fs, out):
        return sorted(
            (
                f.rule,
                f.severity,
                "output" if f.layer == out else f.layer,
                tuple(f.data.get("also", [])),
            )
            for f in fs
        )

    assert kinds(findings, jt["output_layer"]) == kinds(t.findings, t.model.layers[-1].name)


# --- the keras.io Bidirectional LSTM -------------------------------------------------------------
def test_bilstm_sigmoid_output_fix_is_a_float32_sigmoid(mm, trained):
    t = trained("bilstm", profile=True)
    model = t.model
    assert model.inputs[0].dtype == "int32"  # the ids stay integers

    def profile(f):
        # Cast time against the profiled time, as written; never "feed float16 ids"
        m = re.search(r"Cast ops ([\d.]+) ms of ([\d.]+) ms", f.evidence)
        assert m and float(m.group(1)) / float(m.group(2)) == pytest.approx(
            f.data["cast_share"], rel=0.01
        )
        assert percent_in(f.title) == pytest.approx(f.data["cast_share"], abs=5e-4)
        assert f"the integer ids ('{model.layers[0].name}') stay int32" in f.fix

    check_every_finding(
        t,
        mm,
        {
            "output-16bit": lambda f: check_output_16bit(f, model, mm, t, activation="sigmoid"),
            "no-tensor-cores": lambda f: check_no_tensor_cores(f, t),
            "profile": profile,
        },
    )
    (out16,) = [f for f in t.findings if f.rule == "output-16bit"]
    assert "softmax" not in out16.fix and "softmax" not in out16.evidence
    assert not [f.rule for f in t.findings if FLOAT16_INPUT_ADVICE.search(_text(f))]
    assert skipped_steps(t.iterations) == []  # nothing skipped, and nothing said about skips
    # the fix, applied and retrained: a float32 sigmoid output, the finding gone
    fx = trained("bilstm", fixed=True)
    layer = mm.output_layer(fx.model)
    assert layer.compute_dtype == "float32" and layer.activation.__name__ == "sigmoid"
    assert output_dtype(mm, "mixed_float16", fx.model, fx.x) == "float32"
    assert [f for f in fx.findings if f.rule == "output-16bit"] == []
    check_every_finding(fx, mm, {"no-tensor-cores": lambda f: check_no_tensor_cores(f, fx)})


# --- MobileNetV2 under mixed_bfloat16 on JAX -----------------------------------------------------
FLOAT16_WORDS = re.compile(r"(?<![bB])float16|subnormal|65504|loss scale|underflow", re.I)


def test_mobilenet_v2_bfloat16_jax_no_float16_measure(jax_truth):
    jt = jax_truth["mobilenet_v2_bf16"]
    findings = mpwatch.diagnose(jt["logdir"])
    show("mobilenet_v2_bf16 (jax)", jt["logdir"], findings, jt["iterations"], jt["scale"])
    run = mpwatch.load_run(jt["logdir"])
    assert run.info["backend"] == "jax" and run.info["policy"] == "mixed_bfloat16"
    assert not jt["loss_scale_optimizer"] and set(jt["scale"]) == {None}  # truth: no scale
    assert skipped_steps(jt["iterations"]) == []
    assert_no_pointer_to_absent_findings(findings)
    said = [_text(f) for f in findings if FLOAT16_WORDS.search(_text(f).replace("bfloat16", ""))]
    assert said == []
    for f in findings:
        if f.rule == "output-16bit":
            assert f.layer == jt["output_layer"] == "predictions"
            assert jt["output_dtype"] == jt["output_compute_dtype"] == "bfloat16"
            assert f.severity == "warning" and f.data["application"] == "MobileNetV2"
            assert "keras.applications.MobileNetV2(..., classifier_activation=None)" in f.fix
            assert 'Activation("softmax", dtype="float32")' in f.fix
        elif f.rule == "float32-inside":
            assert f.data["by_class"] == {"BatchNormalization": jt["classes"]["BatchNormalization"]}
            assert "return bfloat16" in f.evidence
        elif f.rule == "no-tensor-cores":
            assert on_cpu_only() and "mixed_bfloat16 on a CPU" in f.title
        elif f.rule == "float8-readiness":
            check_float8(f, jt["classes"], {jt["output_layer"]})
        else:
            pytest.fail(f"unchecked finding {f.rule}: {f.title}")
    assert {f.rule for f in findings} >= {"output-16bit"}
    # the fix, applied and retrained on JAX: a float32 output, the finding gone
    fx = jax_truth["mobilenet_v2_bf16:fixed"]
    assert fx["output_dtype"] == fx["output_compute_dtype"] == "float32"
    fixed_findings = mpwatch.diagnose(fx["logdir"])
    show(
        "mobilenet_v2_bf16 (jax, fixed)",
        fx["logdir"],
        fixed_findings,
        fx["iterations"],
        fx["scale"],
    )
    assert [f for f in fixed_findings if f.rule == "output-16bit"] == []
    assert not [f for f in fixed_findings if FLOAT16_WORDS.search(_text(f).replace("bfloat16", ""))]


# --- every fix: printed and applied alike, both retrained with the problem gone ----------------
#: findings of the model's structure (a layer's dtype, the device): a short fit shows them gone
STRUCTURAL = {"output-16bit", "no-tensor-cores"}


@pytest.mark.parametrize("name", ["efficientnet_b0", "vit", "bilstm"])
def test_every_fix_printed_and_applied_alike(mm, trained, name):
    """Each model-changing finding on TensorFlow: its printed code done on a fresh model
    (printed_fix, which reads only the text) and apply_recommendations give the same layer
    policies and optimizer; both retrain without the finding (1 step without a probe for a
    finding of the model's structure: it shows in the layers' record)."""
    t = trained(name)

    def retrain(model, f, label):
        short = {"steps": 1, "probe": False, "log_every": 1} if f.rule in STRUCTURAL else {}
        mm.train(name, f"{t.logdir}_{label}", model=model, **short)
        return f"{t.logdir}_{label}"

    build = lambda policy: mm.build(name, policy=policy)[0]  # noqa: E731
    def retrained(f):  # EfficientNet's fixes are test_real_models' MobileNetV2's; the
        if name == "efficientnet_b0":  # device's float32 is one fix: retrained on the BiLSTM
            return False
        return f.rule != "no-tensor-cores" or name == "bilstm"

    checked = every_fix_alike(t.findings, build, retrain, retrained)
    assert [c for c in checked if c["left"]] == []


@pytest.mark.parametrize("name", ["vit", "mobilenet_v2_bf16"])
def test_every_fix_printed_and_applied_alike_on_jax(jax_truth, name):
    """The same on Keras' JAX backend, in the JAX process (more_models_jax.fixes_alike: the
    printed and applied models asserted alike there, then each retrained)."""
    fixes = jax_truth[name]["fixes"]
    assert fixes, name
    assert {f["how"] for f in fixes} == {"printed", "applied"}
    assert [f for f in fixes if f["left"]] == []


# --- the pre-flight (issue 53) against the fit's first steps ------------------------------------
@pytest.mark.parametrize("name", ["vit", "bilstm", "efficientnet_b0"])
def test_preflight_predicts_the_fits_first_skips(mm, rm, trained, tmp_path, name):
    """The pre-flight of the model as its fit built it (same seed: the fit's first weights), on
    the fit's first batch: whether the first step is skipped, and how many the fit skips before
    its first applied step, against the optimizer's own iterations after every batch (Observer);
    the change it recommends checked (recorded again, its problems gone), then applied and
    trained on the fit's first batches (preflown.check_the_change)."""
    t = trained(name)
    fresh, x, y = mm.build(name)
    policy = mm.POLICIES[name]
    report = mpwatch.preflight(fresh, (x[: t.batch], y[: t.batch]), policies=(policy,),
                               log_dir=str(tmp_path))  # fmt: skip
    (c,) = report.candidates
    p = c.predictions
    # the first step skipped as the fit's was (ViT: through its own Dropout masks, which the
    # train step's pass of the pre-flight runs on, a few draws)
    assert p["skips"] == (t.iterations[0] == 0), (p, t.iterations[:5])
    first = len(consecutive_from_start(skipped_steps(t.iterations)))
    if p.get("skipped_steps"):
        fewest, most = p["skipped_steps"]
        assert fewest <= first <= most, (p, t.iterations[:20])
    if p["random_layers_off"]:  # the probe's own pass, random layers off, against plain
        # TensorFlow's gradients at 2^15 with Dropout off
        with rm.dropout_off(fresh), rm.policy_scope(policy):
            grads, _ = rm.train_mode_gradients(fresh, x[: t.batch], y[: t.batch], 2.0**15)
        off = not all(np.isfinite(g).all() for g in grads)
        assert (p["first_nonfinite_layer"] is not None) == off, p
        if p["train_step_pass_finite"] is False and not off:
            assert "random masks can overflow" in report.render("text")
    assert c.verdict != "not measured"
    if c.checked is not None:
        code = {g.rule for g in c.code_changes}
        assert [f for f in c.checked.problems if f.rule not in code] == []
    if c.checked is not None and c.changes_model:  # the change applied, and a short fit with it
        check_the_change(c, fit_with_the_change(fresh, report, x, y, t.batch, steps_for(c)))
    check_same_causes(c, t.findings)


@pytest.mark.parametrize("name", ["vit", "mobilenet_v2_bf16"])
def test_preflight_on_jax_predicts_the_fits_first_skips(jax_truth, name):
    """On Keras' JAX backend (more_models_jax.preflight_of, before the fit, the fit's first
    weights and batch): the first step skipped as the optimizer's own iterations say (a
    LossScaleOptimizer under mixed_float16; none under mixed_bfloat16, whose steps all apply),
    the skips before the first applied step within the predicted range, and the causes the JAX
    fit's diagnosis names for its output asked before it."""
    jt = jax_truth[name]
    pre = jt["preflight"]
    assert pre["verdict"] != "not measured", pre["reason"]
    p, its = pre["predictions"], jt["iterations"]
    first = len(consecutive_from_start(skipped_steps(its)))
    if p["skips"] is not None:
        assert p["skips"] == (its[0] == 0), (p, its[:8])
    if p.get("skipped_steps"):
        fewest, most = p["skipped_steps"]
        assert fewest <= first <= most, (p, its[:20])
    if not jt["loss_scale_optimizer"]:  # bfloat16: nothing to skip, and nothing predicted
        assert p["skips"] is False and p["stuck"] is False and skipped_steps(its) == []
    fit = mpwatch.diagnose(jt["logdir"])
    if any(f.rule == "output-16bit" and f.severity in ("error", "warning") for f in fit):
        assert "output-16bit" in pre["problems"], pre
        assert pre["checked_problems"] is not None and "output-16bit" not in pre["checked_problems"]
