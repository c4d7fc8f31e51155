"""MixedPrecisionMonitor: all of mpwatch's recording in one callback."""

from __future__ import annotations

from typing import Any

import keras

from mpwatch import contract
from mpwatch.formats import KERAS_GROWTH_INTERVAL, KERAS_INITIAL_SCALE
from mpwatch.record import backend
from mpwatch.record.backend import device_info  # noqa: F401  (old import path)
from mpwatch.record.base import RecordingCallback, check_positive_int
from mpwatch.record.gradient_health import GradientHealthMonitor
from mpwatch.record.input_health import InputHealthMonitor
from mpwatch.record.layer_dtypes import LayerDtypeMonitor
from mpwatch.record.loss_scale import LossScaleMonitor, no_loss_scale_reason
from mpwatch.record.probe_monitor import ProbeMonitor
from mpwatch.record.profile_capture import DEFAULT_STEPS, ProfileMonitor
from mpwatch.record.step_time import StepTimeMonitor
from mpwatch.record.tap_common import loss_scale_optimizer
from mpwatch.record.train_step import TrainStepMonitor
from mpwatch.record.twin import model_kind


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
            first training batch); ``probe=False`` switches it off.
        loss_fn: the probe's loss, ``loss_fn(y_true, y_pred) -> scalar`` (default: the model's
            compiled loss; a model trained by a custom loop need not be compiled).
        profile: the profiler trace (:class:`ProfileMonitor`): ``True`` captures batches 3-5 of
            the first ``fit`` (after warm-up) once, converts a copy into per-layer time by dtype
            and writes it where TensorBoard's Profile tab finds it too; a pair ``(first, last)``
            chooses the batches; ``False`` switches it off. It runs last, so its conversion pause
            (about a second) falls outside the step times.

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
        probe_every: int = 500,
        probe_data: Any = None,
        loss_fn: Any = None,
        profile: bool | tuple[int, int] = True,
    ) -> None:
        super().__init__(log_dir, log_every)
        check_positive_int("log_every", log_every)
        self.options = {
            "loss_scale": bool(loss_scale),
            "gradient_health": bool(gradient_health),
            "layer_dtypes": bool(layer_dtypes),
            "step_time": bool(step_time),
            "per_variable_gradients": bool(per_variable_gradients),
            "input_health": bool(input_health),
            "probe": bool(probe),
        }
        self.profile = profile
        self.probe_every = check_positive_int("probe_every", probe_every)
        self.probe_data = probe_data
        self.loss_fn = loss_fn
        self.parts: list[keras.callbacks.Callback] = self._build_parts()

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
        if o["step_time"]:
            parts.append(StepTimeMonitor(d, n))
        if o["probe"]:
            parts.append(ProbeMonitor(d, self.probe_every, self.probe_data, self.loss_fn))
        if self.profile is not False and self.profile is not None:
            steps = DEFAULT_STEPS if self.profile is True else self.profile
            parts.append(ProfileMonitor(d, profile_steps=steps))
        return parts

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
        super().on_train_begin(logs)
        for p in self.parts:
            p.on_train_begin(logs)

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        super().on_train_batch_begin(batch, logs)
        for p in self.parts:
            p.on_train_batch_begin(batch, logs)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        with self._writes_held():  # the parts share the writer: one write for all of them
            super().on_train_batch_end(batch, logs)
            for p in self.parts:
                p.on_train_batch_end(batch, logs)

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        for p in self.parts:
            p.on_epoch_begin(epoch, logs)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        for p in self.parts:
            p.on_epoch_end(epoch, logs)

    def on_train_end(self, logs: Any = None) -> None:
        try:
            for p in self.parts:
                p.on_train_end(logs)
        finally:
            super().on_train_end(logs)

    # --- own records -----------------------------------------------------------------------------
    def run_info(self) -> dict[str, Any]:
        model = self.model
        policy = model.dtype_policy
        lso = loss_scale_optimizer(model.optimizer)
        if lso is not None:
            ls = {
                "kind": "dynamic",
                "reason": None,
                "initial": float(getattr(lso, "initial_scale", KERAS_INITIAL_SCALE)),
                "growth_interval": int(getattr(lso, "dynamic_growth_steps", KERAS_GROWTH_INTERVAL)),
            }
            opt_name = f"LossScaleOptimizer({type(lso.inner_optimizer).__name__})"
        else:
            ls = {
                "kind": "none",
                "reason": no_loss_scale_reason(model),
                "initial": None,
                "growth_interval": None,
            }
            opt_name = type(model.optimizer).__name__
        strategy, replicas = backend.strategy_facts(model)
        try:
            params = int(model.count_params()) if model.built else 0
        except Exception:  # noqa: BLE001
            params = 0
        return {
            "policy": policy.name,
            "compute_dtype": policy.compute_dtype,
            "variable_dtype": policy.variable_dtype,
            "loss_scale": ls,
            "model": {
                "name": model.name,
                "class": type(model).__name__,
                "kind": model_kind(model),
                "params": params,
            },
            "optimizer": opt_name,
            "backend": backend.name(),
            "strategy": strategy,
            "num_replicas": replicas,
            "steps_per_execution": int(getattr(model, "steps_per_execution", 1) or 1),
            "batch_size": (self.params or {}).get("batch_size"),
            "log_every": self.log_every,
            "chief": backend.is_chief(model),
            "start": dict(self.state.start) if self.state is not None else None,
            "device": backend.device_info(),
            "versions": backend.versions(),
        }

    def _begin(self) -> None:
        self._loss_steps: list[int] = []
        self._losses: list[float] = []
        self.writer.record(contract.KIND_RUN_INFO, self.state.step, self.run_info())

    def _batch_end(self, got: Any, logs: dict[str, Any]) -> None:
        loss = logs.get("loss")
        if loss is not None:  # buffered, written once per interval (cheap hot path)
            self._loss_steps.append(got.last_step)
            self._losses.append(float(loss))
        if any(s % self.log_every == 0 for s in got.steps):
            self._flush_loss()

    def _flush_loss(self) -> None:
        self.writer.scalar_series(contract.TRAIN_LOSS, self._loss_steps, self._losses)
        self._loss_steps, self._losses = [], []

    def _end(self) -> None:
        if getattr(self, "_losses", None):
            self._flush_loss()
