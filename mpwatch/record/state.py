"""mpwatch's per-model recording state: the batch step counter and the in-graph tap.

**Steps.** mpwatch writes every value at its *batch step*: 1 for the first training batch the model
ever ran under mpwatch, counted on across ``fit`` calls (also across fits where
``steps_per_execution`` makes one Keras callback call cover several batches). The counter lives on
the model object (attribute ``_mpwatch_state``). Where a model's first mpwatch fit in a process
starts is fixed at its first batch (:meth:`ModelState.resolve_start`, after every callback's
``on_train_begin``, so after a restore): at ``optimizer.iterations`` (a model trained before mpwatch
was attached does not restart at 1), or, for a restored state the run's logs hold, at that state's
step (:mod:`mpwatch.record.resume`). It is not ``optimizer.iterations``, which does not
advance on a skipped step.

**The tap.** One :class:`Tap` per model wraps the optimizer *instance's* ``apply`` (which Keras'
``train_step`` reaches through ``apply_gradients``), so it sees the real, scaled training gradients
in the graph. Per batch it stores, into small ``tf.Variable`` ring buffers: the loss scale after
the step, the scale the gradients were scaled with, whether the update was skipped (``iterations``
did not advance) (one slot per batch, for a read interval plus one Keras call of batches), and
every ``grad_every`` steps a per-variable table of gradient counts (:mod:`mpwatch.record.stats`; a
ring of a few tables, each with its step).

**Reads.** The host counts the steps itself (Keras' batch indices give each call's batches) and
reads the buffers only at the calls that reach a multiple of the read interval (the smallest
``log_every`` of the callbacks that use the tap's data: loss scale, gradient health), when the
ring would overflow, and at the end of the fit (:meth:`ModelState.collect`,
:meth:`ModelState.flush`), whichever mpwatch callback asks first; the others get the same
objects. A read is one host transfer, which waits for the device; between reads mpwatch touches no
device value. The data of a read covers every batch since the last one, exactly. Under
``tf.distribute`` the buffers are mirrored and written from replica 0 (loss scale and the skip
decision are the same on all replicas).

The tap is installed when the first batch begins (all callbacks have said what they need by then)
and the train function is rebuilt to trace it. At ``on_train_end`` it is *parked*
(:meth:`TapBase.park`): unwrapped, its traced train function kept on the model's state, and Keras'
own train function given back, so a later ``fit`` without mpwatch runs (or traces) a clean one. The
next mpwatch ``fit`` with the same needs (ring size, gradient-count period, optimizer, no
``compile`` since) reinstates the parked function without tracing anything.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from mpwatch.record import stats
from mpwatch.record.tap_common import (  # noqa: F401  (also their old import path)
    Collected,
    TapBase,
    counts_entries,
    from_ring,
    input_health,
    loss_scale_optimizer,
)

logger = logging.getLogger("mpwatch")
STATE_ATTR = "_mpwatch_state"
UNUSED_READ_EVERY = 100  # steps between reads of a tap whose data no callback uses


def initial_step(model: Any) -> int:
    """``optimizer.iterations`` of a model, 0 when there is none yet."""
    opt = getattr(model, "optimizer", None)
    try:
        if opt is not None and getattr(opt, "built", True):
            return int(np.asarray(opt.iterations.numpy()))
    except Exception:  # noqa: BLE001  (an unbuilt optimizer: start at 0)
        pass
    return 0


class Tap(TapBase):
    """The in-graph recorder around ``optimizer.apply``. See the module docstring."""

    def __init__(self, model: Any, capacity: int, grad_every: int | None, start_step: int) -> None:
        import tensorflow as tf

        super().__init__(model, capacity, grad_every)
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
                self.counts.read_value() if self.counts is not None else tf.zeros([k, 0, 5]),
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
                return orig_step(data)

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

        it = self.optimizer.iterations
        return tf.identity(getattr(it, "value", it))

    def _before(self, grads: Any, trainable_variables: Any) -> dict[str, Any]:
        import tensorflow as tf

        if trainable_variables is not None:
            self._build_lso(trainable_variables)
        if self._prebuilt_vars is not None and len(grads) != self._prebuilt_vars:
            # the model grew since install (built in its first call): count what the step has
            self._num_vars, self.counts, self._prebuilt_vars = None, None, None
        pre: dict[str, Any] = {"it": self._iterations()}
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
            if not self.variable_names:
                tvs = trainable_variables or self.model.trainable_variables
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
        elif self.grad_every:
            self._fail(
                f"the optimizer got {len(grads)} gradients for {self._num_vars} trainable variables"
            )
        return pre

    def _after(self, pre: dict[str, Any]) -> None:
        import tensorflow as tf

        values = dict(pre)
        it_after = self._iterations()
        values["skipped"] = tf.cast(tf.equal(it_after, pre["it"]), tf.float32)
        del values["it"]
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
                    tf.zeros([self.count_slots, self._num_vars, stats.NUM_COUNTS], tf.float32),
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


class ModelState:
    """mpwatch's state on one model: the step counter, the tap, and who uses it."""

    def __init__(self, model: Any) -> None:
        self.step = initial_step(model)
        self.skipped_total = 0
        self.start: dict[str, Any] = {"iterations": self.step, "loss_scale": None}
        self._resolved = False  # where the model's first mpwatch fit starts is fixed
        self._fit_resolved = False  # ... and this fit's start
        self.tap: Tap | None = None
        self.parked: Any = None  # the last fit's tap, parked with its traced train function
        self._model = model
        self._users: dict[int, int | None] = {}
        self._read_every: dict[int, int | None] = {}  # users that consume the tap's data
        self._needs: tuple[Any, int | None, int] | None = None  # cache of _needs_now
        self._pending = 0  # batches the tap wrote since the last read
        # set by TrainingLoopRecorder: batches per host call, and no Keras train function
        self.capacity: int | None = None
        self.rebuild = True
        self._cache: tuple[Collected, Collected | None] | None = None
        self._consumers: set[int] = set()
        self._flushed: Collected | None = None
        self._flush_consumers: set[int] | None = None

    def resolve_start(self, log_dir: str, reads_logs: bool) -> None:
        """Fix where this fit's steps start, once per fit: the first mpwatch callback to reach the
        first batch does it (after every callback's ``on_train_begin``, so after a
        ``BackupAndRestore`` restore); the others find it done.

        The first time for this model object: from the optimizer's ``iterations`` now, or, when
        they are past 0 and the run's logs hold the restored state (``reads_logs``: the process
        that writes them), from the step of that state (:mod:`mpwatch.record.resume`). Later
        fits of the same model continue from the last step.
        """
        if self._fit_resolved:
            return
        self._fit_resolved = True
        iterations = initial_step(self._model)
        opt = loss_scale_optimizer(getattr(self._model, "optimizer", None))
        scale = None
        if opt is not None:
            try:
                scale = float(np.asarray(opt.dynamic_scale.numpy()))
            except Exception:  # noqa: BLE001  (unbuilt: no scale yet)
                scale = None
        self.start = {"iterations": iterations, "loss_scale": scale}
        if self._resolved:
            self._sync_step()
            return
        self._resolved = True
        self.step = iterations
        if reads_logs and iterations > 0:
            from mpwatch.record.resume import find_resume_point

            point = find_resume_point(log_dir, iterations, scale)
            if point is not None:
                self.step, self.skipped_total = point.step, point.skipped_total
                logger.info(
                    "mpwatch: resumed training state (iterations %d) is step %d of %s",
                    iterations,
                    point.step,
                    log_dir,
                )

    # called from each mpwatch callback's on_train_begin
    def require(
        self, user: object, grad_every: int | None = None, read_every: int | None = None
    ) -> None:
        """``user`` records this fit; ``grad_every``: it wants gradient counts every so many
        steps; ``read_every``: it consumes the tap's data (loss scale, skips, counts) every so
        many steps (the tap is read at the smallest such interval, not at every batch)."""
        self._users[id(user)] = grad_every
        self._read_every[id(user)] = read_every
        self._needs = None
        self._fit_resolved = False  # a new fit: resolve_start runs again at its first batch
        self._cache = None
        self._consumers = set()
        self._flushed, self._flush_consumers = None, None

    def release(self, user: object) -> None:
        self._users.pop(id(user), None)
        self._read_every.pop(id(user), None)
        self._needs = None
        if not self._users and self.tap is not None:
            if self._pending and self.tap.installed:
                self._read()  # nobody flushed: keep the tap's step exact
            self._sync_step()
            self.tap.park()  # the next mpwatch fit with the same needs reuses its trace
            self.parked, self.tap = self.tap, None

    def _wanted(self) -> tuple[int, int | None]:
        """(ring capacity, gradient-count period): the ring holds a read interval of batches
        plus one call's (a read comes at the first call reaching a multiple of the interval)."""
        capacity, grad_every, _ = self._needs_now()
        return capacity, grad_every

    def _spe(self) -> int:
        """Batches per host call: ``steps_per_execution`` (or a custom loop's steps per call)."""
        return self.capacity or int(getattr(self._model, "steps_per_execution", 1) or 1)

    def read_interval(self) -> int:
        """Steps between two reads of the tap: the smallest interval of its data's consumers
        (1 for a custom training loop, which reads each call)."""
        return self._needs_now()[2]

    def _needs_now(self) -> tuple[int, int | None, int]:
        """(ring capacity, gradient-count period, read interval), computed when the users (or the
        model's steps_per_execution) change, not at every call of every callback."""
        key = (self._spe(), self.capacity)
        if self._needs is None or self._needs[0] != key:
            reads = [r for r in self._read_every.values() if r]
            if self.capacity:
                interval = 1
            else:  # nobody uses the data (a ProbeMonitor or StepTimeMonitor alone): read only
                # to keep the ring from overflowing, never at every batch
                interval = min(reads) if reads else UNUSED_READ_EVERY
            everies = [g for g in self._users.values() if g]
            self._needs = (key, (min(everies) if everies else None), interval)
        return key[0] + self._needs[2], self._needs[1], self._needs[2]

    def ensure_installed(self) -> None:
        """Install (or re-install with new needs) the tap; cheap when nothing changed."""
        spe, grad_every = self._wanted()
        if self.tap is None and self.parked is not None:
            parked, self.parked = self.parked, None
            if parked.resumable(spe, grad_every):
                parked.resume(self.step)
                self.tap = parked
                return
        tap = self.tap
        if (
            tap is not None
            and tap.installed
            and tap.capacity == spe
            and tap.grad_every == grad_every
            and tap.optimizer is self._model.optimizer
        ):
            return
        if tap is not None:
            self._sync_step()
            tap.uninstall()
        from mpwatch.record import backend

        if backend.name() == backend.JAX:
            from mpwatch.record.jax_tap import JaxTap

            self.tap = JaxTap(self._model, spe, grad_every, self.step)
        else:
            self.tap = Tap(self._model, spe, grad_every, self.step)
        self.tap.rebuild = self.rebuild
        self.tap.install()

    def _sync_step(self) -> None:
        if self.tap is not None:
            self.step = self.tap.current_step()

    def collect(self, user: object, keras_batches: int = 1) -> tuple[Collected, Collected | None]:
        """(this call's steps, the tap's data or None). Every user calls this once per
        ``on_train_batch_end`` (``keras_batches``: the batches Keras ran in the call); the first
        call does the work, the others get the same objects.

        The steps are counted on the host, with no device read. The tap is read (one host
        transfer, which waits for the device) only when the call reaches a multiple of
        :meth:`read_interval` or the ring would overflow; the data then covers every batch since
        the last read, exactly (and the host count is set to the tap's own)."""
        if self._cache is not None and id(user) not in self._consumers:
            self._consumers.add(id(user))
            return self._cache
        n = max(1, int(keras_batches))
        tap = self.tap
        data = None
        if tap is not None and tap.installed and tap.failed is None:
            steps = list(range(self.step + 1, self.step + n + 1))
            self.step += n
            self._pending += n
            every = self.read_interval()
            if (
                any(s % every == 0 for s in steps)
                or self._pending + self._spe() > tap.capacity
            ):
                data = self._read()
            elif not tap.read_ready:  # the step is traced: trace the read now, off the interval
                tap.prepare_read()  # steps (a one-time cost, not a per-interval one)
            got = Collected(steps=steps) if tap.failed is None else self._fallback(0, steps)
        else:
            got = self._fallback(n)
        self._cache = (got, data)
        self._consumers = {id(user)}
        return self._cache

    def flush(self, user: object) -> Collected | None:
        """At the end of a fit: the tap's data not read yet (the same object for every user)."""
        if self._flush_consumers is not None and id(user) not in self._flush_consumers:
            self._flush_consumers.add(id(user))
            return self._flushed
        data = None
        if self.tap is not None and self.tap.installed and self._pending:
            data = self._read()
        self._flushed, self._flush_consumers = data, {id(user)}
        return data

    def _read(self) -> Collected:
        data = self.tap.read()
        self._pending = 0
        if data.steps:
            self.step = data.steps[-1]
        return data

    def _fallback(self, n: int, steps: list[int] | None = None) -> Collected:
        """Steps counted from Keras' batches (the tap is off or failed)."""
        if steps is None:
            steps = list(range(self.step + 1, self.step + n + 1))
            self.step += n
        self._pending = 0
        if self.tap is not None:
            self.tap.set_step(self.step)
        return Collected(steps=steps, exact=False)


def state_of(model: Any) -> ModelState:
    """The model's mpwatch state, created on first use."""
    state = getattr(model, STATE_ATTR, None)
    if state is None:
        state = ModelState(model)
        object.__setattr__(model, STATE_ATTR, state)
    return state
