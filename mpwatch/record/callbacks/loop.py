"""TrainingLoopRecorder: mpwatch's recording for custom training loops (``tf.GradientTape`` +
``keras.optimizers.LossScaleOptimizer``).

It records exactly what :class:`~mpwatch.MixedPrecisionMonitor` records in ``model.fit`` (same tap
around ``optimizer.apply``, same writers, same steps): call :meth:`begin` before the train step is
traced, :meth:`step_end` after each call of it, :meth:`end` at the end (or use it as a context
manager).

Example:
    >>> import keras, tensorflow as tf, mpwatch  # doctest: +SKIP
    >>> keras.mixed_precision.set_global_policy("mixed_float16")  # doctest: +SKIP
    >>> opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam())  # doctest: +SKIP
    >>> with mpwatch.TrainingLoopRecorder(model, log_dir="logs/loop", optimizer=opt) as rec:
    ...     @tf.function
    ...     def train_step(x, y):
    ...         with tf.GradientTape() as tape:
    ...             loss = loss_fn(y, model(x, training=True))
    ...             scaled = opt.scale_loss(loss)
    ...         grads = tape.gradient(scaled, model.trainable_variables)
    ...         opt.apply(grads, model.trainable_variables)
    ...         return loss
    ...     for x, y in ds:
    ...         rec.step_end(loss=train_step(x, y))  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from mpwatch.record.callbacks.base import check_model, check_positive_int
from mpwatch.record.runtime.state import state_of


class TrainingLoopRecorder:
    """Records loss scale, skipped steps, gradient health, layer dtypes, step time and memory of a
    custom training loop.

    Args:
        model: the ``keras.Model`` being trained (need not be compiled).
        log_dir: the run directory.
        optimizer: the optimizer whose ``apply`` the loop calls; default ``model.optimizer``. It is
            set as ``model.optimizer`` when the model has none.
        log_every: as for :class:`~mpwatch.MixedPrecisionMonitor`.
        steps_per_call: optimizer steps the loop runs per :meth:`step_end` call (a ``tf.function``
            looping over several batches).
        loss_fn: the loop's loss, ``loss_fn(y_true, y_pred) -> scalar``, for the probe (which
            needs ``probe_data`` in a custom loop: there is no Keras train function to take a
            batch from). Default: the model's compiled loss; a model that is not compiled needs
            it as soon as the probe has data.
        **monitor_kwargs: passed to :class:`~mpwatch.MixedPrecisionMonitor` (switch parts off).
    """

    def __init__(
        self,
        model: Any,
        log_dir: Any,
        optimizer: Any = None,
        log_every: int = 50,
        steps_per_call: int = 1,
        loss_fn: Any = None,
        **monitor_kwargs: Any,
    ) -> None:
        import keras

        from mpwatch.record.callbacks.monitor import MixedPrecisionMonitor

        if not isinstance(model, keras.Model):
            check_model(model, "TrainingLoopRecorder", compiled=False)  # raises TypeError
        if optimizer is not None and getattr(model, "optimizer", None) is None:
            model.optimizer = optimizer
        elif optimizer is not None and model.optimizer is not optimizer:
            raise ValueError(
                "TrainingLoopRecorder: optimizer differs from model.optimizer; pass the one the "
                "loop calls apply() on"
            )
        check_model(model, "TrainingLoopRecorder", compiled=False)
        if loss_fn is not None and not callable(loss_fn):
            raise ValueError(f"TrainingLoopRecorder: loss_fn must be callable, got {loss_fn!r}")
        probing = monitor_kwargs.get("probe", True) and monitor_kwargs.get("probe_data") is not None
        if probing and loss_fn is None and getattr(model, "loss", None) is None:
            raise ValueError(
                "TrainingLoopRecorder: the probe needs the loop's loss and the model is not "
                "compiled with one: pass loss_fn=<your loss> (loss_fn(y_true, y_pred) -> scalar), "
                "or probe=False"
            )
        monitor_kwargs["loss_fn"] = loss_fn
        self.model = model
        self.steps_per_call = check_positive_int("steps_per_call", steps_per_call)
        self.monitor = MixedPrecisionMonitor(log_dir, log_every, **monitor_kwargs)
        for cb in (self.monitor, *self.monitor.parts):
            cb.require_compiled = False
        self.monitor.set_model(model)
        self.monitor.set_params({"steps": None, "epochs": 1})
        self._begun = False
        self._pending_begin = False

    def begin(self) -> TrainingLoopRecorder:
        """Start recording; installs the tap: trace (first call) the train step after this."""
        state = state_of(self.model)
        state.capacity = self.steps_per_call
        state.rebuild = False
        self.monitor.on_train_begin()
        self._begun = True
        self.monitor.on_train_batch_begin(0)  # installs the tap and starts the step timer
        return self

    def step_end(self, loss: Any = None) -> None:
        """Call after each call of the train step (``loss``: the step's loss, optional)."""
        if not self._begun:
            self.begin()
        logs = {} if loss is None else {"loss": float(loss)}
        self.monitor.on_train_batch_end(0, logs)
        self.monitor.on_train_batch_begin(0)

    def end(self) -> None:
        """Stop recording and remove the tap."""
        if self._begun:
            self._begun = False
            self.monitor.on_train_end()
            state = state_of(self.model)
            state.capacity = None
            state.rebuild = True

    def __enter__(self) -> TrainingLoopRecorder:
        return self.begin()

    def __exit__(self, *exc: Any) -> None:
        self.end()


def share_skip_decision(grads: list[Any]) -> list[Any]:
    """Make every replica skip a step when any replica's gradients are non-finite (for custom loops
    under ``MultiWorkerMirroredStrategy``); call it in the replica function, between
    ``tape.gradient`` and ``optimizer.apply``.

    Keras 3's ``LossScaleOptimizer`` decides skip-or-apply on each replica's *local* gradients,
    before they are all-reduced (under strategies that run without ``merge_call``, as
    ``MultiWorkerMirroredStrategy`` does). When only one worker's slice of a batch overflows, that
    worker skips the update while the others enter the gradient all-reduce and wait for it forever:
    training hangs. One scalar all-reduce (how many replicas saw a non-finite gradient) restores the
    single-process rule: the step is skipped everywhere when the summed gradient would be
    non-finite. Gradients are returned unchanged where all replicas are finite (multiplied by 1),
    and as NaN everywhere otherwise. Outside ``tf.distribute`` it changes nothing.

    Example:
        >>> def replica_step(x, y):  # doctest: +SKIP
        ...     with tf.GradientTape() as tape:
        ...         loss = tf.nn.compute_average_loss(loss_fn(y, model(x)), global_batch_size=64)
        ...         scaled = opt.scale_loss(loss)
        ...     grads = tape.gradient(scaled, model.trainable_variables)
        ...     grads = mpwatch.share_skip_decision(grads)
        ...     opt.apply(grads, model.trainable_variables)
    """
    import tensorflow as tf

    present = [g for g in grads if g is not None]
    if not present:
        return list(grads)
    finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in present])
    bad = tf.cast(tf.logical_not(finite), tf.float32)
    bad = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, bad)
    poison = tf.where(bad > 0, float("nan"), 1.0)
    return [None if g is None else g * tf.cast(poison, g.dtype) for g in grads]
