"""The layer walker and the layer key every table joins on. Works on Keras objects, imports nothing.

A layer's *key* is its name (``layer`` / ``name`` columns of the layer, gradient and probe tables);
its *path* is the ``/``-joined names from the root model down (``"model/block_1/dense"``), the
``path`` column of the layer table and the scope the profile joins op names on.

Example:
    >>> import keras  # doctest: +SKIP
    >>> dense = keras.layers.Dense(2, name="d")  # doctest: +SKIP
    >>> m = keras.Sequential([keras.Input((4,)), dense], name="m")  # doctest: +SKIP
    >>> [(path, depth) for _, path, depth in walk(m)]  # doctest: +SKIP
    [('m/d', 1)]
"""

from __future__ import annotations

from typing import Any


def sublayers(layer: Any) -> list[Any]:
    """Direct sub-layers (nested models, layers held by a subclassed layer); no InputLayer."""
    try:
        subs = layer._flatten_layers(include_self=False, recursive=False)
    except Exception:  # noqa: BLE001
        subs = list(getattr(layer, "layers", []) or [])
    return [s for s in subs if type(s).__name__ != "InputLayer"]


def layer_path(prefix: str, name: str) -> str:
    """The path of layer ``name`` under the layer at ``prefix`` (``""`` for the root)."""
    return f"{prefix}/{name}" if prefix else name


def walk(model: Any) -> list[tuple[Any, str, int]]:
    """(layer, path, depth) for every layer under ``model``, depth-first, paths like
    ``"outer/inner/dense"`` (the root model's name first; depth 1 for its direct layers)."""
    out: list[tuple[Any, str, int]] = []

    def rec(layer: Any, prefix: str, depth: int) -> None:
        for sub in sublayers(layer):
            path = layer_path(prefix, sub.name)
            out.append((sub, path, depth))
            rec(sub, path, depth + 1)

    rec(model, model.name, 1)
    return out


def casts_constants(layer: Any) -> bool:
    """Whether ``layer`` keeps constants cast to its compute dtype when it is built, adapted or
    loaded (Keras' ``Normalization``: its mean and variance), which a later policy change leaves
    as they were (:func:`recast_constants`)."""
    return (
        callable(getattr(layer, "finalize_state", None))
        and bool(getattr(layer, "built", False))
        and getattr(layer, "mean", None) is not None
        and hasattr(layer, "variance")
    )


def recast_constants(layer: Any) -> tuple[Any, Any] | None:
    """Keras' ``Normalization`` keeps its mean and variance as constants cast to its compute
    dtype when it is built, adapted or loaded, not when its policy changes: under
    mixed_float16 a feature whose mean or variance is beyond float16's 65504 (areas, prices:
    a variance of 7e9) gives constants of inf, and the layer in float32 still divides by them.
    Recomputed here in the dtype now in force (from its float32 ``adapt_mean`` and
    ``adapt_variance``, or from the ``mean`` and ``variance`` it was given); returns the old
    ones (to put back), or None for a layer without such constants."""
    if not casts_constants(layer):
        return None
    old = (layer.mean, layer.variance)
    if getattr(layer, "input_mean", None) is None:
        layer.finalize_state()
    else:
        layer.build(layer._build_input_shape)
    return old
