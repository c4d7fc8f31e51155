"""The in-graph tap on Keras' TensorFlow backend: the real, scaled training gradients and the
loss scale of every batch, recorded inside the traced train step (JAX's:
:mod:`mpwatch.record.tap.jax_tap`; what both share: :mod:`mpwatch.record.tap.tap_common`).

One :class:`Tap` per model wraps the optimizer *instance's* ``apply`` (which Keras'
``train_step`` reaches through ``apply_gradients``), so it sees the real, scaled training gradients
in the graph. Per batch it stores, into small ``tf.Variable`` ring buffers: the loss scale after
the step, the scale the gradients were scaled with, whether the update was skipped (``iterations``
did not advance) (one slot per batch, for a read interval plus one Keras call of batches), the
batch's input health, and every ``grad_every`` steps a per-variable table of gradient counts
(:mod:`mpwatch.record.tap.stats`; a ring of a few tables, each with its step). :meth:`Tap.read`
takes them to the host in one transfer. Under ``tf.distribute`` the buffers are mirrored and written
from replica 0 (loss scale and the skip decision are the same on all replicas).

When and for whom it is installed, read and parked: :mod:`mpwatch.record.runtime.state`.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from mpwatch.record.tap import lost_updates, stats, step_decision
from mpwatch.record.tap.tap_common import (
    TAP_COUNTS,
    Collected,
    TapBase,
    counts_entries,
    from_ring,
    input_health,
)

logger = logging.getLogger("mpwatch")


class Tap(TapBase):
    """The in-graph recorder around ``optimizer.apply``. See the module docstring."""

    def __init__(self, model: Any, capacity: int, grad_every: int | None, start_step: int) -> None:
        import tensorflow as tf

        super().__init__(model, capacity, grad_every, start_step)
        self._orig_apply = None
        # self._num_vars: known at install (built model) or when traced
        self._prebuilt_vars: int | None = None  # counts buffer created at install, for so many
        strategy = model.distribute_strategy
        self._distributed = strategy.num_replicas_in_sync > 1

        def var(init: Any, name: str) -> Any:
            return tf.Variable(
                init,
                trainable=False,
                name=f"mpwatch_{name}",
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
                synchronization=tf.VariableSynchronization.ON_WRITE,
            )

        cap = self.capacity
        with strategy.scope():
            self.count = var(tf.constant(0, tf.int32), "count")
            self.step = var(tf.constant(int(start_step), tf.int64), "step")
            self.scale = var(tf.zeros([cap], tf.float32), "scale")
            self.scale_used = var(tf.zeros([cap], tf.float32), "scale_used")
            self.skipped = var(tf.zeros([cap], tf.float32), "skipped")
            self.in_max = var(tf.fill([cap], float("nan")), "input_max_abs")
            self.in_bad = var(tf.fill([cap], float("nan")), "input_nonfinite")
            self.ccount = var(tf.constant(0, tf.int32), "counts_written")
            self.cstep = var(tf.zeros([self.count_slots], tf.int64), "counts_step")
        # [count_slots, num_variables, 5]: created when the step is traced (a subclassed model
        # builds its variables only then), see _counts_var
        self.counts = None
        self._strategy = strategy

        self._read = self._make_read()

    def _make_read(self) -> Any:
        import tensorflow as tf

        k = self.count_slots

        @tf.function(autograph=False)
        def read() -> Any:
            out = (
                self.count.read_value(),
                self.step.read_value(),
                self.scale.read_value(),
                self.scale_used.read_value(),
                self.skipped.read_value(),
                self.in_max.read_value(),
                self.in_bad.read_value(),
                self.ccount.read_value(),
                self.cstep.read_value(),
                self.counts.read_value()
                if self.counts is not None
                else tf.zeros([k, 0, TAP_COUNTS]),
            )
            with tf.control_dependencies(list(out)):
                self.count.assign(0)
                self.ccount.assign(0)
            return out

        return read

    def prepare_read(self) -> None:
        self.read_ready = True  # tried once: if tracing fails here, the read traces when it runs
        try:
            self._read.get_concrete_function()
        except Exception:  # noqa: BLE001  (an optimisation only: never fail the step count)
            logger.debug("mpwatch: could not trace the tap's read ahead", exc_info=True)

    # --- installation ------------------------------------------------------------------------
    @property
    def installed(self) -> bool:
        return self._orig_apply is not None

    def install(self) -> None:
        self._clean_fn = self.model.train_function
        self._wrap()
        self._prebuild()
        if self.rebuild:
            self.model.make_train_function(force=True)

    def _wrap(self) -> None:
        opt = self.optimizer
        self._orig_apply = opt.apply
        tap = self

        def apply(grads: Any, trainable_variables: Any = None) -> Any:
            return tap._apply(grads, trainable_variables)

        apply._mpwatch_tap = True  # type: ignore[attr-defined]
        object.__setattr__(opt, "apply", apply)
        if self.rebuild:  # a custom training loop has no train_step of Keras' to see
            orig_step = self.model.train_step

            def train_step(data: Any) -> Any:
                tap._look_at_input(data)
                return tap.watch_scale_loss(lambda: orig_step(data))

            train_step._mpwatch_tap = True  # type: ignore[attr-defined]
            object.__setattr__(self.model, "train_step", train_step)

    def _look_at_input(self, data: Any) -> None:
        """In the traced train step, before the user's: the batch's input health, for the
        optimizer's ``apply`` that follows in the same trace to write into the ring."""
        self._pending_input = None
        if self.failed is None:
            try:
                self._pending_input = input_health(data)
            except Exception as e:  # noqa: BLE001  (an input mpwatch cannot read: no health)
                logger.debug("mpwatch: no input health for this batch: %r", e)

    def _restart(self, step: int) -> None:

        self.step.assign(int(step))
        self.count.assign(0)
        self.ccount.assign(0)

    def _prebuild(self) -> None:
        """Create now what the first trace would otherwise create: the LossScaleOptimizer's
        variables and the gradient counts buffer. A ``tf.function`` that creates variables while
        tracing is traced a second time, so this halves the tap's (and the train step's) tracing
        cost. Only for a built model; a subclassed model that builds in its first call keeps
        creating them in the trace (:meth:`_before`)."""
        if not getattr(self.model, "built", False):
            return
        try:
            tvs = list(self.model.trainable_variables)
            if not tvs:
                return
            with self._strategy.scope():
                self._build_lso(tvs)
            if self.grad_every:
                self._num_vars = len(tvs)
                self._counts_var()
                self._prebuilt_vars = len(tvs)
        except Exception as e:  # noqa: BLE001  (the trace builds them instead)
            logger.debug("mpwatch: could not create the tap's variables ahead: %r", e)
            self._num_vars, self.counts, self._prebuilt_vars = None, None, None

    def _build_lso(self, trainable_variables: Any) -> None:
        """Build the LossScaleOptimizer as its own ``apply()`` would, so the scale used for the
        first gradients can be read before it."""
        if self.lso is None or self.lso.built:
            return
        import keras

        with keras.name_scope(self.lso.name, caller=self.lso):
            self.lso.build(list(trainable_variables))
        self.lso.built = True

    def uninstall(self) -> None:
        opt = self.optimizer
        if self._orig_apply is not None:
            if getattr(opt.__dict__.get("apply"), "_mpwatch_tap", False):
                object.__delattr__(opt, "apply")
            if getattr(self.model.__dict__.get("train_step"), "_mpwatch_tap", False):
                object.__delattr__(self.model, "train_step")
            self._orig_apply = None
            # The traced train function still holds the tap's ops: a later fit traces a clean one.
            if self.rebuild:
                self.model.train_function = None

    def set_step(self, step: int) -> None:
        self.step.assign(int(step))

    def current_step(self) -> int:
        """The step of the last batch the tap wrote."""
        return int(self.step.numpy())

    # --- in the graph ------------------------------------------------------------------------
    def _apply(self, grads: Any, trainable_variables: Any) -> Any:
        grads = list(grads)
        if self.failed is not None:
            return self._orig_apply(grads, trainable_variables)
        try:
            pre = self._before(grads, trainable_variables)
        except Exception as e:  # noqa: BLE001  (never lose training to mpwatch)
            self._fail(f"could not trace the gradient tap: {e!r}")
            return self._orig_apply(grads, trainable_variables)
        result = self._orig_apply(grads, trainable_variables)
        try:
            self._after(pre)
        except Exception as e:  # noqa: BLE001
            self._fail(f"could not trace the gradient tap: {e!r}")
        return result

    def _iterations(self) -> Any:
        import tensorflow as tf

        it = step_decision.raw_counter(self.optimizer)  # not iterations: see step_decision
        return tf.identity(getattr(it, "value", it))

    def _before(self, grads: Any, trainable_variables: Any) -> dict[str, Any]:
        import tensorflow as tf

        if trainable_variables is not None:
            self._build_lso(trainable_variables)
        if self._prebuilt_vars is not None and len(grads) != self._prebuilt_vars:
            # the model grew since install (built in its first call): count what the step has
            self._num_vars, self.counts, self._prebuilt_vars = None, None, None
        pre: dict[str, Any] = {
            "it": self._iterations(), "finite": step_decision.finite(self.lso, grads)
        }
        seen, self._pending_input = getattr(self, "_pending_input", None), None
        nan = tf.constant(float("nan"), tf.float32)
        pre["in_max"], pre["in_bad"] = seen if seen is not None else (nan, nan)
        if self.lso is not None and self.lso.built:
            pre["scale_used"] = tf.identity(self.lso.dynamic_scale.value)
        else:
            pre["scale_used"] = tf.constant(1.0, tf.float32)
        if self._num_vars is None:
            self._num_vars = len(grads)
        if self.grad_every and len(grads) == self._num_vars:
            tvs = list(trainable_variables or self.model.trainable_variables)
            if not self.variable_names:
                self.variable_names = [getattr(v, "path", None) or v.name for v in tvs]
            step_next = self.step.read_value() + 1
            do = tf.equal(step_next % self.grad_every, 0)
            nv = self._num_vars
            pre["counts"] = tf.cond(
                do,
                lambda: tf.cast(stats.counts_table(grads), tf.float32),
                lambda: tf.zeros([nv, stats.NUM_COUNTS], tf.float32),
            )
            pre["counts_done"] = tf.cast(do, tf.int32)
            pre["counts_step"] = step_next
            # updates lost to rounding: the 16-bit variables' values before the update
            which = [i for i, v in enumerate(tvs) if lost_updates.is_16bit(v)]
            pre["updates"] = (grads, tvs, which, do, lost_updates.tf_snapshot(tvs, which, do))
        elif self.grad_every:
            self._fail(
                f"the optimizer got {len(grads)} gradients for {self._num_vars} trainable variables"
            )
        return pre

    def _after(self, pre: dict[str, Any]) -> None:
        import tensorflow as tf

        values = dict(pre)
        it_after = self._iterations()
        values["skipped"], applied = step_decision.outcome(
            pre["finite"], pre["it"], it_after, step_decision.accumulation_steps(self.optimizer)
        )
        del values["it"], values["finite"]
        if "updates" in values:
            grads, tvs, which, do, old = values.pop("updates")
            moved = lost_updates.tf_update_counts(grads, old, tvs, which, applied, do)
            values["counts"] = tf.concat([values["counts"], moved], axis=1)
        if self.lso is not None:
            values["scale"] = tf.identity(self.lso.dynamic_scale.value)
        else:
            values["scale"] = tf.constant(1.0, tf.float32)
        ctx = tf.distribute.get_replica_context()
        if self._distributed and ctx is not None:
            # merge_call: write replica 0's values once, in cross-replica context
            def merge(strategy: Any, vals: Any) -> None:
                first = {k: strategy.experimental_local_results(v)[0] for k, v in vals.items()}
                self._write(first)

            ctx.merge_call(merge, args=(values,))
        else:
            self._write(values)

    def _counts_var(self) -> Any:
        import tensorflow as tf

        if self.counts is None:
            with tf.init_scope(), self._strategy.scope():
                self.counts = tf.Variable(
                    tf.zeros([self.count_slots, self._num_vars, TAP_COUNTS], tf.float32),
                    trainable=False,
                    name="mpwatch_counts",
                    aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
                    synchronization=tf.VariableSynchronization.ON_WRITE,
                )
            self._read = self._make_read()
            self.read_ready = False
        return self.counts

    def _write(self, values: dict[str, Any]) -> None:
        import tensorflow as tf

        i = tf.math.floormod(self.count.read_value(), self.capacity)

        def put(buf: Any, value: Any, at: Any = i) -> None:
            buf.assign(
                tf.tensor_scatter_nd_update(
                    buf.read_value(),
                    tf.reshape(at, [1, 1]),
                    tf.expand_dims(tf.cast(value, buf.dtype), 0),
                )
            )

        put(self.scale, values["scale"])
        put(self.scale_used, values["scale_used"])
        put(self.skipped, values["skipped"])
        put(self.in_max, values["in_max"])
        put(self.in_bad, values["in_bad"])
        if "counts" in values:
            # always into the slot after the newest table (zeros on steps without counts: that
            # slot is free), counted as written only on a counts step
            j = tf.math.floormod(self.ccount.read_value(), self.count_slots)
            put(self._counts_var(), values["counts"], j)
            put(self.cstep, values["counts_step"], j)
            self.ccount.assign_add(values["counts_done"])
        self.count.assign_add(1)
        self.step.assign_add(1)

    # --- on the host -------------------------------------------------------------------------
    def read(self) -> Collected:
        count, step, scale, scale_used, skipped, in_max, in_bad, ccount, cstep, counts = (
            np.asarray(t) for t in self._read()
        )
        tables = {
            int(cstep[slot]): counts[slot]
            for _, slot in counts_entries(int(ccount), self.count_slots)
        }
        return from_ring(
            self, int(step) - int(count), int(count), scale, scale_used, skipped, tables,
            inputs=(in_max, in_bad),
        )  # fmt: skip
