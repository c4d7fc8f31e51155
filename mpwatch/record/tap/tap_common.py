"""What both in-graph taps share (TensorFlow's :class:`mpwatch.record.tap.tf_tap.Tap` and JAX's
:class:`mpwatch.record.tap.jax_tap.JaxTap`): their common state (:class:`TapBase`), the
:class:`Collected` result of a read, turning ring buffers into it (:func:`from_ring`), and finding
the ``LossScaleOptimizer``."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mpwatch.record.tap import lost_updates, stats

#: columns of the taps' per-variable table: the gradient counts, then the update counts
TAP_COUNTS = stats.NUM_COUNTS + lost_updates.NUM_UPDATE_COUNTS

logger = logging.getLogger("mpwatch")


def loss_scale_optimizer(optimizer: Any) -> Any:
    """The optimizer if it is a Keras ``LossScaleOptimizer`` (has ``dynamic_scale``), else None."""
    if optimizer is None:
        return None
    try:
        import keras

        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            return optimizer
    except (ImportError, AttributeError):  # pragma: no cover
        pass
    return None


def model_optimizers(model: Any) -> list[tuple[str, Any]]:
    """``(name, optimizer)`` for every optimizer the model holds: the compiled one first
    (``"optimizer"``), then those in the model's attributes (``"d_optimizer"``), each once."""
    import keras

    out: list[tuple[str, Any]] = []
    seen: set[int] = set()
    compiled = getattr(model, "optimizer", None)
    if isinstance(compiled, keras.optimizers.Optimizer):
        out.append(("optimizer", compiled))
        seen.add(id(compiled))
    for name, value in list(vars(model).items()):
        if isinstance(value, keras.optimizers.Optimizer) and id(value) not in seen:
            seen.add(id(value))
            out.append((name.lstrip("_") if name != "_optimizer" else "optimizer", value))
    return out


def input_health(data: Any) -> tuple[Any, Any]:
    """In the traced train step, on either backend: ``(max |x| over the finite elements, count of
    non-finite elements)`` of the batch's floating-point features (``x`` of ``(x, y,
    sample_weight)``; integer inputs such as token ids are left out), both float32 scalars."""
    import keras
    from keras import ops

    x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
    peak = ops.zeros((), "float32")
    bad = ops.zeros((), "float32")
    for t in keras.tree.flatten(x):
        if not hasattr(t, "dtype") or "float" not in str(getattr(t.dtype, "name", t.dtype)):
            continue
        a = ops.abs(ops.cast(t, "float32"))  # a float64 value past float32's range counts as inf
        finite = ops.isfinite(a)
        peak = ops.maximum(peak, ops.max(ops.where(finite, a, ops.zeros_like(a))))
        bad = bad + ops.cast(ops.sum(ops.cast(ops.logical_not(finite), "int32")), "float32")
    return peak, bad


@dataclass
class Collected:
    """What the tap recorded for the batches of one Keras callback call.

    ``steps`` are mpwatch batch steps; arrays are aligned with them. ``loss_scale`` / ``skipped`` /
    ``scale_used`` are None without a LossScaleOptimizer. ``grad_counts`` maps a step to its
    ``[num_variables, 5]`` counts table (only at steps where gradient health was computed).
    """

    steps: list[int]
    loss_scale: np.ndarray | None = None
    scale_used: np.ndarray | None = None
    skipped: np.ndarray | None = None
    grad_counts: dict[int, np.ndarray] = field(default_factory=dict)
    #: per batch: max |x| of the batch's float features and their non-finite count (NaN where the
    #: tap did not see the batch's input: a custom training loop)
    input_max_abs: np.ndarray | None = None
    input_nonfinite: np.ndarray | None = None
    exact: bool = True  # False: counted from Keras' batch numbers (the tap is off)

    @property
    def n(self) -> int:
        return len(self.steps)

    @property
    def last_step(self) -> int | None:
        return self.steps[-1] if self.steps else None


def from_ring(
    tap: Any,
    last_step: int,
    n: int,
    scale: np.ndarray,
    scale_used: np.ndarray,
    skipped: np.ndarray,
    grad_counts: dict[int, np.ndarray],
    first_slot: int = 0,
    inputs: tuple[np.ndarray, np.ndarray] | None = None,
) -> Collected:
    """The :class:`Collected` of the ``n`` batches after step ``last_step``, from a tap's ring
    buffers (both backends' taps): the k-th of them went into slot ``(first_slot + k) %
    capacity``; when more batches ran than the ring holds, only the last ``capacity`` are kept.
    ``grad_counts``: step -> counts table, read from the tap's own (smaller) counts ring;
    ``inputs``: the input-health rings (max |x|, non-finite count)."""
    cap = tap.capacity
    if n > cap:
        logger.warning("mpwatch: %d batches since the last read, only the last %d are kept", n, cap)
    steps = list(range(last_step + 1, last_step + n + 1))
    first_kept = max(0, n - cap)
    slots = [(first_slot + k) % cap for k in range(first_kept, n)]
    out = Collected(steps=steps)
    if tap.lso is not None and tap.failed is None:
        out.loss_scale = np.full(n, np.nan, np.float32)
        out.scale_used = np.full(n, np.nan, np.float32)
        out.skipped = np.full(n, np.nan, np.float32)
        out.loss_scale[first_kept:] = scale[slots]
        out.scale_used[first_kept:] = scale_used[slots]
        out.skipped[first_kept:] = skipped[slots]
    if inputs is not None and tap.failed is None:
        out.input_max_abs = np.full(n, np.nan, np.float32)
        out.input_nonfinite = np.full(n, np.nan, np.float32)
        out.input_max_abs[first_kept:] = np.asarray(inputs[0])[slots]
        out.input_nonfinite[first_kept:] = np.asarray(inputs[1])[slots]
    if tap.grad_every and tap.failed is None:
        kept = set(steps[first_kept:])
        out.grad_counts = {
            s: np.asarray(c, np.float64) for s, c in sorted(grad_counts.items()) if s in kept
        }
    return out


def counts_entries(written: int, slots: int, since: int = 0) -> list[tuple[int, int]]:
    """``(entry, slot)`` of the counts tables written since entry ``since`` (``written`` in all)
    that are still intact in a ring of ``slots``: the slot after the newest is scribbled on by
    every step that computes no counts, so at most ``slots - 1`` entries survive."""
    first = max(since, written - (slots - 1))
    return [(c, c % slots) for c in range(first, written)]


_WATCH_LOCK = threading.Lock()


def _counting(scale_loss: Any, calls: dict[int, int], key: int) -> Any:
    def counted(loss: Any) -> Any:
        calls[key] += 1
        return scale_loss(loss)

    return counted


class TapBase:
    """The state every tap has: the model and its optimizer (and ``LossScaleOptimizer``), the ring
    capacity (batches per read), the gradient-count period, and the failure that stopped it."""

    def __init__(
        self, model: Any, capacity: int, grad_every: int | None, start_step: int = 0
    ) -> None:
        self.model = model
        self.optimizer = model.optimizer
        self.lso = loss_scale_optimizer(self.optimizer)
        self.capacity = max(1, int(capacity))
        self.grad_every = grad_every
        # the gradient-counts ring: a table only every grad_every steps, so a few slots hold
        # every table between two reads (capacity batches) plus the one being written
        self.count_slots = -(-self.capacity // grad_every) + 2 if grad_every else 1
        self.failed: str | None = None
        self.variable_names: list[str] = []
        self.rebuild = True  # rebuild Keras' train function (False for custom training loops)
        self._num_vars: int | None = None
        self._clean_fn: Any = None  # Keras' train function before the tap's (given back at park)
        self._parked_fn: Any = None  # the tapped train function, kept between mpwatch fits
        self.device_wait = 0.0  # seconds the host reads waited for the device (not mpwatch's)
        #: per LossScaleOptimizer the model holds (by ``id``): its ``scale_loss`` calls in the
        #: train step's last trace (or eager run) that mpwatch saw; None: none seen
        #: (see :meth:`watch_scale_loss`)
        self.scale_loss_calls: dict[int, int] | None = None
        #: the step the tap's count started from (its creation, or the last resume): a count
        #: still there counted nothing (a GAN's compiled optimizer, the one it taps, unused)
        self.restarted_at = int(start_step)
        self._watching = 0  # train steps running under the watch (one per replica's thread)
        self._watch_calls: dict[int, int] | None = None
        self._watch_kept: list[tuple[Any, Any]] = []

    def watch_scale_loss(self, run: Any) -> Any:
        """``run()`` (the user's train step, being traced or run eagerly), counting its calls of
        ``scale_loss`` on every ``LossScaleOptimizer`` the model holds (the compiled one, a
        GAN's ``d_optimizer``...) into :attr:`scale_loss_calls`: Keras' own train step calls
        the compiled one's once; a custom one that never calls it differentiates an unscaled
        loss, which the optimizer still divides by the scale. Nothing is counted where the
        step raised."""
        with _WATCH_LOCK:  # a tf.distribute strategy traces each replica's step in a thread
            if self._watching == 0:
                self._watch_calls = self._patch_scale_loss()
            self._watching += 1
        ok = False
        try:
            out = run()
            ok = True
        finally:
            with _WATCH_LOCK:
                self._watching -= 1
                if self._watching == 0:
                    calls, self._watch_calls = self._watch_calls, None
                    self._unpatch_scale_loss()
                    if ok and calls is not None:
                        self.scale_loss_calls = calls
        return out

    def _patch_scale_loss(self) -> dict[int, int] | None:
        try:
            lsos = [o for _, o in model_optimizers(self.model) if loss_scale_optimizer(o)]
        except Exception:  # noqa: BLE001  (never lose training to mpwatch: nothing watched)
            return None
        calls = {id(o): 0 for o in lsos}
        self._watch_kept = []
        for opt in lsos:
            own = vars(opt).get("scale_loss")  # an instance attribute of the user's, kept
            self._watch_kept.append((opt, own))
            object.__setattr__(opt, "scale_loss", _counting(opt.scale_loss, calls, id(opt)))
        return calls if lsos else None

    def _unpatch_scale_loss(self) -> None:
        for opt, own in self._watch_kept:
            if own is not None:
                object.__setattr__(opt, "scale_loss", own)
            else:
                object.__delattr__(opt, "scale_loss")
        self._watch_kept = []

    # --- the host read -------------------------------------------------------------------------
    read_ready = False  # the host read is ready to run (traced, where it is a function)

    def prepare_read(self) -> None:
        """Get the host read ready (trace it) outside the interval steps."""
        self.read_ready = True

    # --- between fits: park the traced, tapped train function instead of dropping it ----------
    def park(self) -> None:
        """At the end of an mpwatch fit: unwrap, keep the tapped train function for the next
        mpwatch fit, and give Keras back the train function it had before (a plain ``fit`` then
        runs, or traces, nothing of mpwatch's)."""
        tapped = self.model.train_function
        self.uninstall()
        if self.rebuild and self.failed is None and tapped is not None:
            self._parked_fn = tapped
            self.model.train_function = self._clean_fn

    def resumable(self, capacity: int, grad_every: int | None) -> bool:
        """Whether the parked train function fits the next fit: same needs, same optimizer, and
        Keras' train function still the one given back (no ``compile`` since)."""
        return (
            self._parked_fn is not None
            and self.failed is None
            and self.capacity == max(1, int(capacity))
            and self.grad_every == grad_every
            and self.optimizer is self.model.optimizer
            and self.model.train_function is self._clean_fn
        )

    def resume(self, step: int) -> None:
        """Reinstate the parked train function (no trace) with empty buffers from ``step``."""
        fn, self._parked_fn = self._parked_fn, None
        self._wrap()
        self._restart(step)
        self.restarted_at = int(step)
        self.model.train_function = fn

    def _wrap(self) -> None:  # pragma: no cover  (each tap wraps its own optimizer methods)
        raise NotImplementedError

    def _restart(self, step: int) -> None:  # pragma: no cover
        raise NotImplementedError

    def _fail(self, message: str) -> None:
        if self.failed is None:
            self.failed = message
            logger.error("mpwatch: %s; loss scale, skipped steps and gradient health stop", message)
