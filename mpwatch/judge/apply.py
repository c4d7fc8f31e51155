"""Apply the advisor's advice to a Keras model: :func:`apply_recommendations`.

Returns an :class:`Applied`: a clone of the model with the recommended layers in float32 and the
weights copied; the same advice as a ``keras.dtype_policies.DTypePolicyMap`` (layer path ->
policy); and as a code snippet to paste into the model's source. Findings that are not about a
layer's dtype (a loss scale to start from, a policy to try) go into the snippet.

Example:
    >>> import mpwatch  # doctest: +SKIP
    >>> findings = mpwatch.diagnose("logs/run1")  # doctest: +SKIP
    >>> fixed = mpwatch.apply_recommendations(model, findings)  # doctest: +SKIP
    >>> fixed.model.compile(optimizer="adam", loss="mse")  # doctest: +SKIP
    >>> print(fixed.snippet)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from mpwatch.judge.finding import Finding

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
        skipped: findings' layers not found in the model (name -> reason).
    """

    model: Any
    policy_map: Any
    snippet: str
    layers: list[str] = field(default_factory=list)
    loss_scale: float | None = None
    skipped: dict[str, str] = field(default_factory=dict)


def float32_layers(findings: Iterable[Finding]) -> list[str]:
    """Names of the layers the findings say to keep in float32, in finding order, unique."""
    out: list[str] = []
    for f in findings:
        if f.layer and (f.action or {}).get("dtype") == "float32" and f.layer not in out:
            out.append(f.layer)
    return out


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


def apply_recommendations(model: Any, findings: Iterable[Finding]) -> Applied:
    """A clone of ``model`` with the layers the findings recommend in float32, weights copied.

    Works for Sequential and Functional models (nested ones too). A subclassed model cannot be
    cloned layer by layer: ``ValueError`` says so; use :attr:`Applied.snippet` (from
    ``apply_recommendations(None, findings)``, which returns the advice without a clone).
    """
    import keras

    findings = list(findings)
    targets = float32_layers(findings)
    loss_scale = None
    for f in findings:
        if (f.action or {}).get("loss_scale"):
            loss_scale = float(f.action["loss_scale"])
            break
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
        snippet=_snippet(found, findings, loss_scale, model),
        layers=found,
        loss_scale=loss_scale,
        skipped=skipped,
    )


def _snippet(layers: list[str], findings: list[Finding], loss_scale: float | None,
             model: Any) -> str:  # fmt: skip
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
    if loss_scale:
        lines.append(
            "optimizer = keras.optimizers.LossScaleOptimizer("
            f"optimizer, initial_scale={loss_scale:g})"
        )
    for f in findings:
        pol = (f.action or {}).get("policy")
        if pol:
            lines.append(f'keras.mixed_precision.set_global_policy("{pol}")')
            break
    if len(lines) == 1:
        lines.append("# nothing to change")
    return "\n".join(lines)
