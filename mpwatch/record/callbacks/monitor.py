"""MixedPrecisionMonitor: all of mpwatch's recording in one callback."""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any

import keras

from mpwatch import contract
from mpwatch.record.callbacks import base
from mpwatch.record.callbacks.base import RecordingCallback
from mpwatch.record.callbacks.gradient_health import GradientHealthMonitor
from mpwatch.record.callbacks.input_health import InputHealthMonitor
from mpwatch.record.callbacks.layer_dtypes import LayerDtypeMonitor
from mpwatch.record.callbacks.loss_scale import LossScaleMonitor
from mpwatch.record.callbacks.probe_monitor import ProbeMonitor
from mpwatch.record.callbacks.profile_capture import DEFAULT_STEPS, ProfileMonitor
from mpwatch.record.callbacks.step_time import StepTimeMonitor
from mpwatch.record.callbacks.train_step import TrainStepMonitor
from mpwatch.record.runtime import backend
from mpwatch.record.runtime.budget import CostBudget, check_budget, default_budget
from mpwatch.record.runtime.run_info import run_info
from mpwatch.record.tap.jax_programs import note_missed

logger = logging.getLogger("mpwatch")

#: how long validation's start waits for Keras' worker thread to note the epoch's last call,
#: after the device has run it (the note is a host conversion of the call's logs, ready then)
NOTE_WAIT_S = 2.0
NOTE_WAIT_UNKNOWN_S = 0.05  # the epoch's length unknown: the data may have run out in the call
#: a fit that raised left Keras' worker thread with batch ends to run: the most to wait for them
STALE_NOTES_S = 2.0
DEFAULT_PROBE_EVERY = 500  # steps between probes the budget may run (and each epoch's end)


class MixedPrecisionMonitor(RecordingCallback):
    """Everything mpwatch records during ``model.fit``, in one callback.

    Bundles :class:`TrainStepMonitor`, :class:`LayerDtypeMonitor`, :class:`LossScaleMonitor`,
    :class:`GradientHealthMonitor`, :class:`InputHealthMonitor`, :class:`StepTimeMonitor`,
    :class:`ProbeMonitor` and :class:`ProfileMonitor` (each usable alone too), and itself writes
    the ``run_info`` record and ``mpwatch/train/loss`` (Keras' running training loss) at every
    Keras batch end.

    Args:
        log_dir: the run directory (created if needed; must be writable).
        log_every: interval, in batch steps, of the interval scalars (skipped steps, step time,
            memory) and of the gradient health (computed in the graph only at these steps).
        loss_scale, gradient_health, layer_dtypes, step_time: switch a part off with False.
        per_variable_gradients: also write the per-variable ``grad_variables`` record.
        input_health: each batch's max |x| and non-finite count (:class:`InputHealthMonitor`),
            so a bad batch is named by its step.
        probe, probe_every, probe_data: the float32-reference probe (:class:`ProbeMonitor`), every
            ``probe_every`` batch steps and at each epoch's end, on ``probe_data`` (default: the
            first training batch); ``probe=False`` switches it off. Without ``probe_every`` the
            budget decides (every 500 steps and each epoch's end, when it fits); with it, the
            probe runs at those steps whatever it costs.
        float8: at each probe, also measure each Dense/EinsumDense layer's error in Keras'
            float8 (:mod:`mpwatch.record.probe.float8`); ``False`` switches it off.
        loss_fn: the probe's loss, ``loss_fn(y_true, y_pred) -> scalar`` (default: the model's
            compiled loss; a model trained by a custom loop need not be compiled).
        profile: the profiler trace (:class:`ProfileMonitor`) of batches 3-5 of the first ``fit``
            (after warm-up), written where TensorBoard's Profile tab finds it too, and its copy
            converted into per-layer time by dtype. Default (None): the budget decides whether to
            capture, and whether to convert in the fit or leave the conversion to the first read
            of the run; ``True`` (or a pair ``(first, last)`` choosing the batches) captures and
            converts whatever it costs; ``False`` switches it off. It runs last, so its pauses
            fall outside the step times.
        budget: the share of the fit's wall time mpwatch may spend on itself (default 0.05, or
            ``$MPWATCH_BUDGET``); its optional work (probes, the profile, its conversion) runs
            only when it fits, and what did not is recorded (the ``budget`` record) and named by
            the diagnosis (:mod:`mpwatch.record.runtime.budget`). ``None`` (or
            ``MPWATCH_BUDGET=off``): no budget. ``probe_every`` or ``profile`` given wins over it.

    Sub-callbacks live in ``self.parts`` (built by :meth:`_build_parts`, called in order for every
    Keras hook); adding a part is one ``parts.append(...)`` line there.

    Example:
        >>> import keras, mpwatch  # doctest: +SKIP
        >>> keras.mixed_precision.set_global_policy("mixed_float16")  # doctest: +SKIP
        >>> model.fit(ds, epochs=3,
        ...           callbacks=[mpwatch.MixedPrecisionMonitor(log_dir="logs/run1")]
        ... )  # doctest: +SKIP
    """

    part = "run_info"
    #: whether Keras may run ``on_train_batch_end`` on its worker thread (None: on JAX with a GPU
    #: or TPU; :attr:`async_safe`)
    async_batch_end: bool | None = None

    @property
    def async_safe(self) -> bool:
        """What Keras asks a callback before it runs the batch ends on a worker thread of its
        own (on JAX, when every callback allows it; on TensorFlow never): then the host does not
        wait for the device at each batch end (a small model's step on a GPU is the host's
        time: 1.15 against 1.83 ms a step of keras.io's Transformer on an H200). Yes by default
        on a GPU or TPU; no on a CPU, where the device is the host's own cores and the thread
        only shares them (the monitor's batch end on the training thread is the cheaper there).
        :attr:`async_batch_end` set to True or False decides instead."""
        if self.async_batch_end is not None:
            return bool(self.async_batch_end)
        return backend.jax_on_accelerator()

    def __init__(
        self,
        log_dir: Any,
        log_every: int = 50,
        *,
        loss_scale: bool = True,
        gradient_health: bool = True,
        layer_dtypes: bool = True,
        step_time: bool = True,
        per_variable_gradients: bool = True,
        input_health: bool = True,
        probe: bool = True,
        probe_every: int | None = None,
        probe_data: Any = None,
        float8: bool = True,
        loss_fn: Any = None,
        profile: bool | tuple[int, int] | None = None,
        budget: float | None | str = "default",
    ) -> None:
        super().__init__(log_dir, log_every)
        base.check_positive_int("log_every", log_every)
        self.options = {
            "loss_scale": bool(loss_scale),
            "gradient_health": bool(gradient_health),
            "layer_dtypes": bool(layer_dtypes),
            "step_time": bool(step_time),
            "per_variable_gradients": bool(per_variable_gradients),
            "input_health": bool(input_health),
            "probe": bool(probe),
            "float8": bool(float8),
        }
        self.profile = profile
        self.probe_every = base.check_positive_int("probe_every", probe_every, allow_none=True)
        self.budget = CostBudget(default_budget() if budget == "default" else check_budget(budget))
        self.explicit = {
            k: v
            for k, v in (("probe_every", probe_every), ("profile", profile))
            if v is not None and v is not False
        }
        self.probe_data = probe_data
        self.loss_fn = loss_fn
        self.parts: list[keras.callbacks.Callback] = self._build_parts()
        self._in_fit = False  # between this monitor's on_train_begin and its on_train_end
        self._reset_batch_path()

    def _reset_batch_path(self) -> None:
        self._thread = threading.get_ident()  # the training thread
        self._open: tuple[int, float, bool] | None = None  # the call in flight: begin, clock, busy
        self._finished: collections.deque = collections.deque()  # worker thread: end, clock, loss
        # the calls settled here whose notes are to come: end -> (last step, batches, clock, first)
        self._settled: dict[int, tuple[int, int, float, bool]] = {}
        self._early: dict[int, tuple[float, Any]] = {}  # notes waiting for an earlier call's
        self._last_done: float | None = None  # the last noted call's results (their clock)
        self._noting: tuple[int, float, bool] | None = None
        self._quiet_to = -1  # calls whose steps all lie at or before it skip the parts' hooks
        self._per_call: int | None = None  # batches per call
        self._alone: bool | None = None  # the monitor and its parts are the state's only users
        self._fit_calls = 0
        self._first_begin: float | None = None  # the clock of the fit's first call's begin
        self._ends_here = False  # a batch end of this fit ran on the training thread
        self._loss_unreadable = False  # said once a fit: the train step's "loss" is not a number

    def _build_parts(self) -> list[keras.callbacks.Callback]:
        o, d, n = self.options, self.log_dir, self.log_every
        parts: list[keras.callbacks.Callback] = []
        parts.append(TrainStepMonitor(d))  # the contract every judgement rests on
        if o["layer_dtypes"]:
            parts.append(LayerDtypeMonitor(d, n))
        if o["loss_scale"]:
            parts.append(LossScaleMonitor(d, n))
        if o["gradient_health"]:
            parts.append(GradientHealthMonitor(d, n, per_variable=o["per_variable_gradients"]))
        if o["input_health"]:
            parts.append(InputHealthMonitor(d, n))
        self._step_time: StepTimeMonitor | None = None
        if o["step_time"]:  # the monitor clocks the calls (also from Keras' worker thread)
            self._step_time = StepTimeMonitor(d, n)
            self._step_time.clocked = True
            parts.append(self._step_time)
        # the profile before the probe: the window closes at a batch end before a probe due
        # then runs (none runs inside it: ProbeMonitor)
        if self.profile is not False:
            steps = DEFAULT_STEPS if self.profile in (None, True) else self.profile
            profile = ProfileMonitor(d, profile_steps=steps)
            profile.budget, profile.explicit = self.budget, self.profile is not None
            parts.append(profile)
        if o["probe"]:
            every = self.probe_every or DEFAULT_PROBE_EVERY
            probe = ProbeMonitor(d, every, self.probe_data, self.loss_fn)
            probe.budget, probe.explicit = self.budget, self.probe_every is not None
            probe.float8 = o["float8"]
            parts.append(probe)
        return parts

    def _charged(self, part: Any, hook: Any, *args: Any) -> None:
        """Run one hook, its wall time charged to ``part`` in the budget's ledger (on every
        batch: two clock reads, no context manager), less the time a tap read waited for the
        device to finish the steps queued before it (training's time, not mpwatch's)."""
        waited = self._device_wait()
        t0 = time.perf_counter()
        try:
            hook(*args)
        finally:
            spent = time.perf_counter() - t0 - (self._device_wait() - waited)
            self.budget.charge(part.part, max(0.0, spent))

    def _device_wait(self) -> float:
        tap = getattr(self.state, "tap", None)
        return getattr(tap, "device_wait", 0.0) if tap is not None else 0.0

    def _each(self, hook: str, *args: Any) -> None:
        """``hook`` of every part, each charged as :meth:`_charged` charges it (one clock read
        between two parts: this runs twice per batch, so the ledger is added to directly)."""
        tap = getattr(self.state, "tap", None)
        clock, spent = time.perf_counter, self.budget.spent
        waited, t0 = getattr(tap, "device_wait", 0.0), clock()
        for p in self.parts:
            try:
                getattr(p, hook)(*args)
            finally:
                now = clock()
                wait = getattr(tap, "device_wait", 0.0)
                d = now - t0 - (wait - waited)
                if d > 0.0:
                    spent[p.part] = spent.get(p.part, 0.0) + d
                t0, waited = now, wait

    # --- delegation ----------------------------------------------------------------------------
    def set_model(self, model: Any) -> None:
        super().set_model(model)
        for p in self.parts:
            p.set_model(model)

    def set_params(self, params: Any) -> None:
        super().set_params(params)
        for p in self.parts:
            p.set_params(params)

    def on_train_begin(self, logs: Any = None) -> None:
        if self._in_fit:  # the last fit raised (Keras skips on_train_end): its notes are stale
            self._let_stale_notes_in()
            self._keep_raised_losses()
        self._in_fit = True
        self._reset_batch_path()
        self.budget.begin_fit(self.params)
        self._charged(self, super().on_train_begin, logs)
        self.state.budget, self.budget.trace_seconds = self.budget, self.state.first_step_s
        self._each("on_train_begin", logs)

    # --- the batch path --------------------------------------------------------------------------
    # A call is *busy* when a part has work at it (asked after each busy call: quiet_through, and
    # every interval's end); a quiet call runs the monitor's own bookkeeping alone (the steps,
    # the loss, the call's time). Keras runs on_train_batch_end on a worker thread of its own when
    # every callback allows it (``async_safe``: on JAX, so that the host never waits for the
    # device at a batch end): there mpwatch only notes the call's end (its clock once the step's
    # logs are ready, and the loss), and does the batch's work on the training thread before the
    # next call (on_train_batch_begin), at the validation's start, or at the epoch's end.
    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        if self._open is not None:  # the last call's end went to Keras' worker thread
            self._end_call(batch - 1, {}, None)
        state = self.state
        t0 = time.perf_counter()
        if self._per_call is None and state is not None:
            self._per_call = state._spe()  # fixed for a fit
        busy = state is None or not self._active or state.step + self._per_call > self._quiet_to
        if busy:
            self._charged(self, super().on_train_batch_begin, batch, logs)
            self._each("on_train_batch_begin", batch, logs)
        else:
            self._call_begin = batch
            spent = self.budget.spent
            spent[self.part] = spent.get(self.part, 0.0) + (time.perf_counter() - t0)
        self._open = (batch, time.perf_counter(), busy)
        if self._first_begin is None:
            self._first_begin = self._open[1]

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if threading.get_ident() != self._thread:  # Keras' worker thread
            try:  # (what raises here would reach Keras' wait for its thread: never)
                self._finished.append((batch, time.perf_counter(), (logs or {}).get("loss")))
            except Exception:  # noqa: BLE001
                logger.debug("mpwatch: a batch end's note was lost", exc_info=True)
            return
        self._ends_here = True
        self._end_call(batch, logs or {}, time.perf_counter())

    def on_test_begin(self, logs: Any = None) -> None:
        """Validation starts: the epoch's last call is settled first, so that its work (a
        profile window's end, the layer tracer's removal) is done before the validation runs.
        Keras does not wait for its worker thread here: the monitor waits for the device and
        then for the worker's note of that call."""
        if self._open is not None and self._in_fit and self._worker_notes():
            self._await_note(self._open[0])
        self._settle_noted(discard=False)

    def _worker_notes(self) -> bool:
        """Whether this fit's batch ends may go to Keras' worker thread: on JAX (Keras never
        runs them there on TensorFlow), when the monitor says it is async-safe, and no batch end
        of the fit ran on the training thread (another callback that is not async-safe keeps
        them all there). Else a call still open has no note to come: its data ran out."""
        return backend.name() == backend.JAX and self.async_safe and not self._ends_here

    def _await_note(self, begin: int) -> None:
        """Wait (the device, then at most :data:`NOTE_WAIT_S`) for the worker thread's note of
        the call that began at ``begin``. With the epoch's length known a call that began ran;
        with it unknown the data may have run out in it, and no note comes: a short wait."""
        steps = (self.params or {}).get("steps")
        limit = NOTE_WAIT_S if steps is not None and begin < steps else NOTE_WAIT_UNKNOWN_S
        try:
            if self.state is not None:
                self.state.wait_for_device()
            deadline = time.perf_counter() + limit
            while not self._noted_since(begin) and time.perf_counter() < deadline:
                time.sleep(0.001)  # (lets the worker thread take the GIL)
        except Exception:  # noqa: BLE001  (never lose training to mpwatch: settled later)
            logger.debug("mpwatch: waiting for a batch end's note failed", exc_info=True)

    def _let_stale_notes_in(self) -> None:
        """A fit that raised left Keras' worker thread with batch ends of its own to run (Keras
        skips its wait for them): wait, at most :data:`STALE_NOTES_S`, until every call it
        settled has its note (the open one may be the call that raised); a later one is dropped
        by its clock (:meth:`_take_notes` keeps a fit's notes from its first call on)."""
        if not self._worker_notes():
            return
        deadline = time.perf_counter() + STALE_NOTES_S
        while not set(self._settled) <= set(self._take_notes()) and time.perf_counter() < deadline:
            time.sleep(0.001)

    def _keep_raised_losses(self) -> None:
        """The losses of a fit that raised, buffered since its last interval (and, from Keras'
        worker thread, those whose notes came since): written now, at their steps, as its end
        would have written them."""
        try:
            if self._noting is not None or self._settled:
                self._drain()
            if getattr(self, "_losses", None) and self.writer is not None:
                self._flush_loss()
        except Exception:  # noqa: BLE001  (never lose the next fit to the last one's records)
            logger.debug("mpwatch: a raised fit's losses were not written", exc_info=True)

    def _take_notes(self) -> dict[int, tuple[float, Any]]:
        """The worker thread's notes so far, by call end (taken from its queue one at a time:
        the queue is the only thing both threads touch). A note from before this fit's first
        call is a raised fit's, dropped."""
        notes, first = self._early, self._first_begin
        while self._finished:
            end, t_done, loss = self._finished.popleft()
            if first is not None and t_done >= first:
                notes[end] = (t_done, loss)
        return notes

    def _noted_since(self, begin: int) -> bool:
        return any(e >= begin for e in self._take_notes())

    def _settle_noted(self, discard: bool) -> None:
        """The call in flight, settled when the worker thread noted its end; else, with
        ``discard``, dropped: a begin whose call never ran (the data ran out in it; a custom
        loop's last begin)."""
        if self._open is None:
            return
        begin = self._open[0]
        ends = [e for e in self._take_notes() if e >= begin]
        if ends:
            self._end_call(max(ends), {}, None)
        elif discard:
            self._open = None

    def _end_call(self, end: int, logs: dict[str, Any], t_end: float | None) -> None:
        """The end of the call in flight (``t_end``: when its results were ready; None when
        Keras' worker thread notes it)."""
        opened, self._open = self._open, None
        if opened is None or not self._active or self.state is None:
            return
        begin, t_begin, busy = opened
        state, waited, t0 = self.state, self._device_wait(), time.perf_counter()
        self._call_begin = begin
        n = self._batches_in_call(end)
        self._fit_calls += 1
        first = self._fit_calls == 1
        if t_end is not None and not first and self._step_time is not None:
            self._step_time.add_call(t_end - t_begin, n)
        self._noting = (end, t_begin, first) if t_end is None else None
        if self._alone is None:  # no other mpwatch callback counts the steps beside the parts
            self._alone = state.users() <= {id(self), *(id(p) for p in self.parts)}
        last = None if busy or not self._alone else state.advance(n)
        if last is not None:  # a quiet call: the monitor's own bookkeeping alone
            self._record_call(last, n, logs)
            return self._quiet_end(t0, n)
        got = self._guard("steps", state.collect, self, n)
        steps, data = got if got is not None else (None, None)
        if not busy and steps is not None and (data is None or not data.n):  # quiet, collected
            self._guard(self.part, self._batch_end, steps, logs)  # (for another mpwatch callback)
            return self._quiet_end(t0, n)
        writer = self.writer
        if writer is not None:  # the parts share the writer: one write for all of them ...
            writer.hold()
        try:
            if steps is not None:
                if data is not None and data.n:
                    self._guard(self.part, self._tap_data, data)
                if steps.n:
                    self._guard(self.part, self._batch_end, steps, logs)
            # the monitor's own part, less the tap read's wait for the device (training's time)
            own = time.perf_counter() - t0 - (self._device_wait() - waited)
            self.budget.charge(self.part, own)
            self._each("on_train_batch_end", end, logs)
        finally:
            if writer is not None:  # ... here, charged to the ledger's "writes"
                t1 = time.perf_counter()
                self._release(writer)
                self.budget.charge("writes", time.perf_counter() - t1)
        self.budget.batch_end(n)
        if state.first_step_s is None:  # the model's first monitored call
            state.first_step_s = self.budget.first_step_seconds()
        self._quiet_to = self._quiet_after(state.step)

    def _quiet_end(self, t0: float, n: int) -> None:
        """A quiet call's time, charged to the monitor's own part; the call, to the budget."""
        spent = self.budget.spent
        spent[self.part] = spent.get(self.part, 0.0) + (time.perf_counter() - t0)
        self.budget.batch_end(n)

    def _drain(self) -> None:
        """The worker thread's notes of the calls settled so far, in their order: each call's
        loss, and its time (from the later of its begin and the previous call's results, to its
        own results). A note that came before the note of an earlier call waits for it."""
        notes = self._take_notes()
        for end in sorted(self._settled):
            if end not in notes:
                break
            (t_done, loss), (last_step, n, t_begin, first) = notes.pop(end), self._settled.pop(end)
            if not first and self._last_done is not None:
                self.budget.call_done(t_done - self._last_done, n)
            if not first and self._step_time is not None:
                start = t_begin if self._last_done is None else max(t_begin, self._last_done)
                self._step_time.add_call(t_done - start, n, pooled=True)
            self._last_done = t_done
            self._buffer_loss(last_step, loss)

    def _quiet_after(self, step: int) -> int:
        """The last step through which no part has batch work (nor the monitor's interval)."""
        quiet = base.before_next_multiple(step, self.log_every)
        try:
            tap = self.state.tap
            if tap is not None and tap.installed and tap.failed is None:
                quiet = min(quiet, base.before_next_multiple(step, self.state.read_interval()))
            for p in self.parts:
                quiet = min(quiet, p.quiet_through(step))
        except Exception:  # noqa: BLE001  (never lose training to mpwatch: every call busy)
            logger.debug("mpwatch: quiet_through failed", exc_info=True)
            return step
        return quiet

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        if self._settled or self._early:
            logger.debug("mpwatch: notes of the last epoch's calls lost: %s", self._settled)
            self._settled, self._early = {}, {}  # Keras' batch indices start again
        self._each("on_epoch_begin", epoch, logs)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self._catch_up()
        self._each("on_epoch_end", epoch, logs)

    def _catch_up(self) -> None:
        """At an epoch's end (Keras has waited for its worker thread): the last call's work, and
        every note; with several batches a call, the steps of a last call the data ran out in."""
        self._settle_noted(discard=True)
        self._drain()
        if (self._per_call or 1) > 1 and self.state is not None:
            self._guard("steps", self._settle_short_call)

    def _settle_short_call(self) -> None:
        """The host's count set to the tap's (:meth:`ModelState.settle_count`: data that ends
        inside a call, which Keras' indices count whole), and its held-back loss moved there."""
        if self.state.settle_count():
            self._quiet_to = self._quiet_after(self.state.step)
        if getattr(self, "_loss_steps", None):
            self._loss_steps = [min(s, self.state.step) for s in self._loss_steps]

    def on_train_end(self, logs: Any = None) -> None:
        self._in_fit = False
        try:
            self._catch_up()
            self._each("on_train_end", logs)
        finally:
            super().on_train_end(logs)

    # --- own records -----------------------------------------------------------------------------
    def run_info(self) -> dict[str, Any]:
        """The ``run_info`` record's payload (:func:`mpwatch.record.runtime.run_info.run_info`)."""
        return run_info(
            self.model,
            batch_size=(self.params or {}).get("batch_size"),
            log_every=self.log_every,
            start=dict(self.state.start) if self.state is not None else None,
        )

    def _begin(self) -> None:
        self._loss_steps: list[int] = []
        self._losses: list[float] = []
        self.writer.record(contract.KIND_RUN_INFO, self.state.step, self.run_info())

    def _batch_end(self, got: Any, logs: dict[str, Any]) -> None:
        self._record_call(got.last_step, got.n, logs)
        if any(s % self.log_every == 0 for s in got.steps):
            if self._noting is not None:
                self._drain()
            self._flush_loss(hold_last=(self._per_call or 1) > 1)

    def _record_call(self, last_step: int, n: int, logs: dict[str, Any]) -> None:
        """A call's loss, buffered (written once per interval); from Keras' worker thread, the
        call waits for its note (:meth:`_drain`)."""
        if self._noting is not None:
            end, t_begin, first = self._noting
            self._settled[end] = (last_step, n, t_begin, first)
            return
        self._buffer_loss(last_step, logs.get("loss"))

    def _buffer_loss(self, step: int, loss: Any) -> None:
        """A call's loss, buffered; none when the loss part failed, and none for a loss that is
        not one number (a custom ``train_step`` may return any tensor as its "loss": never a
        reason to stop the fit)."""
        if loss is None or self.part in self._failed or self._loss_unreadable:
            return
        try:
            value = float(loss)
        except (TypeError, ValueError):
            if not self._loss_unreadable:
                self._loss_unreadable = True
                msg = "mpwatch: the train step's 'loss' is not one number (%s): it is not recorded"
                logger.warning(msg, type(loss).__name__)
            return
        self._loss_steps.append(step)
        self._losses.append(value)

    def _flush_loss(self, hold_last: bool = False) -> None:
        """The buffered losses, written; ``hold_last``: all but the newest call's, which may be
        an epoch's short last call, its step known at the epoch's end (:meth:`_catch_up`)."""
        keep = 1 if hold_last and self._loss_steps else 0
        n = len(self._loss_steps) - keep
        if n > 0:
            self.writer.scalar_series(contract.TRAIN_LOSS, self._loss_steps[:n], self._losses[:n])
        self._loss_steps, self._losses = self._loss_steps[n:], self._losses[n:]

    def _end(self) -> None:
        if getattr(self, "_losses", None):
            self._flush_loss()
        self.budget.end_fit()
        note_missed(self.budget, self.state.tap)
        explicit = {k: list(v) if isinstance(v, tuple) else v for k, v in self.explicit.items()}
        self.writer.record(contract.KIND_BUDGET, self.state.step, self.budget.payload(explicit))
