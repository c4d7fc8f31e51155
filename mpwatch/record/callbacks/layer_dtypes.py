"""LayerDtypeMonitor: the per-layer dtype table, as the layers really compute."""

from __future__ import annotations

import logging
from typing import Any

from mpwatch import contract
from mpwatch.formats import FLOAT32_INSIDE, is_16bit
from mpwatch.layers import casts_constants, sublayers, walk
from mpwatch.record.callbacks.base import ALWAYS_QUIET, RecordingCallback
from mpwatch.record.model import memory
from mpwatch.record.model.layer_graph import graph_columns

logger = logging.getLogger("mpwatch")

COLUMNS = contract.LAYERS_COLUMNS + contract.LAYERS_GRAPH_COLUMNS


def tc_dims(layer: Any) -> dict[str, int]:
    """The dimensions that decide Tensor Core eligibility of a layer's matmul/convolution."""
    dims: dict[str, int] = {}
    cls = type(layer).__name__
    kernel = getattr(layer, "kernel", None) if getattr(layer, "built", False) else None
    kshape = tuple(int(d) for d in kernel.shape) if kernel is not None else None
    if cls in ("Dense", "EinsumDense"):
        if getattr(layer, "units", None):
            dims["units"] = int(layer.units)
        if kshape:
            dims["kernel_input_dim"] = kshape[0]
    elif "Conv" in cls and hasattr(layer, "filters"):
        if layer.filters:
            dims["filters"] = int(layer.filters)
        if kshape and len(kshape) >= 2:
            dims["input_channels"] = kshape[-2]
    elif cls == "Embedding":
        dims["output_dim"] = int(layer.output_dim)
    elif cls == "MultiHeadAttention":
        dims["key_dim"] = int(layer.key_dim)
        dims["heads_x_key_dim"] = int(layer.num_heads * layer.key_dim)
    elif cls in ("LSTM", "GRU", "SimpleRNN") and hasattr(layer, "units"):
        dims["units"] = int(layer.units)
    return dims


def _symbolic_output_dtype(layer: Any) -> str | None:
    nodes = getattr(layer, "_inbound_nodes", None) or []
    for node in nodes:
        outs = getattr(node, "outputs", None) or []
        if outs and getattr(outs[0], "dtype", None) is not None:
            return str(outs[0].dtype)
    return None


def output_layers(model: Any) -> set[int]:
    """ids of the layers producing the model's outputs: a Functional or Sequential model's own;
    a subclassed model's last layer; for a model without a forward pass of its own (a GAN or a
    VAE whose ``train_step`` runs its sub-models) or holding several models (keras.io's
    ``Distiller``: a teacher and a student, its ``call`` the student's), every sub-model it
    holds, each of whose outputs its train step computes (a critic's score, an encoder's codes,
    a generated image, a teacher's classes: tensor-core-alignment asked to pad a teacher's
    10-class head)."""
    ids: set[int] = set()
    outs = getattr(model, "_outputs", None) or []
    try:
        import keras

        for t in keras.tree.flatten(outs):
            hist = getattr(t, "_keras_history", None)
            if hist is not None:
                ids.add(id(hist[0]))
    except Exception:  # noqa: BLE001
        pass
    if not ids:
        subs = sublayers(model)
        models = [s for s in subs if _is_model(s)]
        # a model that holds several models (a distiller's teacher and student, a GAN's two)
        # computes each one's outputs, a forward pass of its own or not: each is the task's
        if _has_forward_pass(model) and len(models) < 2:
            models = []
        ids |= {id(s) for s in models} or ({id(subs[-1])} if subs else set())
    # an output produced by a nested model: its own output layers are outputs too
    for layer in list(sublayers(model)):
        if id(layer) in ids and sublayers(layer):
            ids |= output_layers(layer)
    return ids


def sixteen_bit_outputs(model: Any) -> list[str]:
    """Names of the model's output layers (:func:`output_layers`) computing in float16 or
    bfloat16, under the policies the layers have now (a pre-flight's view included): the layers
    a pass that overflows as training runs it is tried with in float32."""
    outs = output_layers(model)
    return [
        ly.name for ly in model._flatten_layers(include_self=False)
        if id(ly) in outs and is_16bit(ly.compute_dtype)
    ]  # fmt: skip


def _is_model(layer: Any) -> bool:
    import keras

    return isinstance(layer, keras.Model)


def _has_forward_pass(model: Any) -> bool:
    from mpwatch.record.callbacks.train_step import has_forward_pass

    try:
        return has_forward_pass(model)
    except Exception:  # noqa: BLE001  (as before: the last layer)
        return True


def layer_rows(
    model: Any, traced: dict[int, str] | None = None, widths: dict[int, int] | None = None
) -> list[list[Any]]:
    """The rows of the layer table (columns :data:`COLUMNS`); ``traced`` and ``widths``: output
    dtypes and widths noted while the train step was traced (see :class:`OutputDtypeTracer`)."""
    traced = traced or {}
    outs = output_layers(model)
    graph = graph_columns(model, widths)
    rows = []
    for layer, path, depth in walk(model):
        cls = type(layer).__name__
        policy = getattr(layer, "dtype_policy", None)
        pname = getattr(policy, "name", None) or str(getattr(layer, "dtype", None))
        compute = str(getattr(layer, "compute_dtype", None))
        variable = str(getattr(layer, "variable_dtype", None))
        output = traced.get(id(layer)) or _symbolic_output_dtype(layer)
        effective, note = compute, None
        if cls in FLOAT32_INSIDE and is_16bit(compute):
            effective = "float32"
            note = (
                f"policy {pname} but {cls} normalises in float32 inside (Keras upcasts the "
                f"input) and casts the result to {compute}"
            )
        elif output is not None and output != compute and not sublayers(layer):
            note = f"outputs {output} although it computes in {compute}"
        try:
            params = int(layer.count_params()) if layer.built else 0
        except Exception:  # noqa: BLE001
            params = 0
        trainable = 0
        for w in getattr(layer, "trainable_weights", []) if layer.built else []:
            n = 1
            for d in w.shape:
                n *= int(d)
            trainable += n
        dims = tc_dims(layer)
        aligned = all(v % 8 == 0 for v in dims.values()) if dims else None
        rows.append(
            [
                layer.name,
                path,
                cls,
                depth,
                pname,
                compute,
                variable,
                output,
                effective,
                params,
                trainable,
                dims,
                aligned,
                id(layer) in outs,
                note,
                *graph.get(id(layer), [None, None, None]),
            ]
        )
    return rows


def cast_constants(model: Any) -> dict[str, dict[str, Any]]:
    """Each layer computing in 16 bits whose constants Keras cast to that dtype (an adapted or
    given ``Normalization``: its mean and variance, cast once when it was built, adapted or
    loaded) and that lost features in the cast: ``{"dtype", "features", "lost"}``, ``lost`` the
    features whose cast mean or variance is not finite, or whose variance fell to 0 from a
    positive one (the layer then gives 0, NaN or inf for them). Layers that lost none: absent."""
    import numpy as np
    from keras import ops

    out: dict[str, dict[str, Any]] = {}
    for layer, _, _ in walk(model):
        try:
            if not casts_constants(layer) or not is_16bit(str(layer.compute_dtype)):
                continue
            mean = np.asarray(ops.convert_to_numpy(layer.mean), np.float64).ravel()
            var = np.asarray(ops.convert_to_numpy(layer.variance), np.float64).ravel()
            given = getattr(layer, "input_variance", None)  # else adapted: its float32 weight
            src = given if given is not None else layer.adapt_variance
            src_var = np.broadcast_to(
                np.asarray(ops.convert_to_numpy(src), np.float64).ravel(), var.shape
            )
            lost = ~np.isfinite(mean) | ~np.isfinite(var) | ((var == 0) & (src_var > 0))
            if lost.any():
                out[layer.name] = {
                    "dtype": str(layer.compute_dtype),
                    "features": int(var.size),
                    "lost": int(lost.sum()),
                }
        except Exception:  # noqa: BLE001  (a layer of another shape: nothing to say)
            logger.debug("mpwatch: cast constants of %s unread", layer.name, exc_info=True)
    return out


def class_modules(model: Any) -> dict[str, str]:
    """Each layer class in the table -> the module it is defined in (``keras.src.layers.core.dense``
    for Keras' own, ``__main__`` or the user's package for a custom layer): the judge writes a fix
    as the user's code (``keras.layers.Dense(...)``, but ``LogSumExpPool(...)``)."""
    out: dict[str, str] = {}
    for layer, _, _ in walk(model):
        cls = type(layer)
        out.setdefault(cls.__name__, str(getattr(cls, "__module__", "") or ""))
    return out


def layers_payload(
    model: Any, traced: dict[int, str] | None = None, widths: dict[int, int] | None = None
) -> dict[str, Any]:
    """The ``layers`` record's payload for ``model`` as its layers are now (:func:`layer_rows`,
    each class's module, the constants Keras cast to 16 bits)."""
    payload = {
        "layers": contract.table(COLUMNS, layer_rows(model, traced, widths)),
        "class_modules": class_modules(model),
    }
    lost = cast_constants(model)
    if lost:
        payload["cast_constants"] = lost
    return payload


class OutputDtypeTracer:
    """Wraps the ``call`` of every leaf layer (instance attribute) to note the dtype of what it
    returns while the train step is traced; undone after the first batch."""

    def __init__(self, model: Any) -> None:
        self.dtypes: dict[int, str] = {}
        self.widths: dict[int, int] = {}
        #: id(layer) -> [(shape, dtype)] of each tensor it returns (None where a dim is unknown)
        self.shapes: dict[int, list[tuple[tuple[int | None, ...], str]]] = {}
        self._patched: list[Any] = []
        for layer, _, _ in walk(model):
            if sublayers(layer) or "call" in layer.__dict__:
                continue
            self._patch(layer)

    def _patch(self, layer: Any) -> None:
        import keras

        orig = layer.call
        dtypes, widths, shapes = self.dtypes, self.widths, self.shapes

        def call(*args: Any, **kwargs: Any) -> Any:
            out = orig(*args, **kwargs)
            try:
                flat = keras.tree.flatten(out)
                shapes[id(layer)] = [
                    (tuple(None if d is None else int(d) for d in t.shape),
                     str(keras.backend.standardize_dtype(t.dtype)))
                    for t in flat
                    if hasattr(t, "shape") and hasattr(t, "dtype")
                ]  # fmt: skip
                first = flat[0]
                dtypes[id(layer)] = str(keras.backend.standardize_dtype(first.dtype))
                last = first.shape[-1] if len(first.shape) else None
                if last is not None:
                    widths[id(layer)] = int(last)
            except Exception:  # noqa: BLE001
                pass
            return out

        object.__setattr__(layer, "call", call)
        self._patched.append(layer)

    def undo(self) -> None:
        for layer in self._patched:
            if "call" in layer.__dict__:
                object.__delattr__(layer, "call")
        self._patched = []


class LayerDtypeMonitor(RecordingCallback):
    """Writes the per-layer dtype table (``layers`` record) when training begins, and again only
    when
    it changes (e.g. the first traced step gives a subclassed model's variables and output dtypes).

    Per layer (nested models and the layers inside them, paths like ``"outer/inner/dense"``): name,
    path, class, depth, policy, compute and variable dtype, the actual output dtype (from the
    functional graph, or noted while the train step is traced), the effective dtype
    (LayerNormalization
    and BatchNormalization under ``mixed_float16`` normalise in float32 inside: effective
    ``float32``, with a note), parameter counts, Tensor Core dims (units, filters, input channels,
    kernel input dim) and whether all are multiples of 8, whether it produces a model output, and
    what it takes and gives (:mod:`mpwatch.record.model.layer_graph`): its activation, output width
    and the layers feeding it in Keras' graph.
    Beside the table, ``class_modules``: each layer class's module (Keras' own, or the user's).

    Args:
        log_dir: the run directory.

    Example:
        >>> model.fit(x, y, callbacks=[LayerDtypeMonitor(log_dir="logs/run1")])  # doctest: +SKIP
    """

    part = "layer_dtypes"

    def __init__(self, log_dir: Any, log_every: int = 50) -> None:
        super().__init__(log_dir, log_every)
        self._tracer: OutputDtypeTracer | None = None
        self._last: Any = None
        self._first = False

    def table(
        self, traced: dict[int, str] | None = None, widths: dict[int, int] | None = None
    ) -> dict[str, Any]:
        return layers_payload(self.model, traced, widths)

    def _begin(self) -> None:
        self._last = getattr(self.state, "layers_payload", None)
        self._write_if_changed(self.table(), self.state.step)
        self._tracer = None
        self._first = True

    def _batch_begin(self, batch: int) -> None:
        if self._first:
            self._first = False
            self._tracer = OutputDtypeTracer(self.model)

    def _batch_end(self, got: Any, logs: dict[str, Any]) -> None:
        if self._tracer is not None:
            tracer, self._tracer = self._tracer, None
            tracer.undo()
            self._write_if_changed(self.table(tracer.dtypes, tracer.widths), got.steps[0])
            self._write_memory(tracer.shapes, got.steps[0])

    def quiet_through(self, step: int) -> int:
        """Only the fit's first call is traced (its output dtypes noted)."""
        return step if self._first or self._tracer is not None else ALWAYS_QUIET

    def _write_memory(self, shapes: dict[int, list[Any]], step: int) -> None:
        """The ``memory`` record (:mod:`mpwatch.record.model.memory`), once the first step has built
        the optimizer and noted every leaf layer's outputs."""
        try:
            outputs, batch = memory.layer_outputs(shapes)
            payload = memory.memory_payload(self.model, outputs, batch)
        except Exception as e:  # noqa: BLE001  (a fact mpwatch could not count: no record)
            logger.debug("mpwatch: no memory record: %r", e)
            return
        self.writer.record(contract.KIND_MEMORY, step, payload)

    def _write_if_changed(self, payload: dict[str, Any], step: int) -> None:
        if payload == self._last:
            return
        self.writer.record(contract.KIND_LAYERS, step, payload)
        self._last = payload
        self.state.layers_payload = payload

    def _end(self) -> None:
        if self._tracer is not None:
            self._tracer.undo()
            self._tracer = None
