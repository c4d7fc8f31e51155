"""mpwatch's per-model recording state: the batch step counter, and the in-graph tap's users,
installation and reads.

**Steps.** mpwatch writes every value at its *batch step*: 1 for the first training batch the model
ever ran under mpwatch, counted on across ``fit`` calls (also across fits where
``steps_per_execution`` makes one Keras callback call cover several batches). The counter lives on
the model object (attribute ``_mpwatch_state``). Where a model's first mpwatch fit in a process
starts is fixed at its first batch (:meth:`ModelState.resolve_start`, after every callback's
``on_train_begin``, so after a restore): at ``optimizer.iterations`` (a model trained before mpwatch
was attached does not restart at 1), or, for a restored state the run's logs hold, at that state's
step (:mod:`mpwatch.record.runtime.resume`). It is not ``optimizer.iterations``, which does not
advance on a skipped step.

**The tap.** One tap per model records, inside the traced train step, each batch's loss scale,
the scale its gradients were scaled with, whether its update was skipped, its input health, and
every ``grad_every`` steps the gradient counts, into ring buffers on the device: TensorFlow's
:class:`mpwatch.record.tap.tf_tap.Tap`, JAX's :class:`mpwatch.record.tap.jax_tap.JaxTap`.

**Reads.** The host counts the steps itself (Keras' batch indices give each call's batches) and
reads the buffers only at the calls that reach a multiple of the read interval (the smallest
``log_every`` of the callbacks that use the tap's data: loss scale, gradient health), when the
ring would overflow, and at the end of the fit (:meth:`ModelState.collect`,
:meth:`ModelState.flush`), whichever mpwatch callback asks first; the others get the same
objects. A read is one host transfer, which waits for the device; between reads mpwatch touches no
device value. The data of a read covers every batch since the last one, exactly.

The tap is installed when the first batch begins (all callbacks have said what they need by then)
and the train function is rebuilt to trace it. At ``on_train_end`` it is *parked*
(:meth:`TapBase.park`): unwrapped, its traced train function kept on the model's state, and Keras'
own train function given back, so a later ``fit`` without mpwatch runs (or traces) a clean one. The
next mpwatch ``fit`` with the same needs (ring size, gradient-count period, optimizer, no
``compile`` since) reinstates the parked function without tracing anything.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from mpwatch.record.runtime import backend
from mpwatch.record.tap.tap_common import Collected, TapBase, loss_scale_optimizer

logger = logging.getLogger("mpwatch")
STATE_ATTR = "_mpwatch_state"
UNUSED_READ_EVERY = 100  # steps between reads of a tap whose data no callback uses


def initial_step(model: Any) -> int:
    """``optimizer.iterations`` of a model, 0 when there is none yet."""
    opt = getattr(model, "optimizer", None)
    try:
        if opt is not None and getattr(opt, "built", True):
            return int(backend.host(opt.iterations))
    except Exception:  # noqa: BLE001  (an unbuilt optimizer: start at 0)
        pass
    return 0


class ModelState:
    """mpwatch's state on one model: the step counter, the tap, and who uses it."""

    def __init__(self, model: Any) -> None:
        self.step = initial_step(model)
        self.skipped_total = 0
        self.start: dict[str, Any] = {"iterations": self.step, "loss_scale": None}
        self._resolved = False  # where the model's first mpwatch fit starts is fixed
        self._fit_resolved = False  # ... and this fit's start
        self.tap: TapBase | None = None
        self.parked: Any = None  # the last fit's tap, parked with its traced train function
        #: the running fit's cost budget (MixedPrecisionMonitor's; None without one)
        self.budget: Any = None
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
        # a profiler trace is being captured (ProfileMonitor): mpwatch runs none of its own
        # programs (the probe, its float8 and fix checks) until it stops, so that the trace and
        # every figure read from it hold the training steps alone
        self.profiling = False
        self._ensured: Any = None  # the collected call after which the tap was last ensured
        # Keras' first call of this model's first monitored fit, mpwatch's own time out (its
        # trace of the train step; the budget's estimate of a probe's trace in later fits)
        self.first_step_s: float | None = None

    def wait_for_device(self) -> None:
        """Wait until the device has run every step queued so far: Keras on JAX dispatches the
        steps ahead of the host (with no batch hook that reads the logs on the training thread,
        it does not wait for one), so mpwatch's own work on the device (a probe, a profile
        window) waits first, and is timed alone. The wait is training's time: counted with the
        tap's reads (``device_wait``), never as mpwatch's."""
        if backend.name() != backend.JAX:
            return
        jax_state = getattr(self._model, "_jax_state", None)
        if not jax_state:
            return
        import jax

        t0 = time.perf_counter()
        try:
            jax.block_until_ready(jax_state)
        except Exception:  # noqa: BLE001  (an array Keras already handed on: nothing to wait for)
            return
        if self.tap is not None:
            self.tap.device_wait += time.perf_counter() - t0

    def resolve_start(self, log_dir: str, reads_logs: bool) -> None:
        """Fix where this fit's steps start, once per fit: the first mpwatch callback to reach the
        first batch does it (after every callback's ``on_train_begin``, so after a
        ``BackupAndRestore`` restore); the others find it done.

        The first time for this model object: from the optimizer's ``iterations`` now, or, when
        they are past 0 and the run's logs hold the restored state (``reads_logs``: the process
        that writes them), from the step of that state (:mod:`mpwatch.record.runtime.resume`). Later
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
                scale = float(backend.host(opt.dynamic_scale))
            except Exception:  # noqa: BLE001  (unbuilt: no scale yet)
                scale = None
        self.start = {"iterations": iterations, "loss_scale": scale}
        if self._resolved:
            self._sync_step()
            return
        self._resolved = True
        self.step = iterations
        if reads_logs and iterations > 0:
            from mpwatch.record.runtime.resume import find_resume_point

            point = find_resume_point(log_dir, iterations, scale)
            if point is not None:
                self.step, self.skipped_total = point.step, point.skipped_total
                logger.info(
                    "mpwatch: resumed training state (iterations %d) is step %d of %s",
                    iterations,
                    point.step,
                    log_dir,
                )
        # only the writing process reads the logs: every JAX process continues at its step
        # (the steps decide when each probe, one program of all of them, runs)
        self.step, self.skipped_total = backend.broadcast((self.step, self.skipped_total))

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
        self._ensured = None

    def release(self, user: object) -> None:
        self._users.pop(id(user), None)
        self._read_every.pop(id(user), None)
        self._needs = None
        self._ensured = None
        if not self._users:
            self.budget = None
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
        """Install (or re-install with new needs) the tap; cheap when nothing changed (every
        user calls it at each batch's begin: after the first, nothing is looked at again until
        the next batch's steps are collected or the users change)."""
        tap = self.tap
        if self._ensured is self._cache and self._ensured is not None and tap is not None:
            if tap.installed:
                return
        self._ensure_installed()
        self._ensured = self._cache

    def _ensure_installed(self) -> None:
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

        if backend.name() == backend.JAX:
            from mpwatch.record.tap.jax_tap import JaxTap

            self.tap = JaxTap(self._model, spe, grad_every, self.step)
        else:
            from mpwatch.record.tap.tf_tap import Tap

            self.tap = Tap(self._model, spe, grad_every, self.step)
        self.tap.rebuild = self.rebuild
        self.tap.install()
        programs = getattr(self.tap, "programs", None)
        if programs is not None:  # the counts' own program compiles when the fit is long enough
            programs.budget_of = lambda: self.budget

    def _tap_count(self) -> int | None:
        """The tap's step count, where it counted since its (re)start; None where it did not (a
        tap whose optimizer was never applied, as a GAN's compiled one: the host's count
        stands)."""
        tapped = int(self.tap.current_step())
        return tapped if tapped > self.tap.restarted_at else None

    def _sync_step(self) -> None:
        """The host's count set to the tap's, where the tap counted."""
        if self.tap is not None:
            tapped = self._tap_count()
            if tapped is not None:
                self.step = tapped

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
            due = self._read_due(n)
            self.step += n
            self._pending += n
            if due:
                data = self._read()
            elif not tap.read_ready:  # the step is traced: trace the read now, off the interval
                tap.prepare_read()  # steps (a one-time cost, not a per-interval one)
            got = Collected(steps=steps) if tap.failed is None else self._fallback(0, steps)
        else:
            got = self._fallback(n)
        self._cache = (got, data)
        self._consumers = {id(user)}
        return self._cache

    def users(self) -> set[int]:
        """The ids of the callbacks recording this fit."""
        return set(self._users)

    def advance(self, n: int) -> int | None:
        """Count a call of ``n`` batches on the host when nothing is to be read at it (no read
        step in it, room in the ring): the last step; None when :meth:`collect` must take the
        call instead (a read falls in it, or the tap is off, failed or not ready). For
        :class:`MixedPrecisionMonitor`'s quiet calls, when it and its parts are the only users
        (any other collects every call: :meth:`users`)."""
        tap = self.tap
        if tap is None or not tap.installed or tap.failed is not None or not tap.read_ready:
            return None
        if self._read_due(n):
            return None
        self.step, self._pending = self.step + n, self._pending + n
        return self.step

    def _read_due(self, n: int) -> bool:
        """Whether the next call, of ``n`` batches, is read: it reaches a multiple of
        :meth:`read_interval`, or the ring would overflow (counted before the call)."""
        every, step = self.read_interval(), self.step
        return (step + n) // every != step // every or self._pending + n + self._spe() > (
            self.tap.capacity
        )

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

    def settle_count(self) -> int:
        """At an epoch's end: the host's step count set back to the tap's own, when the host
        counted batches that never ran (with the epoch's length unknown and several batches a
        call, Keras' indices count the last call whole though the data ran out in it); the
        number of such batches (0 when the counts agree). One scalar from the device, asked
        once an epoch (the device has finished the epoch's steps by then)."""
        tap = self.tap
        if tap is None or not tap.installed or tap.failed is not None:
            return 0
        try:
            tapped = self._tap_count()
        except Exception:  # noqa: BLE001  (never lose training to mpwatch: counts kept)
            logger.debug("mpwatch: could not read the tap's step count", exc_info=True)
            return 0
        over = 0 if tapped is None else self.step - tapped
        if not 0 < over < self._spe():  # a short call counts at most spe - 1 batches too many
            return 0
        self.step -= over
        self._pending = max(0, self._pending - over)
        return over

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
