"""The probe: which gradient values float16 really loses, measured against a float32 twin.

Every ``every`` batch steps and at the end of each epoch, ``ProbeMonitor``
(:mod:`mpwatch.record.callbacks.probe_monitor`) takes a fixed probe batch and :class:`Probe`, with
the model's current weights, computes

- the mixed-precision gradients at the current loss scale ``S``, exactly as Keras' train step gets
  them (``tape.gradient(loss * S)``: float32 values that went through float16, zeros where float16
  underflowed), and the gradients of a float32 twin of the model (below) on the same batch;
- per variable, per layer and model-wide: the underflow fraction (among elements nonzero in the
  reference, the share that are zero in the mixed gradient), the gradient relative error; per layer:
  output relative error, max ``|activation|`` and its headroom below 65504, the underflow of the
  gradients w.r.t. the layer's output (Sequential and Functional models), and the first layer, in
  forward order, whose output is non-finite;
- the log2 histogram of the reference gradients with the float16 window at ``S``, the predicted
  underflow/overflow at each power-of-two scale, and a recommended scale
  (:mod:`mpwatch.record.probe.underflow`).

Math and definitions: :mod:`mpwatch.record.probe.underflow`. Record layout: ``contract.KIND_PROBE``.

This module is the probe of one model (:class:`Probe`): its setup (the twin's view, the tap model
of the layer outputs, each variable's layer), which pass runs in which policy, one probe from the
batch to the record (with the fix checks of :mod:`mpwatch.record.probe.fix_check` where it found
trouble), and writing it. The passes' computation is the backend's
(:mod:`mpwatch.record.probe.probe_tf`, :mod:`mpwatch.record.probe.probe_jax`); the record's tables
are built by :mod:`mpwatch.record.probe.probe_payload`.

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

**The twin** (:mod:`mpwatch.record.probe.twin`) is not a copy: it is the same model, same variables,
same user code, with its mixed layers switched to float32 for the reference pass (a policy view). So
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
rests on that probe (a model whose ``call`` is not its layer graph, a custom ``train_step``). The
check runs where the two can differ: the probe runs a Functional or Sequential model's layer graph
with its layers' outputs tapped, and when the model's class keeps Keras' own ``call`` (which runs
that same graph, :func:`call_is_graph`) the model's call is the probe's pass and its loss is the
train step's, so the check's forward pass is not run (it was a fifth of the probe's compile).

**Cost.** A forward and backward pass in each policy (and, where the model overrides ``call``,
its own forward pass for the loss check) on the probe batch, plus per-tensor reductions, traced
once (``benchmarks/probe_cost.py``). Memory: both passes' gradients and outputs and a bounded
piece of statistics (:mod:`.probe_memory`, ``benchmarks/memory.py``).

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
import time
from typing import Any

import numpy as np

from mpwatch import contract, formats
from mpwatch.record.model.inputs import INPUT_COLUMNS, input_rows
from mpwatch.record.probe import probe_payload, probe_tf, underflow
from mpwatch.record.probe.needs import check_loss
from mpwatch.record.probe.twin import PolicyView, model_kind, random_layers, random_layers_off
from mpwatch.record.runtime.writer import RunWriter

logger = logging.getLogger("mpwatch")

#: float8 readiness is measured at a fit's first probe and at every FLOAT8_EVERY-th probe
FLOAT8_EVERY = 4


def detect_mode(model: Any) -> str:
    """``"float16"``, ``"bfloat16"`` or ``"preflight"`` from the layers' compute dtypes."""
    dtypes = {getattr(layer, "compute_dtype", None) for layer in model._flatten_layers()}
    if "float16" in dtypes:
        return "float16"
    if "bfloat16" in dtypes:
        return "bfloat16"
    return "preflight"


def call_is_graph(model: Any) -> bool:
    """Whether ``model.call`` is Keras' own run of the model's layer graph: a Functional or
    Sequential model whose class does not override ``call`` (then the probe's tapped pass runs
    exactly what the model's call runs)."""
    from keras.src.models.functional import Functional
    from keras.src.models.sequential import Sequential

    call = getattr(type(model), "call", None)
    if isinstance(model, Sequential):
        return call is Sequential.call
    return isinstance(model, Functional) and call is Functional.call


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
    from mpwatch.record.runtime import backend

    if backend.name() == backend.TENSORFLOW:
        return batch
    return tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, batch)


def batch_size_of(x: Any) -> int | None:
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
        #: measure float8 readiness of the Dense/EinsumDense layers (at the first probe and every
        #: FLOAT8_EVERY-th after: it moves slowly, and costs about a pass of the model)
        self.float8 = True
        self._probes = 0
        self._float8_runs = 0
        #: seconds the last float8 measurement took (None: none yet), for the budget's estimate
        self.float8_seconds: float | None = None
        self.float8_measured = False  # the last run measured it
        # the fix checks' gate under a cost budget (fix_gate.py), set for one run by the probe's
        # monitor; None: every pass runs
        self.fix_gate: Any = None
        #: the probe batch's share of the training batch (``run(share=)``): its loss's weight
        self.share = 1.0
        self.fix_checks = True  # False: no fix checks (a pre-flight's probe at Keras' start)

    # --- setup ---------------------------------------------------------------------------------
    def _prepare(self) -> None:
        self._prepared = True
        # the twin is the same model under another policy (record/probe/twin.py): always available
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
        #: the loss check's forward pass is needed (the model's call is not the tapped graph)
        self.check_loss = bool(self.tapped_layers) and not call_is_graph(self.model)
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
            outs, self._act_layer_index = [], []
            for i, ly in enumerate(layers):
                for t in keras.tree.flatten(ly.output):
                    outs.append(t)
                    self._act_layer_index.append(i)
            fm = getattr(m, "_functional", None) or m  # its inputs' structure: no warning
            tap = keras.Model(getattr(fm, "_inputs_struct", m.inputs), [*m.outputs, *outs])
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
        model's own losses), or ``loss_fn`` plus the model's losses; times :attr:`share` where
        the probe runs on the batch's first examples only."""
        from keras import ops

        m = self.model
        if self.loss_fn is not None:
            loss = ops.cast(self.loss_fn(y, y_pred), "float32")
            for extra in m.losses:
                loss = loss + ops.cast(extra, "float32")
            return loss if self.share == 1.0 else loss * self.share
        check_loss(m)  # (after the forward pass: its add_loss losses are known) or CannotRun
        compute = getattr(m, "_compute_loss", None) or m.compute_loss
        loss = compute(x=x, y=y, y_pred=y_pred, sample_weight=sw, training=True)
        loss = ops.cast(loss, "float32")
        return loss if self.share == 1.0 else loss * self.share

    def _forward_backward(self, x: Any, y: Any, sw: Any, scale: Any) -> dict:
        """A pass on TensorFlow (:func:`mpwatch.record.probe.probe_tf.forward_backward`): loss,
        gradients w.r.t. the variables and the layer outputs, at ``scale``, in training mode."""
        return probe_tf.forward_backward(self, x, y, sw, scale)

    def _passes(
        self, x: Any, y: Any, sw: Any, scale: Any, fb: Any = None, train_loss_fn: Any = None
    ) -> tuple[dict, dict | None, Any]:
        """(low pass, reference pass or None, train-step loss or None where the low pass is the
        model's own call): traced inside the probe's function, with the random layers off and the
        view switched around the right pass. ``fb(x, y, sw, scale)`` and ``train_loss_fn()`` are
        the backend's pass and train-step loss (default TensorFlow's; :mod:`.probe_jax` gives
        JAX's)."""
        view = self.view
        fb = fb or self._forward_backward
        train_loss_fn = train_loss_fn or (lambda: probe_tf.train_step_loss(self, x, y, sw))
        with random_layers_off(self.random_off):
            if self.mode == "preflight":
                ref = fb(x, y, sw, 1.0)
                train_loss = train_loss_fn() if self.check_loss else None
                low = self._in_view(view, x, y, sw, scale, fb)
            else:
                low = fb(x, y, sw, scale)
                train_loss = train_loss_fn() if self.check_loss else None
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
        from mpwatch.record.runtime import backend

        if backend.name() == backend.JAX:
            from mpwatch.record.probe.probe_jax import JaxProbeFunction

            return JaxProbeFunction(self)
        return probe_tf.probe_function(self)

    def precompile(self, data: Any, cached_only: bool = False) -> bool:
        """On JAX, trace the probe for this batch now and compile it on a background thread
        (:meth:`mpwatch.record.probe.probe_jax.JaxProbeFunction.precompile`; ``cached_only``: only
        load an executable an earlier process compiled, else keep the trace for the first probe):
        the first probe then costs its passes, not its compile. False when nothing was started
        (on TensorFlow, whose trace and graph optimization cannot leave the training thread,
        nothing is done)."""
        from mpwatch.record.runtime import backend

        if backend.name() != backend.JAX:
            return False
        x, y, sw = split_data(first_batch(data))
        self.ready()
        return bool(self._fn.precompile(x, y, sw, cached_only=cached_only))

    def ready(self) -> None:
        """Set up the twin's view, the taps and the backend's function, once."""
        if not self._prepared:
            self._prepare()
        if self._fn is None:
            self._fn = self._build_fn()

    def memory(self, data: Any) -> dict[str, Any]:
        """``need_bytes``, ``need_from``, ``free_bytes``, ``free_from``, ``fits``: this probe's
        need on ``data``'s batch beside the device's free memory (:mod:`.probe_memory`)."""
        from mpwatch.record.probe import probe_memory

        x, y, sw = split_data(first_batch(data))
        self.ready()
        needed, how = probe_memory.need(self, x, y, sw)
        free_bytes, where = probe_memory.free()
        return {
            "need_bytes": needed,
            "need_from": how,
            "free_bytes": free_bytes,
            "free_from": where,
            "fits": probe_memory.verdict(needed, free_bytes),
        }

    def ahead_pending(self) -> bool:
        """Whether the program :meth:`precompile` started is still compiling beside training
        (a probe now would wait for the rest of the compile on the training thread)."""
        fn = getattr(self, "_fn", None)
        return bool(fn is not None and getattr(fn, "ahead_pending", lambda: False)())

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
            from mpwatch.record.runtime import backend

            if backend.name() == backend.JAX:  # during fit the value lives in Keras' state
                from mpwatch.record.probe.probe_jax import optimizer_value
                from mpwatch.record.runtime.backend import host

                return float(host(optimizer_value(self.model, ds)))
            return float(np.asarray(ds.numpy() if hasattr(ds, "numpy") else ds))
        if ds is not None:
            return float(getattr(opt, "initial_scale", formats.KERAS_INITIAL_SCALE))
        return 1.0

    @property
    def has_ref(self) -> bool:
        """Whether the gradients are compared with a float32 reference pass."""
        return self.mode == "preflight" or self.view is not None

    def run(
        self,
        data: Any,
        scale: float | None = None,
        batch_source: str = "probe_data",
        share: float = 1.0,
    ) -> dict[str, Any]:
        """Probe on one batch ``(x, y[, sample_weight])`` (or a dataset: its first batch).
        ``batch_source``: ``"training"`` when the batch is one the training loop fed (the
        record's batch size is then the training batch size). ``share``: the batch is that
        share of the training's first examples (its memory): the loss is weighted by it, so
        each example's gradients are the train step's own values for it (keras.io's MNIST
        convnet probed on 4 of 128 examples overflowed where training never did), the weight
        gradients these examples' part of the batch's; the losses recorded are unweighted."""
        x, y, sw = split_data(first_batch(data))
        if float(share) != self.share:  # a constant of the traced passes: traced again
            self.share, self._fn = float(share), self._build_fn() if self._prepared else None
        self.ready()
        self._probes += 1
        self.float8_measured = False
        s = float(self.current_scale() if scale is None else scale)
        from mpwatch.record.runtime import backend

        if backend.name() == backend.JAX:
            out = self._fn(x, y, sw, s)  # already the host tables
        else:
            import tensorflow as tf

            out = self._fn(x, y, sw, tf.constant(s, tf.float32))
            out = {k: np.asarray(v) for k, v in out.items()}
        for key in ("loss", "ref_loss", "own_loss", "train_loss") if self.share != 1.0 else ():
            out[key] = np.asarray(out[key], np.float64) / self.share
        payload = self._payload(out, s)
        payload["batch"] = {"size": batch_size_of(x), "source": batch_source}
        payload["inputs"] = contract.table(INPUT_COLUMNS, input_rows(self.model, x, self.mode))
        head = payload["model"].get("activation_headroom_bits")
        near = isinstance(head, (int, float)) and head < fix_check_headroom()
        if self.fix_checks and self.mode == "float16" and (
            payload["model"].get("first_nonfinite_layer") or near
        ):
            from mpwatch.record.probe.fix_check import check_fixes

            try:
                payload["fix_checks"] = check_fixes(self, x, y, sw, s, _blamed(payload))
            except Exception as e:  # noqa: BLE001  (the probe's record stands without them)
                self._warn_once("could not check the fixes", e)
        if (
            self.mode in ("float16", "bfloat16")
            and self.has_ref
            and not payload["model"].get("first_nonfinite_layer")
        ):
            from mpwatch.record.probe.fix_check import check_gradient_fixes

            try:
                checks = check_gradient_fixes(self, x, y, sw, s, _layer_grad_errors(payload))
                if checks:
                    payload["grad_fix_checks"] = checks
            except Exception as e:  # noqa: BLE001
                self._warn_once("could not check the gradient fixes", e)
        first = self._float8_runs == 0
        if (
            self.float8
            and self.has_ref
            and not payload["model"].get("first_nonfinite_layer")
            and (first or self._probes % FLOAT8_EVERY == 0)
        ):
            self._float8_runs += 1
            t0 = time.perf_counter()
            from mpwatch.record.probe import float8_capture
            from mpwatch.record.runtime import backend

            try:
                if backend.jax_processes() <= 1:  # the pass takes this process' own batch
                    rows = float8_capture.readiness(
                        self, x, y, sw, s if self.mode != "bfloat16" else 1.0
                    )
                    if rows:
                        payload["float8"] = contract.table(contract.PROBE_FLOAT8_COLUMNS, rows)
            except Exception as e:  # noqa: BLE001  (the probe's record stands without it)
                self._warn_once("could not measure float8 readiness", e)
            self.float8_seconds = time.perf_counter() - t0
            self.float8_measured = True
        return payload

    def _warn_once(self, what: str, error: BaseException) -> None:
        """One line the first time a part fails (traceback at debug level); the record stands."""
        from mpwatch.record.callbacks.base import one_line

        said = self.__dict__.setdefault("_said", set())
        logger.debug("mpwatch: probe: %s", what, exc_info=error)
        if what not in said:
            said.add(what)
            logger.warning("mpwatch: probe: %s (the probe's record stands): %s", what,
                           one_line(error))  # fmt: skip

    def float8_due(self) -> bool:
        """Whether the next probe measures float8 readiness (its first, every FLOAT8_EVERY-th)."""
        return self.float8 and (self._float8_runs == 0 or (self._probes + 1) % FLOAT8_EVERY == 0)

    def _payload(self, out: dict[str, np.ndarray], scale: float) -> dict[str, Any]:
        """The record's payload from this probe's host tables (:func:`probe_payload.build`)."""
        return probe_payload.build(self, out, scale)

    scalars = staticmethod(probe_payload.scalars)

    @staticmethod
    def write(writer: RunWriter, step: int, payload: dict[str, Any]) -> int:
        """Write the record and the scalars; returns the record's bytes. A record over
        ``contract.MAX_RECORD_BYTES`` is written in parts (``RunWriter.record``)."""
        size = writer.record(contract.KIND_PROBE, step, payload)
        writer.scalars(step, Probe.scalars(payload))
        return size


def fix_check_headroom() -> float:
    """The headroom (doublings below float16's maximum) under which a probe checks fixes."""
    from mpwatch.record.probe.fix_check import HEADROOM_BITS

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
