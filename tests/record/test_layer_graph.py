"""The layer table's graph columns (mpwatch/record/model/layer_graph.py): each layer's real inbound
layers, activation and output width, on small real Keras models. Ground truth of the inbound
layers: Keras' own serialization of the functional graph (``model.get_config()``'s
``inbound_nodes``, each tensor's ``keras_history``), not the walk the recorder does."""

from __future__ import annotations

import numpy as np
import pytest

from mpwatch import contract
from mpwatch.record.callbacks.layer_dtypes import COLUMNS, layer_rows

GRAPH = contract.LAYERS_GRAPH_COLUMNS


def _table(model):
    return {r[0]: dict(zip(COLUMNS, r)) for r in layer_rows(model)}


def _history(obj, out):
    """The layer names of every tensor in a serialized call's args (``keras_history[0]``)."""
    if isinstance(obj, dict):
        hist = (obj.get("config") or {}).get("keras_history")
        if obj.get("class_name") == "__keras_tensor__" and hist:
            out.append(hist[0])
        else:
            for v in obj.values():
                _history(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _history(v, out)
    return out


def _keras_inbound(model):
    """Layer name -> the names of the layers feeding it, from Keras' own config."""
    got = {}
    for layer in model.get_config()["layers"]:
        names = []
        for node in layer["inbound_nodes"]:
            names += [n for n in _history(node, []) if n not in names]
        got[layer["name"]] = names
    return got


def _two_branches(policy_name="mixed_float16"):
    """The squeeze-excite shape: a branch, a sigmoid gate off the same input, their Multiply,
    then a 1-unit sigmoid output."""
    import keras

    keras.mixed_precision.set_global_policy(policy_name)
    try:
        x = keras.Input((8, 8, 4), name="x")
        a = keras.layers.Conv2D(8, 3, padding="same", activation="swish", name="branch")(x)
        g = keras.layers.GlobalAveragePooling2D(keepdims=True, name="pool")(a)
        g = keras.layers.Conv2D(8, 1, activation="sigmoid", name="gate")(g)
        m = keras.layers.Multiply(name="se_mul")([a, g])
        h = keras.layers.GlobalAveragePooling2D(name="gap")(m)
        out = keras.layers.Dense(1, activation="sigmoid", name="out")(h)
        return keras.Model(x, out, name="se")
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_the_inbound_layers_are_keras_own_graph():
    model = _two_branches()
    rows = _table(model)
    truth = _keras_inbound(model)
    assert set(rows) == set(truth) - {"x"}  # the InputLayer is no row: a model input
    for name, row in rows.items():
        assert row["inputs"] == truth[name], name
    assert rows["se_mul"]["inputs"] == ["branch", "gate"]  # its real inputs, not the row before
    names = list(rows)
    assert names[names.index("se_mul") - 1] == "gate"  # the row before it: one input of two


def test_activation_and_width_are_the_layers_own():
    model = _two_branches()
    rows = _table(model)
    for layer in model.layers[1:]:
        row = rows[layer.name]
        assert row["output_width"] == layer.output.shape[-1], layer.name
        act = getattr(layer, "activation", None)
        assert row["activation"] == (act.__name__ if act is not None else None), layer.name
    out = rows["out"]
    assert (out["activation"], out["output_width"], out["is_output"]) == ("sigmoid", 1, True)
    assert rows["gate"]["activation"] == "sigmoid" and rows["se_mul"]["activation"] is None


def test_a_keras_op_between_layers_is_looked_through():
    import keras

    x = keras.Input((8,), name="x")
    a = keras.layers.Dense(8, name="a")(x)
    b = keras.layers.Dense(8, name="b")(x)
    y = keras.ops.multiply(a, b) + a  # two operations, no layer
    model = keras.Model(x, keras.layers.Dense(2, name="c")(y))
    assert [layer.name for layer in model.layers] == ["x", "a", "b", "c"]
    assert _table(model)["c"]["inputs"] == ["a", "b"]


def test_nested_and_sequential_models():
    import keras

    inner = keras.Sequential(
        [keras.layers.Dense(6, name="i1"), keras.layers.Softmax(name="i2")], name="inner"
    )
    x = keras.Input((5,), name="x")
    model = keras.Model(x, keras.layers.Dense(3, name="after")(inner(x)), name="outer")
    rows = _table(model)
    assert rows["inner"]["inputs"] == ["x"] and rows["after"]["inputs"] == ["inner"]
    assert rows["i2"]["inputs"] == ["i1"]  # inside the nested Sequential: its own graph
    assert rows["i1"]["inputs"][0] not in rows  # its own input layer: a model input
    assert (rows["i2"]["activation"], rows["i2"]["output_width"]) == ("softmax", 6)
    assert rows["inner"]["activation"] is None and rows["inner"]["output_width"] == 6

    seq = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(3, name="s1"), keras.layers.Dense(2, name="s2")]
    )
    srows = _table(seq)
    assert srows["s2"]["inputs"] == ["s1"] and srows["s1"]["inputs"][0] not in srows


def test_token_ids_into_an_embedding():
    """Integer ids fed straight to an Embedding: the table says the ids are a model input, and
    the judge names them so (never float16 for them)."""
    import keras
    from builders import make_run

    from mpwatch.judge.evidence.graph import id_inputs

    ids = keras.Input((12,), dtype="int32", name="ids")
    h = keras.layers.Embedding(997, 20, name="emb")(ids)
    h = keras.layers.GlobalAveragePooling1D(name="pool")(h)
    model = keras.Model(ids, keras.layers.Dense(1, activation="sigmoid", name="out")(h))
    rows = _table(model)
    assert rows["emb"]["inputs"] == ["ids"] and "ids" not in rows
    assert rows["emb"]["output_width"] == 20 and rows["emb"]["activation"] is None
    assert rows["emb"]["tc_dims"] == {"output_dim": 20}  # the vocabulary is the data's: not there
    assert id_inputs(make_run(layers=layer_rows(model))) == ["ids"]


@pytest.mark.parametrize("kind", ["functional", "subclassed"])
def test_a_fit_writes_the_graph_columns_and_load_run_reads_them(tmp_path, policy, kind):
    """End to end: LayerDtypeMonitor's record has the graph columns; a subclassed model has no
    graph (inputs None) but its output widths are noted while the step is traced."""
    import keras

    import mpwatch

    class Net(keras.Model):
        def __init__(self):
            super().__init__(name="net")
            self.hidden = keras.layers.Dense(8, activation="relu", name="hidden")
            self.head = keras.layers.Dense(1, activation="sigmoid", name="out")

        def call(self, x):
            return self.head(self.hidden(x))

    with policy("mixed_float16"):
        if kind == "subclassed":
            model = Net()
        else:
            x = keras.Input((4,), name="x")
            h = keras.layers.Dense(8, activation="relu", name="hidden")(x)
            model = keras.Model(x, keras.layers.Dense(1, activation="sigmoid", name="out")(h))
        model.compile("sgd", "binary_crossentropy")
        data = np.random.rand(16, 4).astype("float32"), np.random.randint(0, 2, (16, 1))
        model.fit(*data, batch_size=8, verbose=0, callbacks=[mpwatch.LayerDtypeMonitor(tmp_path)])
    lt = mpwatch.load_run(str(tmp_path)).layers.set_index("name")
    assert list(lt.columns[-len(GRAPH) :]) == GRAPH
    assert lt.loc["out", "activation"] == "sigmoid" and lt.loc["out", "output_width"] == 1
    assert lt.loc["hidden", "output_width"] == 8
    if kind == "functional":
        assert list(lt.loc["out", "inputs"]) == ["hidden"]
        assert list(lt.loc["hidden", "inputs"]) == ["x"]
    else:
        assert lt.loc["out", "inputs"] is None and lt.loc["hidden", "inputs"] is None
