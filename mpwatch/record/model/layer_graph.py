"""What each layer takes and gives, for the layer table's graph columns
(``contract.LAYERS_GRAPH_COLUMNS``): its real inbound layers, its activation, its output width.

The inbound layers come from Keras' own functional graph: a layer's inbound nodes that belong to
the model holding it (``Functional._nodes``; a layer shared with another model has nodes there
too), each node's parent nodes named by their layer. A Keras op between layers (``a * b`` in a
functional model: an operation, not a layer) is looked through to the layers feeding it. A
model input is named by its ``InputLayer`` (not a row of the table: a name the table lacks is a
model input). A Sequential without a graph of its own: the layer before it. A subclassed model
(no graph): None, unknown.

Example:
    >>> import keras  # doctest: +SKIP
    >>> x = keras.Input((4,), name="x")  # doctest: +SKIP
    >>> a = keras.layers.Dense(4, name="a")(x)  # doctest: +SKIP
    >>> b = keras.layers.Dense(4, name="b")(x)  # doctest: +SKIP
    >>> m = keras.Model(x, keras.layers.Multiply(name="m")([a, b]))  # doctest: +SKIP
    >>> graph_columns(m)[id(m.get_layer("m"))]  # doctest: +SKIP
    [None, 4, ['a', 'b']]
"""

from __future__ import annotations

from typing import Any

from mpwatch.layers import sublayers


def activation_name(layer: Any) -> str | None:
    """The activation a layer applies last, by name (``"sigmoid"``, ``"linear"``; ``"softmax"``
    for a ``Softmax`` layer); None for a layer without an activation argument."""
    if type(layer).__name__ == "Softmax":
        return "softmax"
    fn = getattr(layer, "activation", None)
    if fn is None or sublayers(layer):
        return None
    if isinstance(fn, str):
        return fn
    name = getattr(fn, "__name__", None)
    return str(name) if name else type(fn).__name__


def _width(tensor: Any) -> int | None:
    shape = getattr(tensor, "shape", None)
    try:
        last = shape[-1] if shape is not None and len(shape) else None
    except (TypeError, IndexError):
        return None
    if isinstance(last, int) or (last is not None and str(last).isdigit()):
        return int(last)
    return None


def _node_keys(parent: Any) -> set[str] | None:
    """The node keys of ``parent``'s own graph (a Functional model, or a Sequential's), or None."""
    graph = parent
    if not isinstance(getattr(graph, "_nodes", None), set):
        graph = getattr(parent, "_functional", None)
    keys = getattr(graph, "_nodes", None)
    return keys if isinstance(keys, set) else None


def _node_key(op: Any, index: int) -> str:
    try:
        from keras.src.ops.function import make_node_key

        return str(make_node_key(op, index))
    except Exception:  # noqa: BLE001  (Keras moved it: its definition in 3.x)
        return f"{id(op)}_ib-{index}"


def _own_nodes(layer: Any, keys: set[str]) -> list[Any]:
    nodes = list(getattr(layer, "_inbound_nodes", None) or [])
    return [n for i, n in enumerate(nodes) if _node_key(layer, i) in keys]


def _feeders(node: Any, layer_ids: set[int], out: list[str], seen: set[int]) -> None:
    """Names of the layers (or model inputs) feeding ``node``, looking through Keras ops."""
    for parent in getattr(node, "parent_nodes", None) or []:
        op = getattr(parent, "operation", None)
        if op is None or id(parent) in seen:
            continue
        seen.add(id(parent))
        if id(op) in layer_ids or type(op).__name__ == "InputLayer":
            if op.name not in out:
                out.append(op.name)
        else:  # a Keras op (ops.multiply, a + b): what feeds it
            _feeders(parent, layer_ids, out, seen)


def inbound_names(layer: Any, parent: Any, previous: Any = None) -> list[str] | None:
    """The names of the layers feeding ``layer`` in ``parent``'s graph (see the module's
    docstring); ``previous``: the layer before it in a Sequential without a graph."""
    subs = sublayers(parent)
    keys = _node_keys(parent)
    if keys is not None:
        nodes = _own_nodes(layer, keys)
        if nodes:
            ids = {id(s) for s in subs}
            out: list[str] = []
            for node in nodes:
                _feeders(node, ids, out, set())
            return out
    if type(parent).__name__ == "Sequential":
        return [previous.name] if previous is not None else []
    return None


def output_width(layer: Any, parent: Any) -> int | None:
    """The last dimension of the layer's (first) output in ``parent``'s graph, else of its first
    symbolic output anywhere; None where Keras does not say."""
    keys = _node_keys(parent)
    nodes = _own_nodes(layer, keys) if keys is not None else []
    nodes = nodes or list(getattr(layer, "_inbound_nodes", None) or [])
    for node in nodes:
        outs = getattr(node, "outputs", None) or []
        if outs:
            return _width(outs[0])
    return None


def graph_columns(model: Any, widths: dict[int, int] | None = None) -> dict[int, list[Any]]:
    """``id(layer)`` -> ``[activation, output_width, inputs]`` for every layer under ``model``
    (the columns ``contract.LAYERS_GRAPH_COLUMNS``); ``widths``: output widths noted while the
    train step was traced (a subclassed model's), used where the graph gives none."""
    widths = widths or {}
    out: dict[int, list[Any]] = {}

    def rec(parent: Any) -> None:
        previous = None
        for sub in sublayers(parent):
            try:
                inputs = inbound_names(sub, parent, previous)
                width = output_width(sub, parent)
            except Exception:  # noqa: BLE001  (a graph Keras builds otherwise: unknown)
                inputs, width = None, None
            if width is None:
                width = widths.get(id(sub))
            out[id(sub)] = [activation_name(sub), width, inputs]
            previous = sub
            rec(sub)

    rec(model)
    return out
