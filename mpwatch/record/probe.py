"""The probe: which gradient values float16 really loses, measured against a float32 twin.

Every ``every`` batch steps and at the end of each epoch, :class:`ProbeMonitor` takes a fixed probe
batch and, with the model's current weights, computes

- the mixed-precision gradients at the current loss scale ``S``, exactly as Keras' train step gets
  them (``tape.gradient(loss * S)``: float32 values that went through float16, zeros where float16
  underflowed), and the gradients of a float32 twin of the model (:mod:`mpwatch.record.twin`) on the
  same batch with the same weights;
- per variable, per layer and model-wide: the underflow fraction (among elements nonzero in the
  reference, the share that are zero in the mixed gradient), the gradient relative error; per layer:
  output relative error, max ``|activation|`` and its headroom below 65504, the underflow of the
  gradients w.r.t. the layer's output (Sequential and Functional models), and the first layer, in
  forward order, whose output is non-finite;
- the log2 histogram of the reference gradients with the float16 window at ``S``, the predicted
  underflow/overflow at each power-of-two scale, and a recommended scale
  (:mod:`mpwatch.record.underflow`).

Math and definitions: :mod:`mpwatch.record.underflow`. Record layout: ``contract.KIND_PROBE``.

Modes, chosen from the model's layers:

- ``"float16"`` (``mixed_float16``): as above, at the LossScaleOptimizer's current
  ``dynamic_scale``.
- ``"bfloat16"`` (``mixed_bfloat16``): no loss scale (``S = 1``). bfloat16 has float32's range, so
  underflow is rare and still counted the same way; what matters is the relative error (8 bits of
  mantissa). The histogram window is bfloat16's; there is no sweep and no recommended scale.
- ``"preflight"`` (a float32 model): what would happen under ``mixed_float16`` at Keras' initial
  scale ``2**15``. The model itself is the reference, and the same model with its layers switched
  to ``mixed_float16`` is run (real float16 arithmetic, including the activation overflow a float16
  forward pass would hit). Where that pass cannot run, the float32 gradients and activations are
  instead *cast through float16* (``reference_note`` says so): that catches values outside
  float16's range but not errors that float16 arithmetic would accumulate.

**The twin** (:mod:`mpwatch.record.twin`) is not a copy: it is the same model, same variables, same
user code, with its mixed layers switched to float32 for the reference pass (a policy view). So
every model has one: subclassed models, custom layers whose ``__init__`` takes no ``**kwargs``,
``Lambda`` layers. Where a user's layer cannot compute in the other dtype (it raises), the probe
says so once (log and ``notice``, naming the layer class and the code change), records
``reference: "none"`` with a ``reference_note``, and records what can be measured without one: the
share of exactly-zero mixed gradient elements (``model.zero_fraction``, an upper bound of
underflow that includes genuine zeros), activations, non-finite layers, and a histogram of the
mixed gradients.

**The train step's network.** Both passes run in training mode, as Keras' train step does:
BatchNormalization normalises with the batch's statistics (its moving statistics, and the loss
trackers that ``compute_loss`` updates, one per output of a multi-output model, are read first and
written back afterwards, inside the traced function, so the probe never changes what the user sees).
Layers that draw random numbers (Dropout, GaussianNoise, random augmentation: any layer owning a
``SeedGenerator``) run as in inference in *both* passes (``random_layers_off`` in the record), so
the two passes compute the same network and a probe is deterministic. The loss is the model's own
``compute_loss`` (the compiled loss plus the model's losses). As a check, the model's own call in
training mode gives the train step's loss on the probe batch with the same weights
(``model.train_loss``); when it disagrees with the probe's pass in the model's own policies by more
than ``LOSS_RTOL`` (relative), the record says ``reliable: false`` with the reason and no finding
rests on that probe (a model whose ``call`` is not its layer graph, a custom ``train_step``).

**Cost.** One probe runs one forward and backward pass of the model in its own policies, one in the
other policy, and (for Functional and Sequential models) one forward pass of the model's own call
for the loss check, on the probe batch, plus per-tensor reductions; all traced once (the first
probe pays the trace). ``benchmarks/probe_cost.py`` measures it in units of one training step.
No second copy of the weights is kept. With the default ``every=500`` the overhead is well under
1% of training time.

Example:
    >>> import keras, numpy as np, mpwatch  # doctest: +SKIP
    >>> keras.mixed_precision.set_global_policy("mixed_float16")  # doctest: +SKIP
    >>> model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])  # doctest: +SKIP
    >>> model.compile("adam", "mse")  # doctest: +SKIP
    >>> x, y = np.ones((32, 8), "float32"), np.ones((32, 4), "float32")  # doctest: +SKIP
    >>> probe = mpwatch.ProbeMonitor(log_dir="logs/run1", every=100)  # doctest: +SKIP
    >>> model.fit(x, y, epochs=2, callbacks=[probe])  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from mpwatch import contract, formats
from mpwatch.record import underflow
from mpwatch.record.base import RecordingCallback, check_positive_int
from mpwatch.record.inputs import INPUT_COLUMNS, input_rows
from mpwatch.record.twin import (
    PolicyView,
    backend_value,
    model_kind,
    random_layers,
    random_layers_off,
    state_variables,
)
from mpwatch.record.writer import RunWriter

logger = logging.getLogger("mpwatch")

VARIABLE_COLUMNS = contract.PROBE_VARIABLE_COLUMNS
LAYER_COLUMNS = contract.PROBE_LAYER_COLUMNS
SWEEP_COLUMNS = contract.PROBE_SWEEP_COLUMNS


def detect_mode(model: Any) -> str:
    """``"float16"``, ``"bfloat16"`` or ``"preflight"`` from the layers' compute dtypes."""
    dtypes = {getattr(layer, "compute_dtype", None) for layer in model._flatten_layers()}
    if "float16" in dtypes:
        return "float16"
    if "bfloat16" in dtypes:
        return "bfloat16"
    return "preflight"


def split_data(data: Any) -> tuple[Any, Any, Any]:
    """(x, y, sample_weight) of a batch given as x, (x,), (x, y) or (x, y, sample_weight)."""
    if isinstance(data, tuple):
        if len(data) == 1:
            return data[0], None, None
        if len(data) == 2:
            return data[0], data[1], None
        if len(data) == 3:
            return data
        raise ValueError(f"mpwatch: probe data is a tuple of {len(data)}; expected (x, y[, sw])")
    return data, None, None


def first_batch(data: Any) -> Any:
    """A tf.data.Dataset's first element (as numpy arrays on Keras' JAX backend), else data."""
    if not type(data).__module__.startswith("tensorflow"):
        return data
    import tensorflow as tf

    if not isinstance(data, tf.data.Dataset):
        return data
    batch = next(iter(data.take(1)))
    from mpwatch.record import backend

    if backend.name() == backend.TENSORFLOW:
        return batch
    return tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, batch)


def _round(x: Any, digits: int = 6) -> Any:
    """A float with ``digits`` significant digits (smaller records); ints and non-finite as is."""
    if isinstance(x, float) and math.isfinite(x) and x != 0.0:
        return float(f"{x:.{digits}g}")
    return x


_value = backend_value  # (their old names here)
_state_variables = state_variables


#: the probe agrees with the train step when its loss (the pass in the model's own policies)
#: is within this relative tolerance of the train step's loss on the same batch and weights
LOSS_RTOL = 1e-2
#: ... or within this absolute tolerance (losses near 0)
LOSS_ATOL = 1e-4


def loss_agrees(probe_loss: float, train_loss: float) -> tuple[bool, str | None]:
    """(whether the probe's loss matches the train step's loss, and why not). Both non-finite
    the same way (a diverged model) counts as agreement: the probe sees the same network."""
    a, b = probe_loss, train_loss
    if not (math.isfinite(a) and math.isfinite(b)):
        same = (math.isnan(a) and math.isnan(b)) or a == b
        return same, None if same else f"probe loss {a} but train-step loss {b}"
    if abs(a - b) <= LOSS_ATOL + LOSS_RTOL * max(abs(a), abs(b)):
        return True, None
    return False, (
        f"probe loss {a:.6g} but the train step's loss on the same batch and weights is "
        f"{b:.6g} (tolerance {LOSS_RTOL:g} relative): the probe does not measure the network "
        "the train step runs, so no finding rests on it"
    )


def _custom_train_step(model: Any) -> bool:
    """Whether the model's class overrides Keras' train_step (of the backend's trainer)."""
    from mpwatch.record import backend

    try:
        if backend.name() == backend.JAX:
            from keras.src.backend.jax.trainer import JAXTrainer as Trainer
        else:
            from keras.src.backend.tensorflow.trainer import TensorFlowTrainer as Trainer
    except ImportError:  # pragma: no cover
        return False
    return getattr(type(model), "train_step", None) is not Trainer.train_step


def _batch_size(x: Any) -> int | None:
    """The leading dimension of the batch's first tensor."""
    import keras

    for t in keras.tree.flatten(x):
        shape = getattr(t, "shape", None)
        if shape is not None and len(shape) and shape[0] is not None:
            return int(shape[0])
    return None


def _failing_layer(error: Exception) -> str | None:
    """The layer class Keras names in an exception raised inside a layer's call."""
    import re

    m = re.search(r"calling (\w+)\.call\(\)", str(error))
    return m.group(1) if m else None


class Probe:
    """One model's probe, usable without ``fit`` (custom training loops).

    ``Probe(model, loss_fn=None)``: ``loss_fn(y_true, y_pred) -> scalar`` defaults to the model's
    compiled loss; the model's own regularization losses are added either way.
    ``run(data, scale=None)`` returns the ``probe`` record payload (``scale`` defaults to the
    LossScaleOptimizer's current scale; 1 under bfloat16; ``2**15`` in a pre-flight);
    ``write(writer, step, payload)`` writes it with its scalars.

    Example (a custom loop):
        >>> probe = Probe(model)  # doctest: +SKIP
        >>> payload = probe.run((x, y))  # doctest: +SKIP
        >>> probe.write(RunWriter("logs/run1"), step, payload)  # doctest: +SKIP
    """

    def __init__(
        self,
        model: Any,
        loss_fn: Any = None,
        mode: str | None = None,
        margin_bits: float = underflow.DEFAULT_MARGIN_BITS,
    ) -> None:
        self.model = model
        self.loss_fn = loss_fn
        self.mode = mode or detect_mode(model)
        if self.mode not in ("float16", "bfloat16", "preflight"):
            raise ValueError(
                f"mpwatch: probe mode must be float16, bfloat16 or preflight: {mode!r}"
            )
        self.margin_bits = margin_bits
        self.fmt = formats.BFLOAT16 if self.mode == "bfloat16" else formats.FLOAT16
        self.reference = "none"
        self.note: str | None = None
        self.kind = model_kind(model)
        self._fn = None
        self._prepared = False
        self.view: PolicyView | None = None
        self.random_off: list[Any] = []

    # --- setup ---------------------------------------------------------------------------------
    def _prepare(self) -> None:
        self._prepared = True
        # the twin is the same model under another policy (record/twin.py): always available
        target = "mixed_float16" if self.mode == "preflight" else "float32"
        self.view = PolicyView(self.model, target)
        self.reference = "float32_twin"
        self.random_off = random_layers(self.model)
        if self.mode == "preflight":
            self.note = (
                "pre-flight: the float32 model is the reference; the same model with its layers "
                "switched to mixed_float16 was run at scale "
                f"2**{int(math.log2(formats.KERAS_INITIAL_SCALE))}"
            )
        self.layer_names, self.tap = self._taps()
        self.tapped_layers = self._tapped_layers if self.tap is not None else []
        self._var_layer = self._variable_layers()

    def _fall_back(self, error: Exception) -> None:
        """The view's pass failed to trace: no twin; say which layer class and the fix."""
        layer = _failing_layer(error)
        where = f"{layer} " if layer else ""
        target = self.view.policy if self.view is not None else "float32"
        fix = (
            f"make {layer}.call compute in self.compute_dtype (no hard-coded dtype)"
            if layer
            else "make the custom layers' call() compute in self.compute_dtype"
        )
        self.view = None
        if self.mode == "preflight":
            self.note = (
                f"pre-flight without a mixed pass: {where}failed under {target} "
                f"({type(error).__name__}); float32 gradients and activations were cast through "
                f"float16 at the scale instead. Fix: {fix}"
            )
        else:
            self.reference = "none"
            self.note = (
                f"no float32 reference: {where}failed under {target} ({type(error).__name__}); "
                "underflow cannot be told from genuine zeros (model.zero_fraction counts all "
                f"zeros of the mixed gradient). Fix: {fix}"
            )
        logger.warning("mpwatch: probe: %s", self.note)

    def _taps(self) -> tuple[list[str], Any]:
        """(layer names, multi-output model: the outputs then every layer's outputs)."""
        self._tapped_layers: list[Any] = []
        if self.kind == "subclassed":
            return [], None
        try:
            import keras

            m = self.model
            layers = [ly for ly in m.layers if type(ly).__name__ != "InputLayer"]
            outs = []
            self._act_layer_index = []
            for i, ly in enumerate(layers):
                for t in keras.tree.flatten(ly.output):
                    outs.append(t)
                    self._act_layer_index.append(i)
            tap = keras.Model(m.inputs, list(m.outputs) + outs)
            self._tapped_layers = layers
            return [ly.name for ly in layers], tap
        except Exception as e:  # noqa: BLE001  (a shared layer, an unbuilt Sequential, ...)
            logger.info("mpwatch: probe: no per-layer activations for %s: %r", self.model.name, e)
            return [], None

    def _variable_layers(self) -> list[str]:
        owner = {}
        for ly in self.model.layers:
            for v in ly.trainable_variables:
                owner.setdefault(id(v), ly.name)
        out = []
        for v in self.model.trainable_variables:
            path = getattr(v, "path", None) or v.name
            out.append(owner.get(id(v), path.rsplit("/", 1)[0]))
        return out

    # --- the traced computation ------------------------------------------------------------------
    def _loss(self, x: Any, y: Any, y_pred: Any, sw: Any) -> Any:
        """The loss as Keras' train step computes it (``model._compute_loss``, which adds the
        model's own losses), or ``loss_fn`` plus the model's losses."""
        from keras import ops

        m = self.model
        if self.loss_fn is not None:
            loss = ops.cast(self.loss_fn(y, y_pred), "float32")
            for extra in m.losses:
                loss = loss + ops.cast(extra, "float32")
            return loss
        compute = getattr(m, "_compute_loss", None) or m.compute_loss
        loss = compute(x=x, y=y, y_pred=y_pred, sample_weight=sw, training=True)
        return ops.cast(loss, "float32")

    def _pack(self, flat: list[Any]) -> Any:
        if len(flat) == 1:
            return flat[0]
        import keras

        fm = getattr(self.model, "_functional", None) or self.model
        struct = getattr(fm, "_outputs_struct", None)
        return keras.tree.pack_sequence_as(struct, flat) if struct is not None else flat

    def _forward_backward(self, x: Any, y: Any, sw: Any, scale: Any) -> dict:
        """One training-mode pass (BatchNormalization on the batch's statistics) of the model as
        the current policies are: loss, gradients w.r.t. the variables and the layer outputs."""
        import tensorflow as tf

        m = self.model
        with tf.GradientTape() as tape:
            if self.tap is not None:
                outs = self.tap(x, training=True)
                n_out = len(m.outputs)
                y_pred, acts = self._pack(outs[:n_out]), outs[n_out:]
            else:
                y_pred, acts = m(x, training=True), []
            loss = self._loss(x, y, y_pred, sw)
            scaled = loss * tf.cast(scale, tf.float32)
        variables = m.trainable_variables
        float_acts = [a for a in acts if a.dtype.is_floating]
        grads = tape.gradient(scaled, list(variables) + float_acts)
        n = len(variables)
        return {
            "loss": loss,
            "grads": grads[:n],
            "acts": acts,
            "act_grads": self._spread(acts, float_acts, grads[n:]),
        }

    def _train_step_loss(self, x: Any, y: Any, sw: Any) -> Any:
        """The loss Keras' train step computes on this batch with these weights: the model's own
        call in training mode, in its own policies (random layers off, as in the probe)."""
        if self.tap is None:
            return None  # the probe's own pass *is* the model's call
        return self._loss(x, y, self.model(x, training=True), sw)

    @staticmethod
    def _spread(acts: list, float_acts: list, grads: list) -> list:
        it = iter(grads)
        return [next(it) if a.dtype.is_floating else None for a in acts]

    def _passes(
        self, x: Any, y: Any, sw: Any, scale: Any, fb: Any = None, train_loss_fn: Any = None
    ) -> tuple[dict, dict | None, Any]:
        """(low pass, reference pass or None, train-step loss): traced inside the probe's
        function, with the random layers off and the view switched around the right pass.
        ``fb(x, y, sw, scale)`` and ``train_loss_fn()`` are the backend's pass and train-step
        loss (default TensorFlow's; :mod:`mpwatch.record.probe_jax` gives JAX's)."""
        view = self.view
        fb = fb or self._forward_backward
        train_loss_fn = train_loss_fn or (lambda: self._train_step_loss(x, y, sw))
        with random_layers_off(self.random_off):
            if self.mode == "preflight":
                ref = fb(x, y, sw, 1.0)
                train_loss = train_loss_fn()
                low = self._in_view(view, x, y, sw, scale, fb)
            else:
                low = fb(x, y, sw, scale)
                train_loss = train_loss_fn()
                ref = self._in_view(view, x, y, sw, 1.0, fb)
        return low, ref, train_loss

    def _in_view(
        self, view: PolicyView | None, x: Any, y: Any, sw: Any, scale: Any, fb: Any
    ) -> Any:
        """The pass under the other policy, or None (no view, or the pass failed to trace: a
        user's layer that cannot compute in the other dtype; :meth:`_fall_back` says which)."""
        if view is None:
            return None
        try:
            with view:
                return fb(x, y, sw, scale)
        except Exception as e:  # noqa: BLE001
            self._fall_back(e)
            return None

    def _build_fn(self) -> Any:
        from mpwatch.record import backend

        if backend.name() == backend.JAX:
            from mpwatch.record.probe_jax import JaxProbeFunction

            return JaxProbeFunction(self)
        import tensorflow as tf

        model = self.model

        def fn(x: Any, y: Any, sw: Any, scale: Any) -> dict:
            # the passes run the model's own code, which updates state the user sees:
            # BatchNormalization's moving statistics and seed states (training mode), and the
            # loss trackers (Keras' compute_loss updates a Mean per output of a multi-output
            # model, which History reports as "<output>_loss"; a user's compute_loss may update
            # its own). Read all of it first, write it back last (ordered by TensorFlow's
            # automatic control dependencies on each variable): the probe never changes the model
            state = _state_variables(model)
            saved = [tf.identity(_value(v)) for v in state]
            out = self._stats(x, y, sw, scale)
            for v, s in zip(state, saved):
                _value(v).assign(s)
            # (trackers the first trace creates, building the compiled loss before any train
            # step, are in `state` too: TensorFlow traces a function that creates variables again)
            return out

        # autograph off, as in Keras' own train function: mpwatch's ops and Keras' layers have no
        # Python control flow on tensors, and converting every function the trace calls cost
        # most of the probe's first call (3 of 4 s on keras.io's Transformer, on 2 CPU cores)
        return tf.function(fn, reduce_retracing=True, autograph=False)

    def _stats(self, x: Any, y: Any, sw: Any, scale: Any) -> dict:
        import tensorflow as tf

        low, ref, train_loss = self._passes(x, y, sw, scale)
        out = {}
        has_ref = self.mode == "preflight" or ref is not None
        if low is None:  # pre-flight without a mixed pass: cast the reference through float16
            low = {
                "loss": ref["loss"],
                "grads": [
                    None if g is None else underflow.cast_through(g, "float16", scale)
                    for g in ref["grads"]
                ],
                "acts": [underflow.cast_through(a, "float16") for a in ref["acts"]],
                "act_grads": [
                    None if g is None else underflow.cast_through(g, "float16", scale)
                    for g in ref["act_grads"]
                ],
            }
        out["loss"] = low["loss"]
        out["ref_loss"] = ref["loss"] if has_ref else low["loss"]
        own = ref if self.mode == "preflight" else low  # the pass in the model's own policies
        out["train_loss"] = own["loss"] if train_loss is None else train_loss
        out["own_loss"] = own["loss"]
        if has_ref:
            ref_grads = ref["grads"]
        else:  # no reference: stats of the mixed gradients against themselves (unscaled)
            ref_grads = [
                None if g is None else tf.cast(g, tf.float32) / scale for g in low["grads"]
            ]
        out["grads"] = underflow.grad_table(low["grads"], ref_grads, scale)
        out["hist"], out["zeros"] = underflow.histogram_and_zeros(ref_grads)
        out["acts"] = underflow.activation_table(low["acts"], ref["acts"] if has_ref else None)
        if has_ref:
            out["act_grads"] = underflow.act_grad_table(low["act_grads"], ref["act_grads"])
        return out

    # --- one probe -------------------------------------------------------------------------------
    def current_scale(self) -> float:
        """The scale a probe uses when none is given (see the class doc)."""
        if self.mode == "bfloat16":
            return 1.0
        if self.mode == "preflight":
            return formats.KERAS_INITIAL_SCALE
        opt = getattr(self.model, "optimizer", None)
        ds = getattr(opt, "dynamic_scale", None)
        if ds is not None and getattr(opt, "built", True):
            from mpwatch.record import backend

            if backend.name() == backend.JAX:  # during fit the value lives in Keras' state
                from mpwatch.record.probe_jax import optimizer_value

                return float(np.asarray(optimizer_value(self.model, ds)))
            return float(np.asarray(ds.numpy() if hasattr(ds, "numpy") else ds))
        if ds is not None:
            return float(getattr(opt, "initial_scale", formats.KERAS_INITIAL_SCALE))
        return 1.0

    @property
    def has_ref(self) -> bool:
        """Whether the gradients are compared with a float32 reference pass."""
        return self.mode == "preflight" or self.view is not None

    def run(
        self, data: Any, scale: float | None = None, batch_source: str = "probe_data"
    ) -> dict[str, Any]:
        """Probe on one batch ``(x, y[, sample_weight])`` (or a dataset: its first batch).
        ``batch_source``: ``"training"`` when the batch is one the training loop fed (the
        record's batch size is then the training batch size)."""
        x, y, sw = split_data(first_batch(data))
        if not self._prepared:
            self._prepare()
            self._fn = self._build_fn()
        s = float(self.current_scale() if scale is None else scale)
        from mpwatch.record import backend

        if backend.name() == backend.JAX:
            out = self._fn(x, y, sw, s)  # already the host tables
        else:
            import tensorflow as tf

            out = self._fn(x, y, sw, tf.constant(s, tf.float32))
            out = {k: np.asarray(v) for k, v in out.items()}
        payload = self._payload(out, s)
        payload["batch"] = {"size": _batch_size(x), "source": batch_source}
        payload["inputs"] = contract.table(INPUT_COLUMNS, input_rows(self.model, x, self.mode))
        head = payload["model"].get("activation_headroom_bits")
        near = isinstance(head, (int, float)) and head < fix_check_headroom()
        if self.mode == "float16" and (payload["model"].get("first_nonfinite_layer") or near):
            from mpwatch.record.fix_check import check_fixes

            try:
                payload["fix_checks"] = check_fixes(self, x, y, sw, s, _blamed(payload))
            except Exception as e:  # noqa: BLE001  (the probe's record stands without them)
                logger.warning("mpwatch: probe: could not check the fixes: %r", e)
        if self.mode == "float16" and self.has_ref and not payload["model"].get(
            "first_nonfinite_layer"
        ):
            from mpwatch.record.fix_check import check_gradient_fixes

            try:
                checks = check_gradient_fixes(self, x, y, sw, s, _layer_grad_errors(payload))
                if checks:
                    payload["grad_fix_checks"] = checks
            except Exception as e:  # noqa: BLE001
                logger.warning("mpwatch: probe: could not check the gradient fixes: %r", e)
        return payload

    def _payload(self, out: dict[str, np.ndarray], scale: float) -> dict[str, Any]:
        has_ref = self.has_ref
        grads = out["grads"]
        names = [getattr(v, "path", None) or v.name for v in self.model.trainable_variables]
        var_rows = [
            [
                name,
                layer,
                s["size"],
                s["ref_nonzero"] if has_ref else None,
                s["underflow_count"] if has_ref else None,
                _round(s["underflow_fraction"]) if has_ref else None,
                _round(s["grad_rel_error"]) if has_ref else None,
                _round(s["max_abs_ref"]) if has_ref else None,
            ]
            for name, layer, s in zip(names, self._var_layer, underflow.summarize_each(grads))
        ]
        # per layer: gradients grouped by owning layer, activations by the tap's layer index
        order = list(self.layer_names)
        var_index: dict[str, list[int]] = {}
        for i, layer in enumerate(self._var_layer):
            var_index.setdefault(layer, []).append(i)
        known = set(order)
        order += [layer for layer in var_index if layer not in known]
        acts = out["acts"]
        act_layer = getattr(self, "_act_layer_index", [])
        act_by_layer: dict[str, np.ndarray] = {}
        for i, row in enumerate(acts):
            name = self.layer_names[act_layer[i]]
            act_by_layer.setdefault(name, []).append(row)
        ag = out.get("act_grads")
        ag_by_layer: dict[str, list] = {}
        if ag is not None:
            for i, row in enumerate(ag):
                ag_by_layer.setdefault(self.layer_names[act_layer[i]], []).append(row)
        layer_rows = []
        first_nonfinite = None
        max_act_all = 0.0
        for name in order:
            rows = grads[var_index.get(name, [])]
            g = underflow.summarize_grads(rows)
            a = np.asarray(act_by_layer.get(name, np.zeros((0, 6))))
            if len(a):
                out_err = underflow.rel_error(
                    a[:, underflow.A_ERR_SQ].sum(), a[:, underflow.A_REF_SQ].sum()
                )
                max_act = float(a[:, underflow.A_MAX_MIXED].max())
                act_nonfinite = int(a[:, underflow.A_NONFINITE].sum())
                max_act_all = max(max_act_all, max_act)
            else:
                out_err, max_act, act_nonfinite = None, None, 0
            agr = np.asarray(ag_by_layer.get(name, np.zeros((0, 4))))
            ag_frac = (
                underflow.fraction(
                    agr[:, underflow.AG_UNDERFLOW].sum(), agr[:, underflow.AG_REF_NONZERO].sum()
                )
                if len(agr)
                else None
            )
            nonfinite = act_nonfinite + g["nonfinite"]
            if act_nonfinite and first_nonfinite is None:
                first_nonfinite = name
            layer_rows.append(
                [
                    name,
                    g["ref_nonzero"] if has_ref and len(rows) else None,
                    g["underflow_count"] if has_ref and len(rows) else None,
                    _round(g["underflow_fraction"]) if has_ref and len(rows) else None,
                    _round(g["grad_rel_error"]) if has_ref and len(rows) else None,
                    _round(out_err) if has_ref and out_err is not None else None,
                    _round(max_act) if max_act is not None else None,
                    _round(underflow.headroom_bits(max_act, self.fmt))
                    if max_act is not None
                    else None,
                    _round(ag_frac) if ag_frac is not None else None,
                    nonfinite,
                ]
            )
        if first_nonfinite is None:
            # no activation went non-finite (or none was measured): the loss itself, else the
            # first layer in backward order (where backprop starts) with a non-finite gradient
            if not np.isfinite(out["loss"]):
                first_nonfinite = "loss"
            for layer, row in zip(self._var_layer[::-1], grads[::-1]):
                if first_nonfinite is not None:
                    break
                if row[underflow.G_NONFINITE] > 0:
                    first_nonfinite = layer
        m = underflow.summarize_grads(grads)
        model = {
            "ref_nonzero": m["ref_nonzero"] if has_ref else None,
            "underflow_count": m["underflow_count"] if has_ref else None,
            "underflow_fraction": m["underflow_fraction"] if has_ref else None,
            "grad_rel_error": m["grad_rel_error"] if has_ref else None,
            "max_abs_activation": max_act_all if len(acts) else None,
            "first_nonfinite_layer": first_nonfinite,
            "size": m["size"],
            "nonfinite": m["nonfinite"],
            "loss": float(out["loss"]),
            "ref_loss": float(out["ref_loss"]) if has_ref else None,
            "train_loss": float(out["train_loss"]),
            "activation_headroom_bits": (
                underflow.headroom_bits(max_act_all, self.fmt) if len(acts) else None
            ),
        }
        if not has_ref:
            model["zero_fraction"] = underflow.fraction(float(out["zeros"]), m["size"])
        hist = underflow.histogram(
            out["hist"], scale if self.mode != "bfloat16" else None, self.fmt
        )
        hist["zeros"] = int(out["zeros"])
        hist["source"] = "reference" if has_ref else "mixed_unscaled"
        sweep_rows: list[list[float]] = []
        recommended = None
        if self.mode != "bfloat16":
            sweep_rows = underflow.sweep(out["hist"])
            max_all = m["max_abs_ref"]
            if ag is not None and len(ag):
                max_all = max(max_all, float(ag[:, underflow.AG_MAX_REF].max()))
            recommended = underflow.recommend_scale(max_all, margin_bits=self.margin_bits)
            model["max_abs_ref_grad"] = max_all
            model["margin_bits"] = self.margin_bits
        reliable, why = loss_agrees(float(out["own_loss"]), float(out["train_loss"]))
        if reliable and _custom_train_step(self.model):
            reliable = None
            why = (
                f"{type(self.model).__name__} overrides train_step: the probe computes the "
                "compiled loss, which may not be what the train step minimises"
            )
        return {
            "mode": self.mode,
            "reliable": reliable,
            "unreliable_reason": why,
            "random_layers_off": [ly.name for ly in self.random_off],
            "loss_scale": scale if self.mode != "bfloat16" else None,
            "reference": self.reference,
            "reference_note": self.note,
            "model_kind": self.kind,
            "variables": contract.table(VARIABLE_COLUMNS, var_rows),
            "layers": contract.table(LAYER_COLUMNS, layer_rows),
            "model": model,
            "histogram": hist,
            "sweep": contract.table(SWEEP_COLUMNS, sweep_rows),
            "recommended_scale": recommended,
        }

    @staticmethod
    def scalars(payload: dict[str, Any]) -> dict[str, float]:
        """The probe's scalars (only those that exist in this mode)."""
        m = payload["model"]
        out = {}
        if m.get("underflow_fraction") is not None:
            out[contract.PROBE_UNDERFLOW_FRACTION] = m["underflow_fraction"]
        if m.get("grad_rel_error") is not None:
            out[contract.PROBE_GRAD_REL_ERROR] = m["grad_rel_error"]
        if payload.get("recommended_scale") is not None:
            out[contract.PROBE_RECOMMENDED_SCALE] = payload["recommended_scale"]
        if m.get("activation_headroom_bits") is not None:
            out[contract.PROBE_ACTIVATION_HEADROOM_BITS] = m["activation_headroom_bits"]
        return out

    @staticmethod
    def write(writer: RunWriter, step: int, payload: dict[str, Any]) -> int:
        """Write the record and the scalars; returns the record's bytes. A record over
        ``contract.MAX_RECORD_BYTES`` (tens of thousands of variables) is written in parts: its
        variables table moves to further ``probe`` records at the same step (``RunWriter.record``).
        """
        size = writer.record(contract.KIND_PROBE, step, payload)
        writer.scalars(step, Probe.scalars(payload))
        return size


class ProbeMonitor(RecordingCallback):
    """Probe gradient underflow against a float32 twin every ``every`` steps and each epoch's end.

    Args:
        log_dir: the run's log directory (shared with the other mpwatch callbacks).
        every: probe every this many batch steps (and at the end of each epoch). Default 500.
        probe_data: the fixed probe batch: ``(x, y)``, ``(x, y, sample_weight)`` or a
            ``tf.data.Dataset`` (its first batch is taken once, at ``on_train_begin``). Default: the
            first training batch of the first ``fit``, taken from the train function's input as it
            passes and kept for the run (nothing per step; no extra trace of the train function
            on one device, one under a ``tf.distribute`` strategy of one replica).
        loss_fn: ``loss_fn(y_true, y_pred) -> scalar``; default the model's compiled loss.
        margin_bits: headroom (in doublings below 65504) the recommended scale keeps; default 4.
        on_epoch_end_probe: also probe at each epoch's end (default True).

    What it costs and computes: see the module docstring (one probe is about two training steps
    of compute; memory for a float32 copy of the weights).
    """

    part = "probe"

    def __init__(
        self,
        log_dir: Any,
        every: int = 500,
        probe_data: Any = None,
        loss_fn: Any = None,
        margin_bits: float = underflow.DEFAULT_MARGIN_BITS,
        on_epoch_end_probe: bool = True,
    ) -> None:
        super().__init__(log_dir)
        self.every = check_positive_int("every", every)
        if loss_fn is not None and not callable(loss_fn):
            raise ValueError(f"mpwatch: loss_fn must be callable, got {loss_fn!r}")
        self.probe_data = probe_data
        self.loss_fn = loss_fn
        self.margin_bits = float(margin_bits)
        self.on_epoch_end_probe = bool(on_epoch_end_probe)
        self.probe: Probe | None = None
        self._data = None
        self._last_probe_step: int | None = None
        self._wrapped_train_function = None
        self.payloads: list[tuple[int, dict]] = []  # the last few, for inspection
        self.keep = 3

    # --- Keras hooks (via RecordingCallback) -----------------------------------------------------
    def _begin(self) -> None:
        from mpwatch.record.train_step import has_forward_pass

        self._off = not has_forward_pass(self.model)
        if self._off:  # said once per run, as what it is: nothing to probe, not a failure
            told = getattr(self.state, "notices", set())
            if self.part not in told:
                told.add(self.part)
                self.state.notices = told
                self._notice(
                    self.part,
                    "info",
                    f"no probe: {type(self.model).__name__} has no call() of its own (its "
                    "train_step runs other models), and the float32-reference probe runs the "
                    "model's forward pass; the train step's contract is still checked",
                )
            return
        if self.probe is None or self.probe.model is not self.model:
            self.probe = Probe(self.model, self.loss_fn, margin_bits=self.margin_bits)
        if self._data is None and self.probe_data is not None:
            self._data = first_batch(self.probe_data)

    def _batch_begin(self, batch: int) -> None:
        if getattr(self, "_off", False):
            return
        if self._data is None and self._wrapped_train_function is None:
            self._capture_next_batch()

    def _capture_next_batch(self) -> None:
        """Wrap ``model.train_function`` for one call: take the batch it would take, keep a copy,
        and run the step on it through Keras' own per-batch path."""
        import itertools

        from mpwatch.record import backend

        model = self.model
        original = model.train_function
        if original is None:
            return
        monitor = self
        spe = int(getattr(model, "steps_per_execution", 1) or 1)
        if backend.name() == backend.JAX:
            # Keras' JAX loop calls train_function(state, iterator); the iterator yields numpy
            # (or jax) batches, and the step takes up to spe of them with next()
            import keras

            def capture(state: Any, iterator: Any) -> Any:
                model.train_function = original
                monitor._wrapped_train_function = None
                data = next(iterator)
                monitor._data = keras.tree.map_structure(np.array, data)
                return original(state, itertools.chain([data], iterator))

            self._wrapped_train_function = capture
            model.train_function = capture
            return
        import tensorflow as tf

        if model.distribute_strategy.num_replicas_in_sync > 1:
            raise ValueError(
                "no probe_data given and training is distributed: pass probe_data=(x, y)"
            )

        def capture(iterator: Any) -> Any:
            model.train_function = original
            monitor._wrapped_train_function = None
            if not isinstance(iterator, tf.data.Iterator):  # Keras steps a Python iterator eagerly
                try:
                    data = next(iter(iterator))
                except (StopIteration, tf.errors.OutOfRangeError):
                    raise StopIteration from None
                monitor._data = _copy_tensors(data)
                rest = itertools.islice(iterator, spe - 1) if spe > 1 else ()
                return original(itertools.chain([data], rest))
            # take this call's batches, keep the first, and hand Keras a tf.data iterator over
            # them with the very element spec of Keras' own: the train function is traced once,
            # for both (a Python iterator, or a spec of concrete shapes, would trace it again)
            batches = []
            for _ in range(spe):
                got = iterator.get_next_as_optional()
                if not got.has_value():
                    break
                batches.append(got.get_value())
            if not batches:
                raise StopIteration
            monitor._data = _copy_tensors(batches[0])
            taken = tf.data.Dataset.from_generator(
                lambda: iter(batches), output_signature=iterator.element_spec
            )
            return original(iter(taken))

        self._wrapped_train_function = capture
        model.train_function = capture

    def _batch_end(self, got: Any, logs: dict[str, Any]) -> None:
        if any(s % self.every == 0 for s in got.steps):
            self._probe(got.last_step)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if self._active and self._begun and self.on_epoch_end_probe:
            self._guard(self.part, self._probe, self._step())

    def _end(self) -> None:
        if self._wrapped_train_function is not None:
            if self.model.train_function is self._wrapped_train_function:
                self.model.train_function = None
            self._wrapped_train_function = None

    # --- probing ---------------------------------------------------------------------------------
    def _probe(self, step: int | None) -> None:
        if step is None or step == self._last_probe_step or self._data is None:
            return
        if getattr(self, "_off", False):
            return
        self._last_probe_step = step
        source = "probe_data" if self.probe_data is not None else "training"
        payload = self.probe.run(self._data, batch_source=source)
        if self.probe.reference == "none" and not getattr(self, "_noted", False):
            self._noted = True
            self._notice(self.part, "info", self.probe.note or "no float32 reference")
        Probe.write(self.writer, step, payload)
        self.payloads = (self.payloads + [(step, payload)])[-self.keep :]


def fix_check_headroom() -> float:
    """The headroom (doublings below float16's maximum) under which a probe checks fixes."""
    from mpwatch.record.fix_check import HEADROOM_BITS

    return float(HEADROOM_BITS)


def _layer_grad_errors(payload: dict[str, Any]) -> dict[str, float]:
    """Each layer's gradient relative error in a probe payload (layers with weights)."""
    table = payload.get("layers") or {}
    cols = list(table.get("columns") or [])
    if "layer" not in cols or "grad_rel_error" not in cols:
        return {}
    i, j = cols.index("layer"), cols.index("grad_rel_error")
    return {
        str(r[i]): float(r[j])
        for r in table.get("data") or []
        if isinstance(r[j], (int, float)) and math.isfinite(r[j])
    }


def _blamed(payload: dict[str, Any]) -> list[str]:
    """The layers a probe blames, for the fix checks: its first non-finite layer, then (forward
    order) those whose activations come within 3 doublings of float16's maximum."""
    first = payload["model"].get("first_nonfinite_layer")
    out = [str(first)] if first and first != "loss" else []
    table = payload.get("layers") or {}
    cols = list(table.get("columns") or [])
    if "layer" in cols and "max_abs_activation" in cols:
        i, j = cols.index("layer"), cols.index("max_abs_activation")
        for row in table.get("data") or []:
            mx = row[j]
            if isinstance(mx, (int, float)) and mx > formats.FLOAT16.max / 8 and row[i] not in out:
                out.append(str(row[i]))
    return out


def _copy_tensors(data: Any) -> Any:
    """A copy of a batch's tensors, kept for the probe after the step has used them."""
    import tensorflow as tf

    return tf.nest.map_structure(lambda t: tf.identity(t) if isinstance(t, tf.Tensor) else t, data)
