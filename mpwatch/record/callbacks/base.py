"""What every mpwatch callback shares: argument checks, chief detection, the shared writer, and
error
isolation.

- **Bad input fails early and clearly**: arguments are checked at construction (``log_dir`` must be
  writable, ``log_every`` a positive int, ...), the model at ``on_train_begin`` (a compiled Keras
  model), before any batch runs.
- **A failure while recording never costs a training run**: each part of a callback runs under
  :meth:`RecordingCallback._guard`; the first exception of a part is said in one line (logger
  ``"mpwatch"``; its traceback only at DEBUG), written as a ``notice`` record (the diagnosis shows
  it), and that part stops; training and the other parts go on. A part that cannot run on this
  model or fit (:class:`CannotRun`: a model compiled without a loss, a distributed fit without
  ``probe_data``) says so once a run, in one line that names the fix.
- **Unsupported backends fail before training**
  (:func:`mpwatch.record.runtime.backend.check_supported`).
- **Only the chief writes** under ``tf.distribute`` (all replicas of a MirroredStrategy live in one
  process, which is the chief; in multi-worker training the chief is task ``chief`` or worker 0).
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from collections.abc import Callable
from typing import Any

import keras

from mpwatch import contract
from mpwatch.record.probe.needs import CannotRun, check_loss  # noqa: F401  (the parts')
from mpwatch.record.runtime import backend
from mpwatch.record.runtime.backend import tf_is_chief  # noqa: F401  (its old home)
from mpwatch.record.runtime.state import ModelState, state_of
from mpwatch.record.runtime.writer import RunWriter
from mpwatch.words import plain

logger = logging.getLogger("mpwatch")

#: what :meth:`RecordingCallback.quiet_through` says of a callback with no batch work left
ALWAYS_QUIET = 2**62


def before_next_multiple(step: int, every: int) -> int:
    """The last step before the first multiple of ``every`` after ``step``.

    >>> before_next_multiple(50, 50), before_next_multiple(51, 50)
    (99, 99)
    """
    return (step // every + 1) * every - 1


#: characters of an exception's message in the one line a failure is said in
LINE_CHARS = 300


def one_line(error: BaseException) -> str:
    """An exception in one line for a person: its message's lines joined, without terminal
    escapes (Keras wraps messages in them, says "Exception encountered when calling ..." first and
    appends the call's arguments), cut at :data:`LINE_CHARS`; a :class:`CannotRun` as its message,
    else ``Type: message``."""
    text = " ".join(ln.strip() for ln in plain(error).splitlines() if ln.strip())
    if len(text) > LINE_CHARS:
        text = text[: LINE_CHARS - 1].rstrip() + "…"
    if isinstance(error, CannotRun):
        return text
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


# --- argument checks ----------------------------------------------------------------------------
def check_log_dir(log_dir: Any) -> str:
    """Create ``log_dir`` if needed and prove it writable; raise ValueError with the reason if
    not."""
    if not isinstance(log_dir, (str, os.PathLike)) or not str(log_dir):
        raise ValueError(f"mpwatch: log_dir must be a directory path, got {log_dir!r}")
    path = os.fspath(log_dir)
    if "://" in path:  # gs://, s3://, ...: TensorFlow's file systems; trust them
        return path
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".mpwatch_probe_", dir=path)
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise ValueError(
            f"mpwatch: log_dir {path!r} is not a writable directory ({e.strerror or e}); "
            "pass a directory you can write to"
        ) from e
    return path


def check_positive_int(name: str, value: Any, allow_none: bool = False) -> int | None:
    """``value`` as an int >= 1 (None allowed when ``allow_none``), else ValueError naming it."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"mpwatch: {name} must be a positive integer, got {value!r}")
    return value


def check_model(model: Any, who: str = "mpwatch", compiled: bool = True) -> None:
    """A compiled Keras 3 model with an optimizer (only an optimizer when not ``compiled``), or a
    clear error."""
    if model is None:
        raise ValueError(f"{who}: no model; pass the callback to model.fit(callbacks=[...])")
    if not isinstance(model, keras.Model):
        raise TypeError(
            f"{who} watches a keras.Model, got {type(model).__module__}.{type(model).__name__}"
        )
    if not compiled:
        if getattr(model, "optimizer", None) is None:
            raise ValueError(
                f"{who}: the model {model.name!r} has no optimizer; pass optimizer=... (a "
                "keras.optimizers.LossScaleOptimizer under mixed_float16)"
            )
        return
    if not getattr(model, "compiled", False) or getattr(model, "optimizer", None) is None:
        raise ValueError(
            f"{who}: the model {model.name!r} is not compiled; call model.compile(optimizer=..., "
            "loss=...) before training"
        )


# --- one writer per log_dir, shared by the callbacks of a run -------------------------------------
_writers: dict[tuple[str, bool], list[Any]] = {}
_writers_lock = threading.Lock()


def acquire_writer(log_dir: str, enabled: bool = True) -> RunWriter:
    with _writers_lock:
        key = (os.path.abspath(log_dir) if "://" not in log_dir else log_dir, enabled)
        entry = _writers.get(key)
        if entry is None:
            entry = _writers[key] = [RunWriter(log_dir, enabled=enabled), 0]
        entry[1] += 1
        return entry[0]


def release_writer(writer: RunWriter) -> None:
    with _writers_lock:
        for key, entry in list(_writers.items()):
            if entry[0] is writer:
                entry[1] -= 1
                if entry[1] <= 0:
                    del _writers[key]
                    writer.close()
                else:
                    writer.flush()
                return


class RecordingCallback(keras.callbacks.Callback):
    """Base of mpwatch's callbacks. Subclasses implement ``_begin``, ``_batch_end(got, logs)``,
    ``_tap_data(data)`` and ``_end`` (any may be omitted) and call ``self._guard(part, fn)`` for
    their parts.

    ``got`` (each Keras call) holds the steps of the batches that just ran, counted on the host;
    ``data`` (the tap's :class:`~mpwatch.record.runtime.state.Collected`: loss scale, skips,
    gradient counts of every batch since the last read) comes once per ``log_every`` steps of the
    callbacks with ``reads_tap`` and at the end of the fit, so no device value is read at every
    batch. ``grad_every`` (class attribute or set in ``__init__``): the gradient-count period this
    callback needs from the tap, None when it needs none.
    """

    part = "recording"
    grad_every: int | None = None
    reads_tap = False  # consumes the tap's data (then the tap is read every log_every steps)
    require_compiled = True  # False when driven by TrainingLoopRecorder

    def __init__(self, log_dir: Any, log_every: int = 50) -> None:
        super().__init__()
        self.log_dir = check_log_dir(log_dir)
        self.log_every = check_positive_int("log_every", log_every)
        self.writer: RunWriter | None = None
        self.state: ModelState | None = None
        self._failed: set[str] = set()
        self._active = False
        self._begun = False

    # --- failure isolation -----------------------------------------------------------------
    def _guard(self, part: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if part in self._failed:
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001  (never lose training to mpwatch)
            self._failed.add(part)
            self._say_failure(part, e)
            return None

    def _say_failure(self, part: str, error: Exception) -> None:
        """A part's failure, said in one line (never a traceback in the user's fit: that goes to
        the DEBUG log) and written as a ``notice``. A :class:`CannotRun` is said once a run (its
        model's state and log directory), as a warning: its message names the fix."""
        text = one_line(error)
        logger.debug("mpwatch: %s: %s", part, text, exc_info=error)  # the traceback, for who asks
        if not isinstance(error, CannotRun):
            logger.error(
                "mpwatch: recording of %s failed and stops for this run (training goes on): %s",
                part,
                text,
            )
            self._notice(part, "error", f"recording stopped: {type(error).__name__}: {error}")
            return
        told = getattr(self.state, "notices", None) if self.state is not None else None
        key = ("cannot_run", self.log_dir, part, text)
        if told is not None and key in told:
            return
        if self.state is not None:
            self.state.notices = (told or set()) | {key}
        logger.warning("mpwatch: %s cannot run (training goes on): %s", part, text)
        self._notice(part, "error", text)

    def _notice(self, part: str, level: str, message: str) -> None:
        try:
            if self.writer is not None:
                self.writer.record(
                    contract.KIND_NOTICE,
                    self._step(),
                    {"part": part, "level": level, "message": message},
                )
        except Exception:  # noqa: BLE001
            logger.debug("mpwatch: could not write a notice", exc_info=True)

    def _step(self) -> int:
        return self.state.step if self.state is not None else 0

    # --- Keras hooks ---------------------------------------------------------------------------
    def on_train_begin(self, logs: Any = None) -> None:
        # raises: bad input (or a backend mpwatch cannot record on) stops before training
        backend.check_supported(type(self).__name__)
        check_model(self.model, type(self).__name__, self.require_compiled)
        self._failed = set()
        self.state = state_of(self.model)
        self.writer = acquire_writer(self.log_dir, enabled=backend.is_chief(self.model))
        self._active = True
        self._begun = False
        self.state.require(self, self.grad_every, self.log_every if self.reads_tap else None)

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        if not self._active:
            return
        self._call_begin = batch
        self._begin_once()
        self._guard("tap", self.state.ensure_installed)
        self._guard(self.part, self._batch_begin, batch)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if not self._active:
            return
        writer = self.writer
        if writer is None or writer.held:  # e.g. inside MixedPrecisionMonitor's hold (every
            self._collect_and_end(batch, logs)  # batch: no hold of its own)
            return
        writer.hold()  # what the part writes goes out in one call; a failed write loses those
        # events (said once: _release) and never the training
        try:
            self._collect_and_end(batch, logs)
        finally:
            self._release(writer)

    def _collect_and_end(self, batch: int, logs: Any) -> None:
        got = self._guard("steps", self.state.collect, self, self._batches_in_call(batch))
        if got is None:
            return
        steps, data = got
        if data is not None and data.n:
            self._guard(self.part, self._tap_data, data)
        if steps.n:
            self._guard(self.part, self._batch_end, steps, logs or {})

    def _release(self, writer: RunWriter) -> None:
        try:
            writer.release()
        except Exception as e:  # noqa: BLE001  (never lose training to mpwatch)
            if "writer" not in self._failed:  # said once; the events of this call are lost
                self._failed.add("writer")
                logger.error("mpwatch: could not write to %s: %s", writer.logdir, one_line(e))
                self._notice("writer", "error", f"events lost: {type(e).__name__}: {e}")

    @property
    def _batch_model(self) -> Any:
        """The model, for the per-batch paths: Keras' ``Callback.model`` on JAX writes every
        variable back from the training state at each access (``jax_state_sync``), and Keras then
        rebuilds that state before the next step: a whole state round trip per batch (0.65 ms of
        a 12 ms step on keras.io's Transformer). What a batch hook reads (steps per execution, the
        tap's buffers) needs no variable's value."""
        return self._model

    def _batches_in_call(self, end: int) -> int:
        """Batches Keras ran in this call: its batch indices ``begin..end`` (with
        ``steps_per_execution``); a custom training loop's steps per call."""
        if self.state.capacity:
            return self.state.capacity
        steps = (self.params or {}).get("steps")  # Keras' last call of an epoch can run fewer
        if isinstance(steps, int) and steps > 0:  # batches than its end index says (it adds
            end = min(end, steps - 1)  # steps_per_execution - 1 to the begin, unclipped)
        begin = getattr(self, "_call_begin", None)
        if begin is None or end < begin:
            return int(getattr(self._batch_model, "steps_per_execution", 1) or 1)
        return end - begin + 1

    def _begin_once(self) -> None:
        """At the first batch of a fit, when every callback's ``on_train_begin`` has run (so a
        ``BackupAndRestore`` placed anywhere in the list has restored the optimizer): fix where
        the steps start, then the subclass's :meth:`_begin`."""
        if self._begun:
            return
        self._begun = True
        enabled = self.writer is not None and self.writer.enabled
        self._guard("steps", self.state.resolve_start, self.log_dir, enabled)
        self._guard(self.part, self._begin)

    def on_train_end(self, logs: Any = None) -> None:
        if not self._active:
            return
        self._active = False
        try:
            if self._begun:
                data = self._guard("steps", self.state.flush, self)
                if data is not None and data.n:
                    self._guard(self.part, self._tap_data, data)
                self._guard(self.part, self._end)
        finally:
            try:
                self.state.release(self)
            except Exception as e:  # noqa: BLE001
                logger.debug("mpwatch: removing the gradient tap", exc_info=True)
                logger.error("mpwatch: could not remove the gradient tap: %s", one_line(e))
            if self.writer is not None:
                release_writer(self.writer)
                self.writer = None

    # --- for subclasses ------------------------------------------------------------------------
    def _begin(self) -> None:
        pass

    def _batch_begin(self, batch: int) -> None:
        pass

    def _batch_end(self, got: Any, logs: dict[str, Any]) -> None:
        """Each Keras call: ``got.steps`` are its batch steps (no tap data)."""

    def _tap_data(self, data: Any) -> None:
        """The tap's data (:class:`~mpwatch.record.tap.tap_common.Collected`) when it is read: once
        per interval of the subclasses with ``reads_tap``, and at the end of the fit."""

    def _end(self) -> None:
        pass

    def quiet_through(self, step: int) -> int:
        """Asked after this callback's batch hooks ran for the call that ended at ``step``: the
        last step through which they have nothing to do, so :class:`MixedPrecisionMonitor` may
        skip them until then (the tap's data, when it is read, reaches them whatever this says).
        By default: never again when the class has no batch work of its own (neither
        ``_batch_begin`` nor ``_batch_end`` nor a batch hook overridden), else ``step`` (every
        call is needed)."""
        cls, base = type(self), RecordingCallback
        if (
            cls._batch_begin is base._batch_begin
            and cls._batch_end is base._batch_end
            and cls.on_train_batch_begin is base.on_train_batch_begin
            and cls.on_train_batch_end is base.on_train_batch_end
        ):
            return ALWAYS_QUIET
        return step
