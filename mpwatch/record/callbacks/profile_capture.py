"""ProfileMonitor: a profiler trace over a few training steps, turned into per-layer time.

The trace is written where TensorBoard's Profile tab (tensorboard-plugin-profile / xprof) finds it:
``<log_dir>/plugins/profile/<run>/<host>.xplane.pb``, so the Profile tab shows the run too. On
Keras' TensorFlow backend it is taken with ``tf.profiler.experimental.start(log_dir)``, exactly as
Keras' own TensorBoard callback does; on the JAX backend with ``jax.profiler.start_trace(log_dir)``
(which writes the same layout; no TensorFlow is imported). Then a copy of the trace is converted
with xprof's converter (:mod:`mpwatch.profile`) and the result is written as a ``profile`` record
(``contract.KIND_PROFILE``) at the mpwatch batch step of the last captured batch:

- ops joined to layers: TensorFlow op scopes, or JAX op names (``jit(train_step)/jvp(conv2d)/...``
  forward, ``.../transpose(jvp(conv2d))/...`` backward); on a CPU under JAX, where xprof's op table
  is empty, XLA's own CPU op events with their op names from the trace's HLO metadata;
- on a GPU, every kernel classified by its name (precision, Tensor Core use:
  ``mpwatch/profile/kernel_classes.py``)
  and summed per layer and for the run, beside xprof's own Tensor Core flag (``source``
  ``device_kernels``); the layers' Tensor Core dimensions ride along. On a CPU the record keeps the
  host-side attribution (``source`` ``host_ops``).

:func:`record_trace` does the same for a trace captured some other way (Keras' TensorBoard
callback, ``jax.profiler`` by hand, a trace copied from a GPU machine), so that
``mpwatch.load_run``, ``mpwatch diagnose`` and the tab see it; from a shell:
``python -m mpwatch.record.callbacks.profile_capture LOGDIR``.

Cost: while the profiler runs, steps are slower (the tracer records every op); the conversion takes
a fraction of a second for small models and a few seconds for large traces. Both happen once.

Failures never stop training: when the profiler cannot start (another profiler session is running,
e.g. Keras' TensorBoard callback with ``profile_batch``) or the conversion fails, the reason is
logged once and a ``notice`` record is written; training goes on.

Example:
    >>> import keras, mpwatch  # doctest: +SKIP
    >>> cb = mpwatch.ProfileMonitor("logs/run1", profile_steps=(5, 8))  # doctest: +SKIP
    >>> model.fit(x, y, callbacks=[cb])  # doctest: +SKIP
    >>> mpwatch.load_run("logs/run1").profile  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import glob
import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from mpwatch.record.callbacks.base import ALWAYS_QUIET, RecordingCallback
from mpwatch.record.runtime.backend import JAX, TENSORFLOW

logger = logging.getLogger("mpwatch")

PART = "profile"
DEFAULT_STEPS = (3, 5)  # batches 1-2 trace and warm up the train function


def keras_backend() -> str:
    """Keras' backend (:func:`mpwatch.record.runtime.backend.name`); ``"tensorflow"`` when Keras
    cannot say (the TensorFlow profiler, as before)."""
    from mpwatch.record.runtime import backend

    try:
        return backend.name()
    except Exception:  # noqa: BLE001
        return backend.TENSORFLOW


def layer_dims(model: Any) -> dict[str, dict[str, int]]:
    """Layer path -> the dimensions that decide its Tensor Core use (the layers record's
    ``tc_dims``), for every layer of ``model`` that has some."""
    from mpwatch.layers import walk
    from mpwatch.record.callbacks.layer_dtypes import tc_dims

    out: dict[str, dict[str, int]] = {}
    try:
        for layer, path, _ in walk(model):
            try:
                dims = tc_dims(layer)
            except Exception:  # noqa: BLE001 - a layer whose attributes do not read: no dims
                continue
            if dims:
                out[path] = dims
    except Exception:  # noqa: BLE001 - dims are extra: never lose the record to them
        return {}
    return out


def parse_steps(profile_steps: Any) -> tuple[int, int] | None:
    """``(first, last)`` batch numbers (1-based, within a ``fit``) from the user's argument.

    Accepts an int ``n`` (one batch), a pair, a ``"first,last"`` string, or ``None``/``0``/``False``
    (off). Raises ValueError on anything else, at construction.

    >>> parse_steps((3, 5)), parse_steps(4), parse_steps("2,6"), parse_steps(0)
    ((3, 5), (4, 4), (2, 6), None)
    """
    if profile_steps is None or profile_steps is False or profile_steps == 0:
        return None
    value = profile_steps
    if isinstance(value, str):
        try:
            value = tuple(int(p) for p in value.split(","))
        except ValueError:
            value = None
    if isinstance(value, bool):
        value = None
    elif isinstance(value, int):
        value = (value, value)
    if (
        not isinstance(value, (tuple, list))
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        or value[0] < 1
        or value[1] < value[0]
    ):
        raise ValueError(
            "profile_steps must be a positive int, a pair (first, last) with 1 <= first <= last, a "
            f"'first,last' string, or None/0 to switch profiling off; got {profile_steps!r}"
        )
    return int(value[0]), int(value[1])


class ProfileMonitor(RecordingCallback):
    """Capture a profiler trace over a range of training batches; record per-layer time by dtype.

    Args:
        log_dir: the run directory (the same as the other mpwatch callbacks). The trace goes to
            ``<log_dir>/plugins/profile/<run>/``; the record into the event files of ``log_dir``.
        profile_steps: ``(first, last)`` batch numbers within a ``fit``, 1-based; an int for one
            batch; ``None`` or ``0`` switches profiling off. The default ``(3, 5)`` skips the first
            two batches (tracing, warm-up). When the first epoch is shorter, the range moves to its
            end.
        convert: ``"end"`` converts right after the captured range, ``"train_end"`` at the end of
            ``fit``, ``None`` only captures (the Profile tab still shows the trace).
        once: capture only in the first ``fit`` that reaches the range (default), or in every
            ``fit``.
        dtype_overrides: ``{layer path: dtype}`` the layer really computes in, where known better
            than the layer's policy (normalization layers are handled already). Paths are
            :func:`mpwatch.profile.describe_model`'s: the model's name, then layer names, joined by
            ``/``.

    After the conversion, ``result`` holds the record's payload; after a failure, ``error`` says why
    (the failure is also logged once and written as a ``notice`` record; training goes on).

    Example:
        >>> cb = ProfileMonitor("logs/run1", profile_steps=(3, 5))  # doctest: +SKIP
        >>> model.fit(ds, epochs=2, callbacks=[cb])  # doctest: +SKIP
        >>> cb.result["cast_share"]  # doctest: +SKIP
    """

    part = PART

    def __init__(
        self,
        log_dir: Any,
        profile_steps: Any = DEFAULT_STEPS,
        convert: str | None = "end",
        once: bool = True,
        dtype_overrides: Mapping[str, str] | None = None,
    ) -> None:
        if convert not in ("end", "train_end", None):
            raise ValueError(f"convert must be 'end', 'train_end' or None, not {convert!r}")
        steps = parse_steps(profile_steps)
        super().__init__(log_dir)
        self.steps = steps
        self.convert = convert
        self.once = bool(once)
        self.dtype_overrides = dict(dtype_overrides or {})
        self._profiling = False
        self._done = False
        self._range: tuple[int, int] | None = None
        self._step0 = 0
        self._before: set[str] = set()
        self._pending: dict[str, Any] | None = None
        self._captured: list[int] = []
        self._t0 = 0.0
        self._others0 = 0.0
        self._backend = TENSORFLOW
        self.trace_dir: str | None = None
        self.result: dict[str, Any] | None = None
        self.error: str | None = None
        # set by MixedPrecisionMonitor: its cost budget (None: capture and convert as asked), and
        # whether the user asked for the profile (then it runs whatever it costs)
        self.budget: Any = None
        self.explicit = True
        self.deferred = False  # the conversion was left to the first read of the run

    # --- failure handling: log once, write a notice, go on ---------------------------------------
    def _fail(self, what: str, err: BaseException | str) -> None:
        message = f"{what}: {err}"
        self.error = message
        if PART in self._failed:
            return
        self._failed.add(PART)
        logger.error("mpwatch profile: %s; training goes on", message)
        self._notice(PART, "error", message)
        if self.writer is not None:
            self.writer.flush()

    # --- RecordingCallback hooks ------------------------------------------------------------------
    def _begin(self) -> None:
        self._step0 = self.state.step  # the step before this fit's first batch
        self._range = None
        self._backend = keras_backend()
        if self.once and self._done:
            return
        if self.steps is None or self.writer is None or not self.writer.enabled:
            return  # switched off, or not the chief
        first, last = self.steps
        per_epoch = (self.params or {}).get("steps")
        if isinstance(per_epoch, int) and per_epoch > 0 and last > per_epoch:
            if first > per_epoch:  # the whole range lies beyond the first epoch: take its end
                first = max(1, per_epoch - (last - first))
            last = per_epoch
        self._range = (first, last)

    def _spe(self) -> int:
        try:
            return max(1, int(getattr(self._batch_model, "steps_per_execution", 1) or 1))
        except (TypeError, ValueError):
            return 1

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        # Unlike the other parts, the profiler needs no gradient tap: not installing it keeps a
        # standalone ProfileMonitor from retracing the train function (and the tap's ops out of the
        # trace). Next to the other mpwatch callbacks the tap is there anyway and steps are exact.
        if self._active:
            self._begin_once()
            self._guard(self.part, self._batch_begin, batch)

    def _batch_begin(self, batch: int) -> None:
        if self._range is None or self._profiling:
            return
        done = self.state.step - self._step0  # this fit's batches so far
        first_here, last_here = done + 1, done + self._spe()
        if last_here >= self._range[0] and first_here <= self._range[1]:
            if not self._affordable():
                return
            self._start()

    def quiet_through(self, step: int) -> int:
        """Nothing to do before the window's first batch, nor after the capture."""
        if self._profiling:
            return step
        if self._range is None:
            return ALWAYS_QUIET
        return self._step0 + self._range[0] - 1

    def _affordable(self) -> bool:
        """Whether the budget (if any) lets the capture run; a "no" ends this fit's profile (a
        later, longer ``fit`` of the same monitor decides again)."""
        if self.budget is None:
            return True
        first, last = self._range
        step = self._step() + 1
        if self.budget.decide("profile", step, explicit=self.explicit, steps=last - first + 1):
            return True
        self._range = None
        return False

    def _batch_end(self, got: Any, logs: dict[str, Any]) -> None:
        if not self._profiling:
            return
        self._captured.extend(got.steps)
        if got.last_step - self._step0 >= self._range[1]:
            self.state.wait_for_device()  # the window's steps have run (JAX dispatches ahead)
            wall = time.perf_counter() - self._t0
            self._stop()
            self._charge_capture(wall)
            if self.convert == "end" and self._conversion_affordable():
                self._convert_timed()

    def _charge_capture(self, wall: float) -> None:
        """The profiled steps' slowdown (the tracer's), beyond the hooks the ledger already
        timed: their wall time less as many steady steps, less the other parts' hooks inside the
        window (already charged to them)."""
        if self.budget is None:
            return
        step = self.budget.step_seconds() or 0.0
        others = self._others_spent() - self._others0
        extra = max(0.0, wall - step * max(1, len(self._captured)) - others)
        self.budget.charge(self.part, extra)
        self.budget.ran(self.part, extra)

    def _conversion_affordable(self) -> bool:
        """Whether the budget (if any) lets the conversion run in the fit; a "no" defers it to
        the first read of the run (the trace stays; the reader converts it with the run's
        ``layers`` record)."""
        if self.budget is None or self._pending is None:
            return True
        files = glob.glob(os.path.join(glob.escape(self._pending["trace_dir"]), "*.xplane.pb"))
        mb = sum(os.path.getsize(f) for f in files) / 1e6
        detail = {"steps": self._pending["steps"], "megabytes": round(mb, 3)}
        if self.budget.decide(
            "profile_conversion",
            self._step(),
            explicit=self.explicit,
            defer=True,
            detail=detail,
            megabytes=mb,
        ):
            return True
        self._pending = None
        self.deferred = True
        return False

    def _convert_timed(self) -> None:
        t0 = time.perf_counter()
        self._convert()
        if self.budget is not None:
            self.budget.ran("profile_conversion", time.perf_counter() - t0)

    def on_train_end(self, logs: Any = None) -> None:
        try:
            super().on_train_end(logs)
        finally:
            if self._profiling:  # a failed part left the profiler running: stop it, drop the trace
                self._profiling = False
                try:
                    if self._backend == JAX:
                        import jax

                        jax.profiler.stop_trace()  # JAX cannot drop a trace: it is written
                    else:
                        import tensorflow as tf

                        tf.profiler.experimental.stop(save=False)
                except Exception:  # noqa: BLE001
                    logger.debug("mpwatch profile: could not stop the profiler", exc_info=True)

    def _end(self) -> None:
        if self._profiling:  # fit ended inside the range
            self._stop()
        if self._pending is not None and self.convert is not None and self._conversion_affordable():
            self._convert_timed()
        self._range = None

    # --- capture ----------------------------------------------------------------------------------
    def _profile_root(self) -> str:
        return os.path.join(self.log_dir, "plugins", "profile")

    def _runs(self) -> set[str]:
        return set(glob.glob(os.path.join(glob.escape(self._profile_root()), "*")))

    def _start(self) -> None:
        self.state.wait_for_device()  # the window holds its own steps, not the queued ones
        self._before = self._runs()
        try:
            if self._backend == JAX:
                import jax

                options = jax.profiler.ProfileOptions()
                # no Python function events: mpwatch reads XLA's and the device's, and the
                # Python tracer's events made a 3-step trace of a small Transformer 14 MB and its
                # stop 7 s (the training's every Python call recorded)
                options.python_tracer_level = 0
                jax.profiler.start_trace(self.log_dir, profiler_options=options)
            else:
                import tensorflow as tf

                tf.profiler.experimental.start(self.log_dir)
        except Exception as e:  # noqa: BLE001 - e.g. another profiler session is running
            self._range = None
            self._fail("the profiler could not start", e)
            return
        self._profiling = True
        self._captured = []
        self._others0 = self._others_spent()
        self._t0 = time.perf_counter()

    @property
    def _profiling(self) -> bool:
        return self._capturing

    @_profiling.setter
    def _profiling(self, on: bool) -> None:
        """Capturing now; the model's state says so to the other parts (no probe runs then)."""
        self._capturing = on
        if getattr(self, "state", None) is not None:
            self.state.profiling = on

    def _others_spent(self) -> float:
        """The ledger's seconds of the other parts (their hooks that run inside the window)."""
        if self.budget is None:
            return 0.0
        return sum(v for k, v in self.budget.spent.items() if k != self.part)

    def _stop(self) -> None:
        self._profiling = False
        self._range = None
        self._done = True
        try:
            if self._backend == JAX:
                import jax

                jax.profiler.stop_trace()
            else:
                import tensorflow as tf

                tf.profiler.experimental.stop()
        except Exception as e:  # noqa: BLE001
            self._fail("the profiler could not stop and save the trace", e)
            return
        new = sorted(self._runs() - self._before)
        runs = [
            d
            for d in (new or sorted(self._runs()))
            if glob.glob(os.path.join(glob.escape(d), "*.xplane.pb"))
        ]
        if not runs:
            self._fail("the profiler wrote no trace", f"nothing new under {self._profile_root()}")
            return
        self.trace_dir = runs[-1]
        steps = [self._captured[0], self._captured[-1]] if self._captured else None
        self._pending = {"trace_dir": self.trace_dir, "steps": steps}
        logger.info(
            "mpwatch profile: captured steps %s in %.1fs into %s",
            steps,
            time.perf_counter() - self._t0,
            self.trace_dir,
        )

    # --- conversion -------------------------------------------------------------------------------
    def _op_source(self, trace_dir: str) -> str:
        """Where the op table comes from (:func:`mpwatch.profile.traces.trace_ops`): XLA's op events
        for JAX on a CPU (xprof's table of TensorFlow ops is empty there: asking it cost 0.6 s
        of a MobileNetV2 conversion), else ``"auto"`` (TensorFlow's jit_compile on a CPU: XLA's
        ops with the input pipeline's TensorFlow ops; xprof's table elsewhere)."""
        from mpwatch.profile.traces import find_traces, has_gpu_planes

        if self._backend == JAX and not has_gpu_planes(find_traces(trace_dir)):
            return "xla"
        return "auto"

    def _convert(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        from mpwatch import contract, profile

        try:
            payload = profile.summarize(
                pending["trace_dir"],
                self.model,
                steps=pending["steps"],
                dtype_overrides=self.dtype_overrides or None,
                ops=self._op_source(pending["trace_dir"]),
                dims=layer_dims(self.model),
            )
        except Exception as e:  # noqa: BLE001 - never lose training to the conversion
            self._fail("the trace could not be converted", e)
            return
        try:
            step = pending["steps"][-1] if pending["steps"] else self._step()
            self.writer.record(contract.KIND_PROFILE, step, payload)
            self.writer.flush()
        except Exception as e:  # noqa: BLE001
            self._fail("the profile record could not be written", e)
            return
        self.result = payload


def record_trace(
    log_dir: str | os.PathLike[str],
    trace: str | os.PathLike[str] | None = None,
    model: Any = None,
    step: int | None = None,
    steps: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Summarize a profiler trace into a ``profile`` record of ``log_dir``; returns its payload.

    For a trace that :class:`ProfileMonitor` did not capture (Keras' TensorBoard callback with
    ``profile_batch``, ``jax.profiler`` by hand, a trace copied from a GPU machine).
    ``mpwatch.load_run(log_dir)``, ``mpwatch diagnose`` and the tab read such a trace as it is
    without this (:mod:`mpwatch.read.traces`: converted without the model, cached outside the
    logdir); the record keeps the profile in the logdir, with the model's layers when given, and
    a run with a record is read from it. ``trace``: a ``.xplane.pb`` file, a run directory or a
    logdir (default: the newest run under ``<log_dir>/plugins/profile/``). ``model``: the Keras
    model that ran (its layers' dtypes, classes and Tensor Core dimensions); without it, layers
    are known only by the JAX scopes of the op names (the GPU kernel figures need no model;
    TensorFlow op names need one).
    ``step``: the step to write the record at (default: the last of ``steps``, else 0).

    Example:
        >>> record_trace("logs/gpu_run")  # doctest: +SKIP
        >>> mpwatch.load_run("logs/gpu_run").profile_kernels["tensor_core_share"]  # doctest: +SKIP
    """
    from mpwatch import contract, profile
    from mpwatch.record.runtime.writer import RunWriter

    log_dir = os.fspath(log_dir)
    payload = profile.summarize(
        trace if trace is not None else log_dir,
        model,
        steps=steps,
        ops="auto",
        dims=layer_dims(model) if model is not None else None,
    )
    at = int(step) if step is not None else int(steps[-1]) if steps else 0
    writer = RunWriter(log_dir)
    try:
        writer.record(contract.KIND_PROFILE, at, payload)
        writer.flush()
    finally:
        writer.close()
    return payload


def main(argv: list[str] | None = None) -> int:
    """``python -m mpwatch.record.callbacks.profile_capture LOGDIR [--trace PATH] [--step N]``:
    write the profile record of the newest trace under ``LOGDIR/plugins/profile``
    (:func:`record_trace`)."""
    parser = argparse.ArgumentParser(
        prog="python -m mpwatch.record.callbacks.profile_capture",
        description="Summarize a profiler trace into an mpwatch profile record of LOGDIR.",
    )
    parser.add_argument("logdir", help="the run directory the record is written to")
    parser.add_argument("--trace", help="a .xplane.pb file or run directory (default: newest)")
    parser.add_argument("--step", type=int, default=None, help="the record's step (default 0)")
    args = parser.parse_args(argv)
    from mpwatch import profile

    try:
        payload = record_trace(args.logdir, args.trace, step=args.step)
    except profile.ProfileError as e:
        print(f"mpwatch: {e}", file=sys.stderr)
        return 1
    kernels = payload.get("kernel_summary") or {}
    line = f"wrote the profile record ({payload.get('source')}) of {payload.get('trace_dir')}"
    if kernels:
        line += (
            f": Tensor Cores {kernels['tensor_core_share']:.1%} of device time (xprof's flag: "
            f"{kernels['xprof_tensor_core_share']:.1%}), unknown precision "
            f"{kernels['unknown_share']:.1%}"
        )
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
