"""ProbeMonitor: when the probe runs during ``fit``, and on which batch.

The callback probes (:class:`mpwatch.record.probe.probe.Probe`) every ``every`` batch steps and at
the end of each epoch, always on the same batch: the ``probe_data`` given (a ``tf.data.Dataset``'s
first batch), else the first training batch of the first ``fit``, taken as it passes into Keras'
train function (:meth:`ProbeMonitor._capture_next_batch`: one call of the train function is
wrapped, on TensorFlow and on JAX, with nothing per step and no extra trace), and writes each
probe's record (``contract.KIND_PROBE``) at its batch step. What a probe measures and costs:
:mod:`mpwatch.record.probe.probe`.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import numpy as np

from mpwatch.record.callbacks.base import (
    ALWAYS_QUIET,
    CannotRun,
    RecordingCallback,
    before_next_multiple,
    check_positive_int,
)
from mpwatch.record.probe import underflow
from mpwatch.record.probe.fix_gate import FixGate, first_pass
from mpwatch.record.probe.probe import Probe, batch_size_of, first_batch
from mpwatch.record.tap.tap_common import loss_scale_optimizer

logger = logging.getLogger("mpwatch")

#: before float8 readiness has been measured once, the budget takes it to cost this many training
#: steps (it is one training-mode pass of the model plus arithmetic per Dense layer)
FLOAT8_PASS_STEPS = 2.0


def broken_training(model: Any, logs: Any = None) -> str | None:
    """Why the training is broken now, in words, or None (also None where a model output is
    16-bit: the diagnosis names that cause without a probe). Under a LossScaleOptimizer: its scale
    has fallen to 1 or below (even an unscaled pass overflows float16: every step is skipped, and
    no scale helps); its reported loss is not the sign, since one skipped step's non-finite loss
    makes the epoch's mean loss Keras reports NaN while the steps around it train (a float16
    classifier's occasional overflow). Without one (bfloat16, float32): the loss Keras reports
    (``logs``) is not finite, which no step skipped. Then only the probe names the cause (the
    layer that is not finite, the fix checked on its batch), and the budget lets one run
    (``needed``). On JAX the scale is the variables' as Keras last synced them (each epoch's
    end)."""
    if _outputs_16bit(model):
        return None  # a 16-bit output: a cause the diagnosis names without a probe (output-16bit)
    lso = loss_scale_optimizer(getattr(model, "optimizer", None))
    if lso is not None:
        scale = float(np.asarray(lso.dynamic_scale.numpy()))
        if scale <= 1.0:
            return f"the loss scale has fallen to {scale:g}: even an unscaled pass overflows"
        return None
    loss = (logs or {}).get("loss") if isinstance(logs, dict) else None
    try:
        value = float(np.asarray(loss)) if loss is not None else None
    except (TypeError, ValueError):
        value = None
    if value is not None and not math.isfinite(value):
        return f"the training loss is {value}"
    return None


def _outputs_16bit(model: Any) -> bool:
    """Whether a model output is 16-bit (a keras.applications classifier under a mixed policy):
    its overflow is what skips the steps, and the diagnosis names it from the layer table."""
    import keras

    from mpwatch.formats import is_16bit

    outs = keras.tree.flatten(getattr(model, "outputs", None) or [])
    return any(is_16bit(str(getattr(t, "dtype", "") or "")) for t in outs)


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
        self.float8 = True  # measure float8 readiness at each probe (MixedPrecisionMonitor's)
        self.keep = 3
        # set by MixedPrecisionMonitor: its cost budget (None: every probe runs), and whether
        # the user asked for this schedule (then it runs whatever it costs)
        self.budget: Any = None
        self.explicit = True
        self._ahead_decided = False  # whether to compile the probe ahead was decided
        self._ahead = False  # it was (JAX): the first probe's estimate is its passes
        self._held = False  # a probe fell due inside a profile window and waits for its end
        self._traced_s = 0.0  # seconds of the probe's trace already paid ahead (not compiled)
        self._needed_ran = False  # a probe ran this fit because the training was broken
        self._fits_size: int | None = None  # the largest probe batch that fitted the device

    # --- Keras hooks (via RecordingCallback) -----------------------------------------------------
    def _begin(self) -> None:
        from mpwatch.record.callbacks.train_step import has_forward_pass

        self._needed_ran = False  # a probe ran this fit because the training was broken

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
            self.probe.float8 = self.float8
            self._ahead_decided = self._ahead = False
            self._traced_s = 0.0
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

        from mpwatch.record.runtime import backend

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
                try:
                    monitor._data = keras.tree.map_structure(_local_copy, data)
                except Exception as e:  # noqa: BLE001  (the step runs whatever happens here)
                    logger.warning("mpwatch: probe: could not keep a training batch: %r", e)
                return original(state, itertools.chain([data], iterator))

            self._wrapped_train_function = capture
            model.train_function = capture
            return
        import tensorflow as tf

        replicas = model.distribute_strategy.num_replicas_in_sync
        if replicas > 1:  # each replica takes its part of the batch inside the train function
            self._off = True  # (nothing to probe this run: said once, in one line, by _guard)
            raise CannotRun(
                f"training is distributed ({replicas} replicas) and no probe_data was given: "
                "pass probe_data=(x, y), a training batch, to MixedPrecisionMonitor or "
                "ProbeMonitor"
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
        if not self._ahead_decided and self._data is not None and self.probe is not None:
            self._compile_ahead()
        if self._held and not self._profiling_now():
            self._probe(got.last_step)  # the probe the profile window held back, on these weights
        if any(s % self.every == 0 for s in got.steps):
            self._probe(got.last_step, logs)

    def _compile_ahead(self) -> None:
        """On JAX, once the probe batch is known: trace the probe and compile it beside training
        (:meth:`Probe.precompile`) when a probe is going to run (asked for explicitly, no budget,
        or the budget's estimate of a first probe fits now that the step time is known). On a
        GPU (or TPU) host, whose cores are mostly idle, the compile runs on a thread; on a CPU
        only the loading of an executable an earlier process compiled does
        (:mod:`mpwatch.record.runtime.program_cache`): a compile would share the cores with training
        (and be hidden from the ledger), so there the first probe compiles the program traced
        here."""
        from mpwatch.record.runtime import backend

        if backend.name() != backend.JAX:
            self._ahead_decided = True
            return
        budget = self.budget
        if budget is not None and not self.explicit:
            if budget.step_seconds() is None:
                return  # decided when the fit's step time is known
            left = budget.allowance()
            if left is not None and self._estimate(budget) > left:  # as the probe will be asked
                self._ahead_decided = True
                return
        self._ahead_decided = True
        t0 = time.perf_counter()
        try:
            self._ahead = self.probe.precompile(self._data, cached_only=_on_cpu())
        except Exception:  # noqa: BLE001 - the probe itself traces (and says why) when it runs
            logger.debug("mpwatch: probe: compiling ahead failed", exc_info=True)
        else:
            if not self._ahead:  # traced, not compiled: the first probe has that much less to do
                self._traced_s = time.perf_counter() - t0

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if self._active and self._begun and self.on_epoch_end_probe:
            self._guard(self.part, self._probe, self._step(), logs)

    def _end(self) -> None:
        if self._held and not self._profiling_now():
            self._guard(self.part, self._probe, self._step())
        self._held = False  # a window still open at the end (a profiler callback listed after
        # this one): the probe is not run into its trace
        if self._wrapped_train_function is not None:
            if self.model.train_function is self._wrapped_train_function:
                self.model.train_function = None
            self._wrapped_train_function = None

    # --- probing ---------------------------------------------------------------------------------
    def _profiling_now(self) -> bool:
        return bool(getattr(self.state, "profiling", False))

    def _probe(self, step: int | None, logs: Any = None) -> None:
        if step is None or step == self._last_probe_step or self._data is None:
            return
        if getattr(self, "_off", False):
            return
        if self._profiling_now():
            # a profiler trace is being captured: the probe's passes would be in it, counted as
            # the layers' time (its float32 reference as float32 time); it runs at the first
            # batch end after the capture stops, on the weights of that step
            self._held = True
            return
        self._held = False
        self._last_probe_step = step
        budget = self.budget
        from mpwatch.record.runtime import backend

        # several JAX processes run one probe program: each takes process 0's decision (each
        # budget measured its own clock)
        if budget is not None:
            estimate = self._estimate(budget)
            # a broken training gets one probe a fit whatever the budget: only it finds the cause
            needed = None if self.explicit or self._needed_ran else self._broken(logs)
            run = budget.decide("probe", step, estimate, explicit=self.explicit, needed=needed)
            if not backend.broadcast((int(run),))[0]:
                return  # the decision is kept: the diagnosis says it was skipped, and why
            self._needed_ran = self._needed_ran or budget.decisions[-1].action == "needed"
        self.state.wait_for_device()  # the steps queued before it are training's time
        t0 = time.perf_counter()
        memory, batch = self._memory(step)  # (on JAX it compiles the program the probe runs)
        if memory is not None and not memory["fits"]:
            return
        source = "probe_data" if self.probe_data is not None else "training"
        gate = self.probe.fix_gate = self._fix_gate(budget, t0)
        try:
            share = 1.0 if memory is None or not memory.get("sub_batch_of") else (
                batch_size_of(batch) / memory["sub_batch_of"]
            )
            payload = self.probe.run(batch, batch_source=source, share=share)
            self._training_mode(payload, batch)
        finally:
            self.probe.fix_gate = None
        self._op_overflows(payload, batch)
        if budget is not None:
            kept = gate.decision()
            if kept is not None:
                budget.record("fix_checks", step, **kept)
            # the probe's own cost, without float8 readiness (1 probe in FLOAT8_EVERY measures
            # it: its cost is estimated apart, :meth:`_float8_estimate`)
            f8 = self.probe.float8_seconds if self.probe.float8_measured else 0.0
            budget.ran("probe", time.perf_counter() - t0 - (f8 or 0.0))
        if self.probe.reference == "none" and not getattr(self, "_noted", False):
            self._noted = True
            self._notice(self.part, "info", self.probe.note or "no float32 reference")
        if memory is not None:
            payload["memory"] = {k: v for k, v in memory.items() if k != "fits"}
            if memory.get("sub_batch_of"):
                payload["batch"]["sub_batch_of"] = memory["sub_batch_of"]
        Probe.write(self.writer, step, payload)
        self.payloads = (self.payloads + [(step, payload)])[-self.keep :]

    def _training_mode(self, payload: dict[str, Any], batch: Any) -> None:
        """Where the probe's pass (random layers off) is finite but the scale fell since the
        last probe (steps skipped): the pass as training runs it, Dropout on, at the scale the
        first of them skipped at, the largest (:func:`fix_check.check_training_mode`), with the
        model's 16-bit outputs (:func:`layer_dtypes.sixteen_bit_outputs`) as the layers to try in
        float32, kept in the record (``training_mode``); a check that cannot run says so once."""
        from mpwatch.record.probe.fix_check import check_training_mode
        from mpwatch.record.probe.probe import split_data

        scale = payload.get("loss_scale")
        if payload.get("mode") != "float16" or not scale:
            return
        if payload["model"].get("first_nonfinite_layer"):
            return  # the probe's own pass names the overflow
        before = self.payloads[-1][1].get("loss_scale") if self.payloads else None
        if before is None:
            opt = getattr(self.probe.model, "optimizer", None)
            before = float(getattr(opt, "initial_scale", 0.0) or 0.0)
        if not float(scale) < float(before):
            return  # no step skipped since the last probe
        from mpwatch.record.callbacks.layer_dtypes import sixteen_bit_outputs

        sixteen = sixteen_bit_outputs(self.probe.model)
        try:
            x, y, sw = split_data(first_batch(batch))
            got = check_training_mode(self.probe, x, y, sw, float(before), sixteen)
        except Exception as e:  # noqa: BLE001 - the probe's record stands without it
            self.probe._warn_once("could not run the training-mode pass (Dropout on)", e)
            return
        if got is not None:
            payload["training_mode"] = got

    def _op_overflows(self, payload: dict[str, Any], batch: Any) -> None:
        """The op that overflows inside each layer far off float32 (:mod:`op_overflow`), kept
        in the record (``op_overflows``); a scan that cannot run says so once."""
        from mpwatch.record.probe import op_overflow
        from mpwatch.record.probe.probe import split_data

        if payload.get("mode") != "float16":
            return
        try:
            x = split_data(first_batch(batch))[0]
            found = op_overflow.scan(self.probe, x, payload.get("layers") or {})
        except Exception as e:  # noqa: BLE001 - the probe's record stands without it
            self.probe._warn_once("could not run the layers far off float32 op by op", e)
            return
        if found:
            payload["op_overflows"] = found

    def _memory(self, step: int) -> tuple[dict[str, Any] | None, Any]:
        """(what the probe needs and what the device has free, :meth:`Probe.memory`; the batch
        it runs on). Where the whole batch would not fit, the first half of it, a quarter, ...:
        the largest that fits (both passes on it: the statistics keep their meaning, of fewer
        examples; the record says ``sub_batch_of``), kept for later probes. Where none fits the
        probe is skipped: its budget decision overruled, said once. (None, the batch) where it
        could not be told (the probe runs, as before)."""
        from mpwatch.contract.budget import MEMORY_SKIP
        from mpwatch.record.probe.probe_memory import mib

        data = first_batch(self._data)
        try:
            full = batch_size_of(data)
            size = min(full, self._fits_size or full) if full else None
            batch = data if size in (None, full) else _head(data, size)
            memory = self.probe.memory(batch)
            needs = {size: memory["need_bytes"]}
            while not memory["fits"] and size and size > 1:
                size = _next_size(needs, size, memory["free_bytes"])
                batch = _head(data, size)
                memory = self.probe.memory(batch)
                needs[size] = memory["need_bytes"]
        except Exception:  # noqa: BLE001 - never the reason a fit fails: the probe says why
            logger.debug("mpwatch: probe: could not tell its memory", exc_info=True)
            return None, data
        self._fits_size = size  # where none fits, later probes try one example only
        if memory["fits"]:
            if size and full and size < full:
                memory["sub_batch_of"] = full
            return memory, batch
        part = f", on {size} of the batch's {full} examples" if size and size != full else ""
        reason = (
            f"{MEMORY_SKIP} the probe needs {mib(memory['need_bytes'])} ({memory['need_from']}"
            f"{part}), {mib(memory['free_bytes'])} free ({memory['free_from']})"
        )
        if self.budget is not None:
            self.budget.overrule("probe", step, reason)
        if not getattr(self, "_memory_said", False):  # one line in the fit; the budget
            self._memory_said = True  # decision is what the diagnosis names (rule budget)
            logger.warning("mpwatch: probe skipped at step %s: %s", step, reason)
        return memory, batch

    def _fix_gate(self, budget: Any, started: float) -> FixGate:
        """The gate of this probe's fix checks (:mod:`mpwatch.record.probe.fix_gate`): what the
        budget had left at the probe's decision, less float8 readiness' estimate; every pass
        runs without a budget, for an explicit probe and for one the training needs. Several
        JAX processes run one program: every pass runs there (each would decide on its own
        clock)."""
        from mpwatch.record.runtime import backend

        known = self.probe.__dict__.setdefault("_fix_pass_seconds", {})  # kept across probes
        last = budget.decisions[-1] if budget is not None and budget.decisions else None
        free = (
            budget is None
            or last is None
            or last.part != "probe"
            or last.action != "ran"
            or last.allowance_s is None
            or backend.jax_processes() > 1
        )
        if free:
            return FixGate(None, started, 0.0, known=known)
        return FixGate(
            last.allowance_s,
            started,
            first_pass(budget, backend.name()),
            reserve=self._float8_estimate(budget),
            known=known,
        )

    def _broken(self, logs: Any) -> str | None:
        try:
            return broken_training(self.model, logs)
        except Exception:  # noqa: BLE001  (never lose training to mpwatch: the budget decides)
            logger.debug("mpwatch: probe: could not tell whether training is broken", exc_info=True)
            return None

    def quiet_through(self, step: int) -> int:
        """Busy until the probe's batch is taken and its compile ahead decided, and while a
        probe waits for a profile window to close; then nothing to do before the next multiple
        of ``every`` (the probe at an epoch's end runs from ``on_epoch_end``)."""
        if getattr(self, "_off", False):
            return ALWAYS_QUIET
        if self._data is None or self._wrapped_train_function is not None:
            return step
        if self._held or (not self._ahead_decided and self.probe is not None):
            return step
        return before_next_multiple(step, self.every)

    def _estimate(self, budget: Any) -> float:
        """The next probe's cost: its passes (and, the first time, the trace and compile not
        done ahead), plus float8 readiness when it measures it."""
        # compiled ahead, and done: its passes; still compiling beside training: as much as a
        # probe that compiles (it would wait for the compile on the training thread)
        ahead = 1.0 if self._ahead and not self.probe.ahead_pending() else 0.0
        cost = budget.estimate("probe", ahead=ahead, traced=self._traced_s)
        return cost + self._float8_estimate(budget)

    def _float8_estimate(self, budget: Any) -> float:
        """What float8 readiness adds to the next probe: 0 when it does not measure it; the
        last measurement's cost; before the first, two training steps (a pass of the model)."""
        if self.probe is None or not self.probe.float8_due():
            return 0.0
        if self.probe.float8_seconds is not None:
            return float(self.probe.float8_seconds)
        return FLOAT8_PASS_STEPS * (budget.step_seconds() or budget.first_step_seconds() or 0.0)


def _next_size(needs: dict[int, Any], size: int, free: Any) -> int:
    """The next probe batch size to try below ``size``: from two sizes' needs, the largest the
    line through them says fits (a need is a fixed part, the gradients, plus a part per example,
    the outputs: on JAX each try compiles a program), else half; never below a quarter of
    ``size`` at once. XLA's need is not a line at small sizes (a 3-layer MLP needed 4.10 MB for
    1024 examples, 3.95 for 512, 0.63 for one, where the line through the first two said no
    part fits): a guess below the quarter tries the quarter first."""
    from mpwatch.record.probe.probe_memory import SHARE

    known = sorted((n, b) for n, b in needs.items() if b is not None)
    guess = (size + 1) // 2
    if len(known) >= 2 and free is not None:
        (n1, b1), (n2, b2) = known[0], known[-1]
        per = (b2 - b1) / (n2 - n1) if n2 != n1 else 0.0
        if per > 0:
            guess = min(size - 1, int((SHARE * free - (b1 - per * n1)) // per))
    return max(1, size // 4, guess) if size > 2 else 1


def _head(data: Any, n: int) -> Any:
    """The batch's first ``n`` examples (every array sliced along its leading axis)."""
    import keras

    def cut(t: Any) -> Any:
        shape = getattr(t, "shape", None)
        return t[:n] if shape is not None and len(shape) else t

    return keras.tree.map_structure(cut, data)


def _local_copy(value: Any) -> Any:
    """A host copy of one leaf of a training batch: this process' part of it where the batch
    is a global array over several processes' devices (its shards here, one per batch slice, in
    batch order), else the whole of it."""
    if value is None or getattr(value, "is_fully_addressable", True):
        return None if value is None else np.array(value)
    rows: dict[int, Any] = {}
    for shard in value.addressable_shards:  # replicas of a slice hold the same rows
        rows.setdefault(shard.index[0].start or 0 if shard.index else 0, shard.data)
    return np.concatenate([np.asarray(rows[k]) for k in sorted(rows)], axis=0)


def _on_cpu() -> bool:
    """Whether JAX computes on the host's CPU (no GPU or TPU)."""
    try:
        import jax

        return jax.default_backend() == "cpu"
    except Exception:  # noqa: BLE001
        return True


def _copy_tensors(data: Any) -> Any:
    """A copy of a batch's tensors, kept for the probe after the step has used them."""
    import tensorflow as tf

    return tf.nest.map_structure(lambda t: tf.identity(t) if isinstance(t, tf.Tensor) else t, data)
