"""The ``layers`` record: the per-layer dtype table, its columns and their types."""

from __future__ import annotations

from typing import Any

from mpwatch.contract import schema as s
from mpwatch.contract.tags import KIND_LAYERS

# Column names of the record's table, in order (the writer builds rows in this order).
LAYERS_COLUMNS = [
    "name",
    "path",
    "class",
    "depth",
    "policy",
    "compute_dtype",
    "variable_dtype",
    "output_dtype",
    "effective_dtype",
    "params",
    "trainable_params",
    "tc_dims",
    "tc_aligned",
    "is_output",
    "note",
]
# written after LAYERS_COLUMNS since issue 24 (what a layer takes and gives); absent in older
# records, which readers and rules still take
LAYERS_GRAPH_COLUMNS = [
    "activation",
    "output_width",
    "inputs",
]

LAYERS_COLUMN_TYPES: dict[str, Any] = {
    "name": s._str("the layer's name"),
    "path": s._str("the layer's path from the root model down: model/outer/inner/dense"),
    "class": s._str("the layer's class name"),
    "depth": s._int("1 for the model's own layers, 2 inside a nested model, ..."),
    "policy": s._str("the layer's dtype policy name"),
    "compute_dtype": s._str(s._DTYPE),
    "variable_dtype": s._str(s._DTYPE),
    "output_dtype": s._str("the dtype the layer returns (None where unknown)", nullable=True),
    "effective_dtype": s._str("what it really computes in (normalization: float32 inside)"),
    "params": s._int("parameters"),
    "trainable_params": s._int("trainable parameters"),
    "tc_dims": s._t(
        "object", "dimensions deciding Tensor Core use: name -> size", additionalProperties=s._int()
    ),
    "tc_aligned": s._bool("every tc_dims a multiple of 8 (None without tc_dims)", nullable=True),
    "is_output": s._bool("the layer produces a model output"),
    "note": s._str("why effective_dtype or output_dtype differ from compute_dtype", nullable=True),
}
LAYERS_GRAPH_COLUMN_TYPES: dict[str, Any] = {
    "activation": s._str(
        "the activation the layer applies last (its activation argument: sigmoid, softmax, "
        "linear, ...; softmax for a Softmax layer; None for a layer without one)",
        nullable=True,
    ),
    "output_width": s._int("the last dimension of its output (None where unknown)", nullable=True),
    "inputs": s._t(
        ["array", "null"],
        "the layers feeding it in its model's graph, by name (Keras' inbound nodes; a Sequential: "
        "the layer before it); a name not in the table is a model input; None where the graph is "
        "not known (a subclassed model)",
        items=s._str(),
    ),
}

#: the ``layers`` record's payload schema
SCHEMA = s._record_schema(
    KIND_LAYERS,
    "The per-layer dtype table, when training begins and whenever it changes "
    "(record/callbacks/layer_dtypes.py).",
    {
        "layers": s._table_schema(
            LAYERS_COLUMNS + LAYERS_GRAPH_COLUMNS,
            {**LAYERS_COLUMN_TYPES, **LAYERS_GRAPH_COLUMN_TYPES},
            "one row per layer (records before issue 24 lack the last three columns)",
        ),
        "class_modules": s._t(
            "object",
            "each layer class of the table -> the module defining it (keras.src... for Keras' own, "
            "__main__ or the user's package for a custom layer); absent in older records",
            additionalProperties=s._str(),
        ),
        "cast_constants": s._t(
            "object",
            "each 16-bit layer whose constants Keras cast to its dtype (an adapted "
            "Normalization's mean and variance) and that lost features in the cast -> its dtype, "
            "its features and how many it lost (cast mean or variance not finite, or a variance "
            "flushed to 0); absent where none lost any",
            additionalProperties=s._t(
                "object",
                "one layer's cast",
                properties={
                    "dtype": s._str("its compute dtype"),
                    "features": s._int("features it normalizes"),
                    "lost": s._int("features whose cast constants it cannot use"),
                },
            ),
        ),
    },
    ["layers"],
)
