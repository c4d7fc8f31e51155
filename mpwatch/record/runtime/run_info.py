"""The ``run_info`` record's payload: the facts of one fit (policy, loss scale, model, device).

Written by :class:`mpwatch.MixedPrecisionMonitor` when each fit starts, and by a pre-flight
(:func:`mpwatch.preflight`, :mod:`mpwatch.launch`) for each policy it tries, where the model is
seen under the candidate policy and the loss scale is the one Keras would start with
(``loss_scale`` and ``optimizer`` given).

Example:
    >>> import keras
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    >>> model.compile("adam", "mse")
    >>> info = run_info(model, batch_size=8, log_every=10)
    >>> info["policy"], info["loss_scale"]["kind"], info["optimizer"]
    ('float32', 'none', 'Adam')
"""

from __future__ import annotations

from typing import Any

from mpwatch.formats import KERAS_GROWTH_INTERVAL, KERAS_INITIAL_SCALE
from mpwatch.record.probe.twin import model_kind
from mpwatch.record.runtime import backend
from mpwatch.record.tap.tap_common import loss_scale_optimizer

__all__ = ["no_loss_scale_reason", "run_info"]


def no_loss_scale_reason(model: Any) -> str:
    """Why a model trains without a loss scale (for the notice and run_info)."""
    policy = getattr(getattr(model, "dtype_policy", None), "name", None) or "float32"
    if "bfloat16" in policy:
        return (
            f"policy {policy}: bfloat16 has float32's exponent range, so gradients do not "
            "underflow and Keras uses no loss scale"
        )
    if "float16" in policy:
        return (
            f"policy {policy} but the optimizer is not a LossScaleOptimizer (compiled with "
            "auto_scale_loss=False?): float16 gradients are not scaled and may underflow"
        )
    return f"policy {policy}: float32 training has no loss scale"


def loss_scale_facts(model: Any) -> tuple[dict[str, Any], str]:
    """(the ``loss_scale`` facts, the optimizer's name) of ``model``'s compiled optimizer."""
    lso = loss_scale_optimizer(getattr(model, "optimizer", None))
    if lso is not None:
        return {
            "kind": "dynamic",
            "reason": None,
            "initial": float(getattr(lso, "initial_scale", KERAS_INITIAL_SCALE)),
            "growth_interval": int(getattr(lso, "dynamic_growth_steps", KERAS_GROWTH_INTERVAL)),
        }, f"LossScaleOptimizer({type(lso.inner_optimizer).__name__})"
    none = {"kind": "none", "reason": no_loss_scale_reason(model), "initial": None,
            "growth_interval": None}  # fmt: skip
    return none, type(getattr(model, "optimizer", None)).__name__


def run_info(
    model: Any,
    *,
    batch_size: int | None,
    log_every: int,
    start: dict[str, Any] | None = None,
    loss_scale: dict[str, Any] | None = None,
    optimizer: str | None = None,
) -> dict[str, Any]:
    """The payload for ``model`` now (its policy as its layers are switched now: a pre-flight's
    candidate); ``loss_scale`` and ``optimizer``: facts given instead of the compiled
    optimizer's (a pre-flight's, as Keras would compile the model under the candidate)."""
    policy = model.dtype_policy
    own_scale, own_optimizer = loss_scale_facts(model)
    strategy, replicas = backend.strategy_facts(model)
    try:
        params = int(model.count_params()) if model.built else 0
    except Exception:  # noqa: BLE001
        params = 0
    return {
        "policy": policy.name,
        "compute_dtype": policy.compute_dtype,
        "variable_dtype": policy.variable_dtype,
        "loss_scale": loss_scale if loss_scale is not None else own_scale,
        "model": {
            "name": model.name,
            "class": type(model).__name__,
            "kind": model_kind(model),
            "params": params,
        },
        "optimizer": optimizer or own_optimizer,
        "backend": backend.name(),
        "strategy": strategy,
        "num_replicas": replicas,
        "steps_per_execution": int(getattr(model, "steps_per_execution", 1) or 1),
        "batch_size": batch_size,
        "log_every": log_every,
        "chief": backend.is_chief(model),
        "start": start,
        "device": backend.device_info(),
        "versions": backend.versions(),
    }
