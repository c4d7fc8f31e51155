"""What the model's inputs become at the first layer taking them: integer ids rounded by float16.

A ``keras.Input`` without a ``dtype`` is float32. Under ``mixed_float16``, the first layer whose
policy computes in 16 bits and that *autocasts* its inputs (every layer but a few, e.g. Keras'
own ``Embedding``) casts a float input to float16 on entry. Token ids fed that way are rounded:
float16 holds every integer only up to 2048 (bfloat16: 256), so 2049 becomes 2048 and 19999 becomes
20000, an id that may be out of the vocabulary. keras.io's "Text classification with Transformer"
does exactly this (a float32 ``Input`` into a custom ``TokenAndPositionEmbedding``).

:func:`input_rows` measures it on the probe batch, per model input: whether every value is an
integer, the largest ``|value|``, the layers that take the input and the dtype they cast it to, and
how many values that cast changes (numpy, exact). The probe record keeps the rows (``inputs``); the
``id-rounding`` rule judges them.

Example:
    >>> import numpy as np, keras
    >>> inp = keras.Input((3,), name="ids")
    >>> out = keras.layers.Dense(2, dtype="mixed_float16", name="d")(inp)
    >>> model = keras.Model(inp, out)
    >>> rows = input_rows(model, np.array([[1.0, 2049.0, 19999.0]], "float32"), "float16")
    >>> dict(zip(INPUT_COLUMNS, rows[0]))["changed"]
    2
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mpwatch import contract

INPUT_COLUMNS = contract.PROBE_INPUT_COLUMNS


def _cast_dtype(name: str) -> Any:
    if name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(name)


def _consumers(model: Any, tensor: Any) -> list[Any]:
    """The layers of a Functional/Sequential model whose call takes ``tensor`` directly."""
    import keras

    out = []
    for layer in getattr(model, "layers", []):
        if type(layer).__name__ == "InputLayer":
            continue
        for node in getattr(layer, "_inbound_nodes", []) or []:
            ins = keras.tree.flatten(getattr(node, "input_tensors", None) or [])
            if any(t is tensor for t in ins):
                out.append(layer)
                break
    return out


#: layers that bring their input to a modest range whatever its scale: a model whose inputs go
#: first through one of them normalizes its inputs itself
NORMALIZING = frozenset(
    {"Normalization", "BatchNormalization", "LayerNormalization", "GroupNormalization",
     "UnitNormalization", "RMSNormalization"}
)  # fmt: skip
#: layers that move, crop, resize or drop values without changing their magnitude
SHAPE_ONLY = frozenset(
    {"Reshape", "Flatten", "Permute", "RepeatVector", "Resizing", "CenterCrop", "RandomCrop",
     "RandomFlip", "RandomRotation", "RandomZoom", "RandomTranslation", "ZeroPadding1D",
     "ZeroPadding2D", "ZeroPadding3D", "Cropping1D", "Cropping2D", "Cropping3D", "Dropout",
     "SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D", "Identity"}
)  # fmt: skip


def _normalizes(layer: Any) -> bool:
    name = type(layer).__name__
    if name in NORMALIZING:
        return True
    if name == "Rescaling":  # scaled down (1/255, 1/127.5): the model's own preprocessing
        scale = np.asarray(getattr(layer, "scale", 1.0), np.float64)
        return bool(scale.size) and bool(np.all(np.abs(scale) < 1.0))
    return False


def normalized_by(model: Any) -> list[str] | None:
    """The layers by which a Functional/Sequential model brings every float input to a modest
    range itself (a ``Rescaling`` that scales it down, ``Normalization``, a normalization layer),
    reached through layers that only move values (``RandomFlip``, ``Resizing``, ``Reshape``,
    ...): keras.applications' ``include_preprocessing``. None when an input reaches another
    layer first (or the model is not a graph of layers): only then can standardizing the inputs
    outside the model change the range its layers compute in (a model that rescales 0..255
    itself would instead see a nearly constant input).

    >>> import keras
    >>> inp = keras.Input((4,))
    >>> out = keras.layers.Dense(2)(keras.layers.Rescaling(1 / 255)(inp))
    >>> normalized_by(keras.Model(inp, out))
    ['rescaling']
    """
    import keras

    symbolic = list(getattr(model, "inputs", None) or [])
    if not symbolic:
        return None
    found: list[str] = []
    for tensor in symbolic:
        if not keras.backend.is_float_dtype(getattr(tensor, "dtype", "float32")):
            continue  # ids and other integer inputs are not standardized
        frontier, seen = [tensor], 0
        while frontier:
            seen += 1
            if seen > 64:
                return None
            t = frontier.pop()
            consumers = _consumers(model, t)
            if not consumers:
                return None  # the input is a model output, or used where no layer takes it
            for layer in consumers:
                if _normalizes(layer):
                    found.append(layer.name)
                elif type(layer).__name__ in SHAPE_ONLY:
                    frontier.extend(keras.tree.flatten(layer.output))
                else:
                    return None
    return list(dict.fromkeys(found)) or None


def _casts_to(layer: Any, mode: str) -> str | None:
    """The 16-bit dtype ``layer`` casts a float input to on entry (None: it does not)."""
    if not getattr(layer, "autocast", True) or not getattr(layer, "_convert_input_args", True):
        return None
    dtype = getattr(layer, "compute_dtype", None)
    if mode == "preflight" and dtype == "float32":
        return "float16"  # what it would do under mixed_float16
    return dtype if dtype in ("float16", "bfloat16") else None


def input_rows(model: Any, x: Any, mode: str) -> list[list[Any]]:
    """One row per float model input of the batch ``x`` (columns :data:`INPUT_COLUMNS`)."""
    import keras

    values = [np.asarray(v) for v in keras.tree.flatten(x)]
    symbolic = list(getattr(model, "inputs", None) or [])
    rows = []
    for i, v in enumerate(values):
        if not np.issubdtype(v.dtype, np.floating) or v.size == 0:
            continue
        if i < len(symbolic):
            history = getattr(symbolic[i], "_keras_history", None)
            owner = getattr(history[0], "name", None) if history else None
            name = owner or getattr(symbolic[i], "name", f"input_{i}")  # the Input layer's name
            layers = _consumers(model, symbolic[i])
        else:  # a subclassed model: the model itself takes the input
            name, layers = f"input_{i}", [model]
        casts = [(ly.name, _casts_to(ly, mode)) for ly in layers]
        casts = [(n, d) for n, d in casts if d is not None]
        finite = v[np.isfinite(v)]
        integer = bool(finite.size) and bool(np.all(finite == np.round(finite)))
        changed = 0
        target = casts[0][1] if casts else None
        if target is not None:
            rounded = finite.astype(_cast_dtype(target)).astype(np.float64)
            changed = int(np.count_nonzero(rounded != finite.astype(np.float64)))
        rows.append(
            [
                name,
                str(v.dtype),
                int(v.size),
                integer,
                float(np.max(np.abs(finite))) if finite.size else None,
                [n for n, _ in casts],
                target,
                changed,
            ]
        )
    return rows
