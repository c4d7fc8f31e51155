"""Apply the findings' advice to a Keras model: :func:`apply_recommendations`.

Returns an :class:`Applied`: a clone of the model that trains as the advice says, its weights
copied from the model's; the same advice as a ``keras.dtype_policies.DTypePolicyMap`` (layer path
-> policy); and all of it as a code snippet. One advice, said the same way everywhere:

- **One policy.** The policy the fixed model is built under is the first finding's
  ``action["policy"]`` (``set_global_policy("float32")``, ``"mixed_float16"`` instead of
  ``"float16"``, ...), else the model's own; findings come most severe first, and a policy that
  leaves mixed precision is not taken after a finding whose fix keeps it (its layers in float32,
  its loss scale): that finding came first (:func:`policy_advice`). Advice that is moot under the
  policy is left out: layers kept in float32 under ``float32`` (every layer is), a loss scale
  under a policy without float16 (nothing is scaled). What is left out, ``notes`` says (and the
  snippet, as comments). The snippet never sets two policies.
- **A fresh optimizer, never the model's.** When the model was compiled, the clone is compiled as
  it was (loss, loss weights, metrics as fresh instances, ``steps_per_execution``, ...) with a new
  optimizer built from the original's config: wrapped in a ``LossScaleOptimizer`` with the
  recommended ``initial_scale`` / ``dynamic_growth_steps`` where a finding recommends them (Keras'
  defaults for the other), else as the original was (Keras wraps it under ``mixed_float16``).
  Training the clone never touches the original's variables, weights or optimizer state. A model
  that was not compiled gives a clone that is not compiled.
- **The snippet is code that runs.** ``before_build`` (the policy, before the model is built)
  and ``after_build`` (on the built ``model``, before it is compiled: each recommended layer's
  policy; the optimizer line, run on ``optimizer``, the user's own optimizer), joined under a
  header as ``snippet``. Run on a freshly built model, they give the clone's layer policies, and
  the optimizer line builds an optimizer with the clone's ``initial_scale`` and
  ``dynamic_growth_steps``.

Example:
    >>> import mpwatch  # doctest: +SKIP
    >>> findings = mpwatch.diagnose("logs/run1")  # doctest: +SKIP
    >>> fixed = mpwatch.apply_recommendations(model, findings)  # doctest: +SKIP
    >>> fixed.model.fit(x, y)  # doctest: +SKIP
    >>> print(fixed.snippet)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from mpwatch.formats import is_16bit
from mpwatch.judge.evidence.scale_advice import optimizer_code
from mpwatch.judge.finding import Finding
from mpwatch.judge.fixes.clone import clonable as _clonable
from mpwatch.judge.fixes.clone import clone as _clone
from mpwatch.judge.fixes.clone import policy_name as _policy_name
from mpwatch.judge.fixes.fix import Fix
from mpwatch.layers import casts_constants, recast_constants, walk

__all__ = ["Applied", "apply_recommendations", "float32_layers"]

#: the policies under which a LossScaleOptimizer scales anything (float16 compute)
FLOAT16_POLICIES = ("mixed_float16", "float16")


@dataclass
class Applied:
    """What :func:`apply_recommendations` returns.

    Attributes:
        model: the clone, under ``policy``, the recommended layers in float32, the weights
            copied; compiled as the original was with ``optimizer`` when the original was
            compiled, else not compiled. None without a model.
        policy_map: ``keras.dtype_policies.DTypePolicyMap``: layer path -> ``float32`` for each
            recommended layer, ``policy`` as the default.
        snippet: the advice as code: a header, ``before_build`` and ``after_build``.
        layers: names of the layers set to float32.
        loss_scale: the recommended initial loss scale, when a finding gave one (and the policy
            computes in float16).
        skipped: findings' layers not found in the model (name -> reason).
        dynamic_growth_steps: the recommended ``dynamic_growth_steps``, when a finding gave one.
        optimizer: with a compiled model: the optimizer the clone is compiled with (a new one,
            see the module doc); without one: a new ``LossScaleOptimizer`` with the recommended
            values wrapping the ``optimizer`` argument (its inner optimizer if it is a
            LossScaleOptimizer), or None when no finding is about the loss scale or there is
            nothing to wrap.
        policy: the dtype policy the fixed model is built under (None: no model, no policy
            advice).
        before_build: the snippet's code to run before the model is built (the global policy).
        after_build: the snippet's code to run on the built ``model`` before it is compiled, with
            ``optimizer`` the user's optimizer (not a LossScaleOptimizer).
        notes: advice left out (moot under ``policy``) or what could not be repeated, and why.
    """

    model: Any
    policy_map: Any
    snippet: str
    layers: list[str] = field(default_factory=list)
    loss_scale: float | None = None
    skipped: dict[str, str] = field(default_factory=dict)
    dynamic_growth_steps: int | None = None
    optimizer: Any = None
    policy: str | None = None
    before_build: str = ""
    after_build: str = ""
    notes: list[str] = field(default_factory=list)


def float32_layers(findings: Iterable[Finding]) -> list[str]:
    """Names of the layers the findings say to keep in float32 (each finding's
    :meth:`Fix.of <mpwatch.judge.fixes.fix.Fix.of>`: its ``layer`` with ``action["dtype"] ==
    "float32"``, then ``action["float32_layers"]``), in finding order, unique."""
    out: list[str] = []
    for f in findings:
        for name in Fix.of(f).float32_layers:
            if name not in out:
                out.append(name)
    return out


def loss_scale_advice(findings: Iterable[Finding]) -> tuple[float | None, int | None]:
    """(initial_scale, dynamic_growth_steps): the first finding's that gives each (the rules
    that give them compute them from one advice, so they agree)."""
    scale = growth = None
    for f in findings:
        fix = Fix.of(f)
        if scale is None and fix.loss_scale:
            scale = fix.loss_scale
        if growth is None and fix.dynamic_growth_steps:
            growth = fix.dynamic_growth_steps
    return scale, growth


def _keeps_mixed(fix: Fix) -> bool:
    """Whether an advice is for mixed precision (layers in float32, a loss scale)."""
    return bool(fix.float32_layers or fix.loss_scale or fix.dynamic_growth_steps)


def policy_advice(findings: Iterable[Finding]) -> tuple[str | None, list[str]]:
    """(the policy to use, notes), whatever the findings' order: the first 16-bit policy advised
    (most severe first); else a policy that leaves mixed precision (float32) where no finding's
    advice keeps it (layers in float32, a loss scale: that advice is about the model, and is
    applied; the device's "float32 here" is then left out with a note). Other policies are left
    out with a note. (It depended on the order: one model was turned float32 whole by a CPU
    finding that came first, another kept its layer fixes.)"""
    fixes = [(f, Fix.of(f)) for f in findings]
    mixed = [f.rule for f, fix in fixes if _keeps_mixed(fix)]
    advised = [(f, fix.policy) for f, fix in fixes if fix.policy]
    chosen = next((p for _, p in advised if is_16bit(p)), None)
    if chosen is None and not mixed:
        chosen = next((p for _, p in advised), None)
    notes: list[str] = []
    for f, p in advised:
        if p == chosen:
            continue
        why = (
            f"{chosen} comes first" if chosen is not None
            else f"{', '.join(dict.fromkeys(mixed))} keep mixed precision (their fixes are applied)"
        )  # fmt: skip
        notes.append(f'{f.rule}\'s set_global_policy("{p}") left out: {why}')
    return chosen, notes


def _inner(optimizer: Any) -> Any:
    import keras

    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer.inner_optimizer
    return optimizer


def _copy_optimizer(optimizer: Any) -> Any:
    """A new optimizer of the same class and config (learning rate or its schedule included),
    with no state: never the same object, never the same variables."""
    return optimizer.__class__.from_config(optimizer.get_config())


def _optimizer(model: Any, given: Any, policy: str | None, scale: float | None,
               growth: int | None) -> Any:  # fmt: skip
    """The optimizer to compile the clone with (with a model) or to hand out (without one); see
    :attr:`Applied.optimizer`."""
    import keras

    compiled = model is not None and getattr(model, "compiled", False)
    original = getattr(model, "optimizer", None) if compiled else None
    base = given if given is not None else original
    if base is None:
        return None
    inner = _inner(base)
    if original is not None and inner is _inner(original):
        inner = _copy_optimizer(inner)  # the original's own optimizer is never reused
    if scale is not None or growth is not None:
        kwargs: dict[str, Any] = {}
        if scale is not None:
            kwargs["initial_scale"] = scale
        if growth is not None:
            kwargs["dynamic_growth_steps"] = growth
        return keras.optimizers.LossScaleOptimizer(inner, **kwargs)
    if not compiled:
        return None  # no advice about the optimizer and nothing to compile
    if isinstance(base, keras.optimizers.LossScaleOptimizer) and policy in FLOAT16_POLICIES:
        # as the original was scaled (Keras' own wrapper, or the user's with their values)
        return keras.optimizers.LossScaleOptimizer(
            inner,
            initial_scale=base.initial_scale,
            dynamic_growth_steps=base.dynamic_growth_steps,
        )
    return inner  # Keras' compile wraps it under mixed_float16, as it wrapped the original's


def _fresh_metrics(metrics: Any) -> Any:
    """The compile ``metrics`` structure with each Metric instance replaced by a new one of the
    same config (a metric holds state: the clone's must not be the original's)."""
    import keras

    if isinstance(metrics, keras.metrics.Metric):
        return metrics.__class__.from_config(metrics.get_config())
    if isinstance(metrics, dict):
        return {k: _fresh_metrics(v) for k, v in metrics.items()}
    if isinstance(metrics, (list, tuple)):
        return type(metrics)(_fresh_metrics(m) for m in metrics)
    return metrics


def _compile_like(clone: Any, model: Any, optimizer: Any) -> None:
    """Compile ``clone`` with ``model``'s compile arguments and ``optimizer`` (the arguments as
    given to ``compile``, so unregistered custom losses work; metrics as new instances)."""
    config = getattr(getattr(model, "_compile_config", None), "config", None)
    if config is None:  # a Keras without the raw arguments: the serialized ones
        from keras.src.saving import serialization_lib

        config = serialization_lib.deserialize_keras_object(model.get_compile_config())
    kwargs = dict(config)
    kwargs["optimizer"] = optimizer
    for key in ("metrics", "weighted_metrics"):
        if kwargs.get(key) is not None:
            kwargs[key] = _fresh_metrics(kwargs[key])
    clone.compile(**kwargs)
    if clone.built:
        clone.optimizer.build(clone.trainable_variables)  # as Keras' clone_model does


def _all_layers(model: Any) -> list[Any]:
    out = []

    def rec(layer: Any) -> None:
        for sub in getattr(layer, "layers", None) or []:
            out.append(sub)
            rec(sub)

    rec(model)
    return out


def _layer_chains(model: Any) -> dict[str, list[str]]:
    """Layer name -> the names of ``get_layer`` calls from the model to it (nested models)."""
    out: dict[str, list[str]] = {}

    def rec(layer: Any, chain: list[str]) -> None:
        for sub in getattr(layer, "layers", None) or []:
            out.setdefault(sub.name, chain + [sub.name])
            rec(sub, chain + [sub.name])

    rec(model, [])
    return out


def _float32_whole(clone: Any, names: list[str]) -> None:
    """Every layer under each of ``names`` in float32 (Keras gives a container's dtype to none of
    the layers it holds: a container in float32 around 16-bit sublayers fails on TensorFlow)."""
    layers = {layer.name: layer for layer in _all_layers(clone)}
    for name in names:
        if name in layers:
            for sub, _, _ in walk(layers[name]):
                sub.dtype_policy = "float32"


def _has_sublayers(model: Any, name: str) -> bool:
    layer = {ly.name: ly for ly in _all_layers(model)}.get(name)
    return layer is not None and bool(walk(layer))


def _output_layer(model: Any) -> Any:
    """The layer producing a Sequential or single-output Functional model's output, or None."""
    outs = getattr(model, "outputs", None) or []
    if len(outs) == 1:
        history = getattr(outs[0], "_keras_history", None)
        if history is not None:
            return history[0] if isinstance(history, tuple) else history.operation
    layers = getattr(model, "layers", None) or []
    return layers[-1] if layers else None


def apply_recommendations(model: Any, findings: Iterable[Finding],
                          optimizer: Any = None) -> Applied:  # fmt: skip
    """A clone of ``model`` that trains as the findings say: under their policy, the layers they
    recommend in float32, weights copied, compiled (when ``model`` was) with a new optimizer
    (the recommended loss scale where one is recommended); see the module doc.

    Works for Sequential and Functional models (nested ones too). A subclassed model cannot be
    cloned layer by layer: ``ValueError`` says so; use :attr:`Applied.snippet` (from
    ``apply_recommendations(None, findings)``, which returns the advice without a clone).
    ``optimizer``: the optimizer to compile the clone with, or to wrap in the recommended
    LossScaleOptimizer (default: a new copy of the compiled model's inner optimizer; the
    model's own optimizer, given here, is copied too, never shared).

    A layer the user pinned to the model's own policy (``dtype="mixed_float16"`` in a mixed
    model) is switched with the others when the findings change the policy; in the user's code,
    building the model under the new global policy leaves it as it is.
    """
    import keras

    findings = list(findings)
    targets = float32_layers(findings)
    loss_scale, growth = loss_scale_advice(findings)
    advised, notes = policy_advice(findings)
    old = _policy_name(model) if model is not None else None
    policy = advised or old
    if policy is not None and not is_16bit(policy) and targets:
        notes.append(
            f"keeping {', '.join(targets)} in float32 is moot under the {policy} policy (every "
            "layer computes in float32): left out"
        )
        targets = []
    if policy is not None and policy not in FLOAT16_POLICIES and (loss_scale or growth):
        notes.append(
            f"no loss scale under the {policy} policy (nothing computes in float16): the "
            "loss-scale advice is left out"
        )
        loss_scale = growth = None
    policy_map = keras.dtype_policies.DTypePolicyMap(default_policy=policy)
    skipped: dict[str, str] = {}
    clone = None
    found: list[str] = []
    chains: dict[str, list[str]] = {}
    if model is not None:
        _clonable(model)
        by_name = {layer.name: layer for layer in _all_layers(model)}
        chains = _layer_chains(model)
        outputs = {f.layer for f in findings if (f.action or {}).get("output")}
        for name in targets:
            layer = by_name.get(name)
            if layer is None and name in outputs:
                # the output layer of another instance of the model (Keras numbers layer names
                # per session): the advice is about whichever layer is the output
                layer = _output_layer(model)
            if layer is None:
                skipped[name] = "no layer of that name in this model"
                continue
            if layer.name not in found:
                found.append(layer.name)
            policy_map[getattr(layer, "path", None) or layer.name] = keras.dtype_policies.get(
                "float32"
            )
        for name in found:  # a container in float32 is all of it (its sublayers' paths too)
            for _, path, _ in walk(by_name[name]):
                policy_map[path] = keras.dtype_policies.get("float32")
        shared: list[str] = []
        clone = _clone(model, set(found), old, policy, shared)
        if shared:
            one = len(shared) == 1
            notes.append(
                f"{', '.join(shared)} cannot be rebuilt from {'its' if one else 'their'} config "
                "(get_config leaves out an argument of __init__): the new model shares "
                f"{'it' if one else 'them'} with the model given, weights and all"
            )
        if not clone.built and model.built:
            clone.build(model.input_shape if hasattr(model, "input_shape") else None)
        _float32_whole(clone, found)
        clone.set_weights(model.get_weights())
        for layer in _all_layers(clone):  # an adapted Normalization: mean and variance, in its
            recast_constants(layer)  # dtype now (set_weights leaves them as built: 0 and 1)
    else:
        found = list(targets)
        for name in targets:
            policy_map[name] = keras.dtype_policies.get("float32")
    opt = _optimizer(model, optimizer, policy, loss_scale, growth)
    if clone is not None and getattr(model, "compiled", False):
        _compile_like(clone, model, opt)
        opt = clone.optimizer  # Keras' wrapper under mixed_float16, where it added one
    classes = _layer_classes(model, findings)
    containers = {n for n in found if model is not None and _has_sublayers(model, n)}
    by_name = {layer.name: layer for layer in _all_layers(model)} if model is not None else {}
    restate = {n for n in found if casts_constants(by_name.get(n))}
    before = _before_build(advised if advised != old else None)
    after = _after_build(found, chains, classes, loss_scale, growth, containers, restate)
    return Applied(
        model=clone,
        policy_map=policy_map,
        snippet=_snippet(before, after, notes),
        layers=found,
        loss_scale=loss_scale,
        skipped=skipped,
        dynamic_growth_steps=growth,
        optimizer=opt,
        policy=policy,
        before_build=before,
        after_build=after,
        notes=notes,
    )


def _layer_classes(model: Any, findings: list[Finding]) -> dict[str, str]:
    """Layer name -> its constructor as the user's code writes it: ``keras.layers.Dense`` for
    Keras' own classes, the class name for the user's (from the model, else the finding)."""
    classes: dict[str, str] = {}
    if model is not None:
        for layer in _all_layers(model):
            cls = type(layer)
            own = cls.__module__.split(".")[0] != "keras"
            classes[layer.name] = cls.__name__ if own else f"keras.layers.{cls.__name__}"
    for f in findings:
        if f.layer and not classes.get(f.layer):
            cls = (f.data or {}).get("class")
            if cls:
                classes[f.layer] = f"keras.layers.{cls}"
    return classes


def _before_build(policy: str | None) -> str:
    """The code to run before the model is built: the global policy, when the advice changes it."""
    if policy is None:
        return ""
    return "\n".join(
        [
            "# before the model is built (its layers take the global policy when created):",
            f'keras.mixed_precision.set_global_policy("{policy}")',
        ]
    )


def _after_build(layers: list[str], chains: dict[str, list[str]], classes: dict[str, str],
                 loss_scale: float | None, growth: int | None,
                 containers: Collection[str] = (),
                 restate: Collection[str] = ()) -> str:  # fmt: skip
    """The code to run on the built ``model`` before it is compiled (``containers``: the layers
    that hold layers, switched with all of them; ``restate``: those whose constants Keras cast
    when they were built or adapted, an adapted ``Normalization``'s mean and variance)."""
    lines: list[str] = []
    if layers:
        lines.append("# once the model is built, before it is compiled: these layers in float32")
        for name in layers:
            cls = classes.get(name, "keras.layers.<Layer>")
            calls = "".join(f'.get_layer("{n}")' for n in chains.get(name, [name]))
            if name in containers:
                lines.append(f"# ({name!r} holds layers: a dtype does not reach the layers it "
                             "creates, so all of it)")  # fmt: skip
                lines.append(f"for sub in model{calls}._flatten_layers():")
                lines.append('    sub.dtype_policy = "float32"')
                continue
            lines.append(f'# (or where it is created: {cls}(..., name="{name}", dtype="float32"))')
            lines.append(f'model{calls}.dtype_policy = "float32"')
            if name in restate:
                lines.append(f"model{calls}.finalize_state()  # its mean and variance again, "
                             "in float32 (Keras cast them when it was adapted)")  # fmt: skip
    if loss_scale is not None or growth is not None:
        lines.append("# `optimizer`: your optimizer (Adam, ...), not a LossScaleOptimizer")
        lines.append(optimizer_code(loss_scale, growth))
        lines.append("# model.compile(optimizer=optimizer, ...)  # your loss and metrics")
    return "\n".join(lines)


def _snippet(before: str, after: str, notes: list[str]) -> str:
    lines = ["# mpwatch: recommended changes"]
    lines += [part for part in (before, after) if part]
    lines += [f"# note: {note}" for note in notes]
    if not (before or after):
        lines.append("# nothing to change")
    return "\n".join(lines)
