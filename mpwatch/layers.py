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
