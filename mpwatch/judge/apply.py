"""Apply the advisor's advice to a Keras model: :func:`apply_recommendations`.

Returns an :class:`Applied`: a clone of the model with the recommended layers in float32 and the
weights copied; the same advice as a ``keras.dtype_policies.DTypePolicyMap`` (layer path ->
policy); the recommended ``LossScaleOptimizer`` (``initial_scale`` and ``dynamic_growth_steps`` as
the findings say, wrapping a fresh copy of the model's inner optimizer, or the optimizer given);
and all of it as a code snippet to paste into the model's source. The snippet and the returned
objects say the same: the optimizer line of the snippet, run on the same inner optimizer, builds
an optimizer with exactly the returned one's ``initial_scale`` and ``dynamic_growth_steps``.

Example:
    >>> import mpwatch  # doctest: +SKIP
    >>> findings = mpwatch.diagnose("logs/run1")  # doctest: +SKIP
    >>> fixed = mpwatch.apply_recommendations(model, findings)  # doctest: +SKIP
    >>> fixed.model.compile(optimizer=fixed.optimizer or "adam", loss="mse")  # doctest: +SKIP
    >>> print(fixed.snippet)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from mpwatch.judge.finding import Finding
from mpwatch.judge.scale_evidence import optimizer_code

__all__ = ["Applied", "apply_recommendations", "float32_layers"]


@dataclass
class Applied:
    """What :func:`apply_recommendations` returns.

    Attributes:
        model: the clone (not compiled: compile it as you compiled the original).
        policy_map: ``keras.dtype_policies.DTypePolicyMap``: layer path -> ``float32`` for each
            recommended layer, the model's policy as the default.
        snippet: the advice as code.
        layers: names of the layers set to float32.
        loss_scale: the recommended initial loss scale, when a finding gave one.
        dynamic_growth_steps: the recommended ``dynamic_growth_steps``, when a finding gave one.
        optimizer: a new ``keras.optimizers.LossScaleOptimizer`` with ``loss_scale`` and
            ``dynamic_growth_steps`` (Keras' defaults where a finding gave none), wrapping the
            ``optimizer`` argument (its inner optimizer if it is a LossScaleOptimizer), else a
            fresh copy (from its config) of the compiled model's inner optimizer; None when no
            finding is about the loss scale, or there is no optimizer to wrap. Compile the clone
            with it.
        skipped: findings' layers not found in the model (name -> reason).
    """

    model: Any
    policy_map: Any
    snippet: str
    layers: list[str] = field(default_factory=list)
    loss_scale: float | None = None
    skipped: dict[str, str] = field(default_factory=dict)
    dynamic_growth_steps: int | None = None
    optimizer: Any = None


def float32_layers(findings: Iterable[Finding]) -> list[str]:
    """Names of the layers the findings say to keep in float32 (a finding's ``layer`` with
    ``action["dtype"] == "float32"``, and every name of ``action["float32_layers"]``), in finding
    order, unique."""
    out: list[str] = []
    for f in findings:
        action = f.action or {}
        names = list(action.get("float32_layers") or [])
        if f.layer and action.get("dtype") == "float32":
            names.insert(0, f.layer)
        for name in names:
            if name not in out:
                out.append(str(name))
    return out


def loss_scale_advice(findings: Iterable[Finding]) -> tuple[float | None, int | None]:
    """(initial_scale, dynamic_growth_steps): the first finding's that gives each (the rules
    that give them compute them from one advice, so they agree)."""
    scale = growth = None
    for f in findings:
        action = f.action or {}
        if scale is None and action.get("loss_scale"):
            scale = float(action["loss_scale"])
        if growth is None and action.get("dynamic_growth_steps"):
            growth = int(action["dynamic_growth_steps"])
    return scale, growth


def _inner(optimizer: Any) -> Any:
    import keras

    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer.inner_optimizer
    return optimizer


def _loss_scale_optimizer(model: Any, optimizer: Any, scale: float | None,
                          growth: int | None) -> Any:  # fmt: skip
    """The LossScaleOptimizer the snippet's line builds (None: nothing to wrap or to change)."""
    import keras

    if scale is None and growth is None:
        return None
    if optimizer is not None:
        inner = _inner(optimizer)
    else:
        compiled = getattr(model, "optimizer", None) if model is not None else None
        if compiled is None:
            return None
        inner = _inner(compiled)
        # the clone has new variables: a fresh copy of the optimizer, its state not carried over
        inner = inner.__class__.from_config(inner.get_config())
    kwargs: dict[str, Any] = {}
    if scale is not None:
        kwargs["initial_scale"] = scale
    if growth is not None:
        kwargs["dynamic_growth_steps"] = growth
    return keras.optimizers.LossScaleOptimizer(inner, **kwargs)


def _all_layers(model: Any) -> list[Any]:
    out = []

    def rec(layer: Any) -> None:
        for sub in getattr(layer, "layers", None) or []:
            out.append(sub)
            rec(sub)

    rec(model)
    return out


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
    """A clone of ``model`` with the layers the findings recommend in float32, weights copied, and
    the recommended LossScaleOptimizer.

    Works for Sequential and Functional models (nested ones too). A subclassed model cannot be
    cloned layer by layer: ``ValueError`` says so; use :attr:`Applied.snippet` (from
    ``apply_recommendations(None, findings)``, which returns the advice without a clone).
    ``optimizer``: the optimizer to wrap in the recommended LossScaleOptimizer (default: a fresh
    copy of the compiled model's inner optimizer); see :attr:`Applied.optimizer`.
    """
    import keras

    findings = list(findings)
    targets = float32_layers(findings)
    loss_scale, growth = loss_scale_advice(findings)
    default = None
    if model is not None:
        default = getattr(model, "dtype_policy", None)
    policy_map = keras.dtype_policies.DTypePolicyMap(default_policy=default)
    skipped: dict[str, str] = {}
    clone = None
    found: list[str] = []
    if model is not None:
        by_name = {layer.name: layer for layer in _all_layers(model)}
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
        want = set(found)

        def clone_function(layer: Any) -> Any:
            config = layer.get_config()
            if layer.name in want:
                config["dtype"] = "float32"
            return layer.__class__.from_config(config)

        try:
            clone = keras.models.clone_model(model, clone_function=clone_function, recursive=True)
        except (ValueError, TypeError, NotImplementedError) as e:
            raise ValueError(
                f"mpwatch: cannot clone {type(model).__name__} layer by layer ({e}); a subclassed "
                "model must be changed in its code: see apply_recommendations(None, findings)"
                ".snippet"
            ) from e
        if not clone.built and model.built:
            clone.build(model.input_shape if hasattr(model, "input_shape") else None)
        clone.set_weights(model.get_weights())
    else:
        found = list(targets)
        for name in targets:
            policy_map[name] = keras.dtype_policies.get("float32")
    return Applied(
        model=clone,
        policy_map=policy_map,
        snippet=_snippet(found, findings, loss_scale, growth, model),
        layers=found,
        loss_scale=loss_scale,
        skipped=skipped,
        dynamic_growth_steps=growth,
        optimizer=_loss_scale_optimizer(model, optimizer, loss_scale, growth),
    )


def _snippet(layers: list[str], findings: list[Finding], loss_scale: float | None,
             growth: int | None, model: Any) -> str:  # fmt: skip
    lines = ["# mpwatch: recommended changes"]
    classes: dict[str, str] = {}
    if model is not None:
        classes = {layer.name: type(layer).__name__ for layer in _all_layers(model)}
    for f in findings:
        if f.layer and not classes.get(f.layer):
            cls = (f.data or {}).get("class")
            if cls:
                classes[f.layer] = cls
    for name in layers:
        cls = classes.get(name, "Layer")
        lines.append(f'keras.layers.{cls}(..., name="{name}", dtype="float32")')
    if layers:
        lines.append("# or, keeping the model code as it is:")
        lines.append("policy_map = keras.dtype_policies.DTypePolicyMap()")
        lines.append(f"for path in {[n for n in layers]!r}:")
        lines.append('    policy_map[path] = keras.dtype_policies.get("float32")')
    if loss_scale is not None or growth is not None:
        lines.append("# optimizer: your optimizer (Adam, ...), not a LossScaleOptimizer")
        lines.append(optimizer_code(loss_scale, growth))
        lines.append("model.compile(optimizer=optimizer, ...)")
    for f in findings:
        pol = (f.action or {}).get("policy")
        if pol:
            lines.append(f'keras.mixed_precision.set_global_policy("{pol}")')
            break
    if len(lines) == 1:
        lines.append("# nothing to change")
    return "\n".join(lines)
