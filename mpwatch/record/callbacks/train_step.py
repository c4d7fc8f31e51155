"""TrainStepMonitor: the train step's own contract, recorded so the judge can check it.

Mixed precision rests on a contract between the train step and its optimizers: the loss is
multiplied by the loss scale before the gradients are taken (Keras' own ``train_step`` calls
``optimizer.scale_loss``), every optimizer that steps is a ``LossScaleOptimizer`` (it divides the
gradients by the scale and skips non-finite steps), and the variables stay float32. A custom
``train_step`` written as the keras.io guide writes it, a GAN with optimizers of its own, or the
pure ``"float16"`` policy break it silently. This part records what the judge needs to see it
(``train_step`` record, :data:`mpwatch.contract.KIND_TRAIN_STEP`):

- where ``train_step`` is defined (Keras' own, or the user's class);
- whether the model has a forward pass of its own (the probe needs one);
- every optimizer the model holds (the compiled one and any held in an attribute, as a GAN's
  ``d_optimizer`` and ``g_optimizer``): its class, whether it is a ``LossScaleOptimizer``, its
  iterations when the fit began and now (so which ones really stepped), and its scale;
- for each ``LossScaleOptimizer``, how many times the train step called its ``scale_loss``
  while it was traced (the tap watches them: ``TapBase.watch_scale_loss``).

Whether the loss really was scaled is judged from two other records: the gradients the optimizer
received (``grad_variables``) against the probe's float32 reference gradients times the scale
(``mpwatch/judge/rules/train_step.py``); where no probe runs (a model without a forward pass of
its own, as a VAE whose train step runs its encoder and decoder), from the ``scale_loss`` calls.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mpwatch import contract
from mpwatch.record.callbacks.base import RecordingCallback
from mpwatch.record.tap.tap_common import loss_scale_optimizer, model_optimizers

__all__ = ["TrainStepMonitor", "train_step_facts", "model_optimizers", "has_forward_pass"]


def _keras_own(cls: type) -> bool:
    mod = getattr(cls, "__module__", "") or ""
    return mod == "keras" or mod.startswith(("keras.", "tf_keras."))


def train_step_owner(model: Any) -> str | None:
    """``module.QualName`` of the class that defines ``model.train_step``; None when it is
    Keras' own (the backend trainer's)."""
    for cls in type(model).__mro__:
        if "train_step" in cls.__dict__:
            return None if _keras_own(cls) else f"{cls.__module__}.{cls.__qualname__}"
    return None


def has_forward_pass(model: Any) -> bool:
    """Whether calling the model runs a forward pass: a Functional or Sequential model, or a
    subclass whose ``call`` is not Keras' ``Model.call`` (which raises NotImplementedError)."""
    import keras

    if isinstance(model, keras.Sequential) or hasattr(model, "_run_through_graph"):
        return True
    call = getattr(type(model), "call", None)
    return call is not None and not _keras_own(_defining_class(type(model), "call"))


def _defining_class(cls: type, attr: str) -> type:
    for c in cls.__mro__:
        if attr in c.__dict__:
            return c
    return object


def _iterations(opt: Any) -> int:
    try:
        return int(np.asarray(opt.iterations.numpy()))
    except Exception:  # noqa: BLE001  (not built yet: it has not stepped)
        return 0


def _scale(opt: Any) -> float | None:
    """A LossScaleOptimizer's dynamic scale now (unbuilt: its initial scale); None for another."""
    lso = loss_scale_optimizer(opt)
    if lso is None:
        return None
    try:
        return float(np.asarray(lso.dynamic_scale.numpy()))
    except Exception:  # noqa: BLE001  (unbuilt: its initial scale)
        return float(getattr(lso, "initial_scale", 0.0) or 0.0) or None


def _optimizer_facts(
    name: str,
    opt: Any,
    compiled: bool,
    start: int,
    scale_loss_calls: int | None = None,
    scale_start: float | None = None,
) -> dict[str, Any]:
    lso = loss_scale_optimizer(opt)
    scale = _scale(opt)
    if lso is not None:
        cls = f"LossScaleOptimizer({type(lso.inner_optimizer).__name__})"
        inner = lso.inner_optimizer
    else:
        cls = type(opt).__name__
        inner = opt
    try:
        epsilon = float(inner.epsilon) if getattr(inner, "epsilon", None) is not None else None
    except (TypeError, ValueError):
        epsilon = None
    family = next((c.__name__ for c in type(inner).__mro__ if _keras_own(c)), type(inner).__name__)
    return {
        "name": name,
        "class": cls,
        "compiled": compiled,
        "loss_scaled": lso is not None,
        "iterations_start": int(start),
        "iterations": _iterations(opt),
        "loss_scale": scale,
        "loss_scale_start": scale_start if lso is not None else None,
        "scale_loss_calls": scale_loss_calls,
        "epsilon": epsilon,
        "family": family,
    }


def train_step_facts(
    model: Any,
    starts: dict[int, int] | None = None,
    scale_loss_calls: dict[int, int] | None = None,
    scale_starts: dict[int, float | None] | None = None,
) -> dict[str, Any]:
    """The ``train_step`` record's payload for ``model`` now; ``starts``: each optimizer's
    iterations when the fit began, by ``id`` (missing: now); ``scale_loss_calls``: each
    LossScaleOptimizer's ``scale_loss`` calls in the train step's last trace, by ``id``, as the
    tap saw them (None, or an optimizer missing: not seen); ``scale_starts``: each one's scale
    when the fit began, by ``id`` (missing: now)."""
    starts = starts or {}
    calls = scale_loss_calls or {}
    scales = scale_starts or {}
    compiled = getattr(model, "optimizer", None)
    owner = train_step_owner(model)
    return {
        "custom_train_step": owner is not None,
        "train_step_owner": owner,
        "has_call": has_forward_pass(model),
        "optimizers": [
            _optimizer_facts(
                name,
                opt,
                opt is compiled,
                starts.get(id(opt), _iterations(opt)),
                calls.get(id(opt)),
                scales.get(id(opt), _scale(opt)),
            )
            for name, opt in model_optimizers(model)
        ],
    }


class TrainStepMonitor(RecordingCallback):
    """Records the train step's contract: who defines ``train_step``, every optimizer the model
    holds, whether each stepped and whether it scales the loss (``train_step`` record), when the
    fit begins and at each epoch's end and the fit's end. Cheap: a few variable reads per epoch.

    Args:
        log_dir: the run directory.

    Example:
        >>> import keras, numpy as np, tempfile
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        >>> model.compile("sgd", "mse")
        >>> logdir = tempfile.mkdtemp()
        >>> _ = model.fit(np.ones((8, 4)), np.ones((8, 1)), verbose=0,
        ...               callbacks=[TrainStepMonitor(logdir)])
        >>> import mpwatch
        >>> mpwatch.load_run(logdir).train_step["optimizers"][0]["iterations"]
        1
    """

    part = "train_step"

    def __init__(self, log_dir: Any) -> None:
        super().__init__(log_dir, log_every=1)
        self._starts: dict[int, int] = {}
        self._scale_starts: dict[int, float | None] = {}

    def on_train_begin(self, logs: Any = None) -> None:
        super().on_train_begin(logs)
        self._starts, self._scale_starts = {}, {}
        self._guard(self.part, self._remember_starts)

    def _remember_starts(self) -> None:
        opts = [o for _, o in model_optimizers(self.model)]
        self._starts = {id(o): _iterations(o) for o in opts}
        self._scale_starts = {id(o): _scale(o) for o in opts}

    def _begin(self) -> None:
        self._write()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if getattr(self, "_active", False) and getattr(self, "_begun", False):
            self._guard(self.part, self._write)

    def _end(self) -> None:
        self._write()

    def _write(self) -> None:
        state = self.state
        tap = (state.tap or state.parked) if state is not None else None
        calls = getattr(tap, "scale_loss_calls", None)
        self.writer.record(
            contract.KIND_TRAIN_STEP,
            self.state.step,
            train_step_facts(self.model, self._starts, calls, self._scale_starts),
        )
