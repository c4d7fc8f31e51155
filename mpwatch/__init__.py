"""mpwatch: watch Keras mixed-precision training.

Add one callback to ``model.fit`` and read the result in TensorBoard's "Mixed Precision" tab or with
``mpwatch diagnose LOGDIR``:

    >>> import mpwatch  # doctest: +SKIP
    >>> monitor = mpwatch.MixedPrecisionMonitor(log_dir="logs/run1")  # doctest: +SKIP
    >>> model.fit(ds, callbacks=[monitor])  # doctest: +SKIP
    >>> run = mpwatch.load_run("logs/run1")  # doctest: +SKIP

Importing mpwatch is cheap: Keras and its backend are imported only when a name that needs them
is used, and only the backend Keras trains on (the JAX backend never imports TensorFlow).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mpwatch._version import __version__

# public name -> module that defines it (imported on first use)
_EXPORTS = {
    "MixedPrecisionMonitor": "mpwatch.record.callbacks.monitor",
    "LossScaleMonitor": "mpwatch.record.callbacks.loss_scale",
    "GradientHealthMonitor": "mpwatch.record.callbacks.gradient_health",
    "LayerDtypeMonitor": "mpwatch.record.callbacks.layer_dtypes",
    "StepTimeMonitor": "mpwatch.record.callbacks.step_time",
    "InputHealthMonitor": "mpwatch.record.callbacks.input_health",
    "TrainStepMonitor": "mpwatch.record.callbacks.train_step",
    "ProbeMonitor": "mpwatch.record.callbacks.probe_monitor",
    "ProfileMonitor": "mpwatch.record.callbacks.profile_capture",
    "record_trace": "mpwatch.record.callbacks.profile_capture",
    "TrainingLoopRecorder": "mpwatch.record.callbacks.loop",
    "share_skip_decision": "mpwatch.record.callbacks.loop",
    "Run": "mpwatch.read",
    "load_run": "mpwatch.read",
    "load_runs": "mpwatch.read",
    "Finding": "mpwatch.judge",
    "diagnose": "mpwatch.judge",
    "apply_recommendations": "mpwatch.judge.fixes.apply",
    "preflight": "mpwatch.launch.check",
    "Preflight": "mpwatch.launch.check",
}

__all__ = [
    "__version__",
    "MixedPrecisionMonitor",
    "LossScaleMonitor",
    "GradientHealthMonitor",
    "LayerDtypeMonitor",
    "StepTimeMonitor",
    "InputHealthMonitor",
    "TrainStepMonitor",
    "ProbeMonitor",
    "ProfileMonitor",
    "record_trace",
    "TrainingLoopRecorder",
    "share_skip_decision",
    "Run",
    "load_run",
    "load_runs",
    "Finding",
    "diagnose",
    "apply_recommendations",
    "preflight",
    "Preflight",
]
assert sorted(__all__[1:]) == sorted(_EXPORTS), "every lazy export is public"


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mpwatch' has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as e:
        raise _missing_backend(e) from e
    globals()[name] = value
    return value


#: the package each Keras backend needs, and the extra that installs it with mpwatch
_BACKEND_EXTRAS = {"tensorflow": "tensorflow", "jax": "jax", "jaxlib": "jax"}


def _missing_backend(error: ModuleNotFoundError) -> ModuleNotFoundError:
    """``error`` as it is, or, when Keras' backend package is what is missing, with the extra that
    installs it (``pip install "mpwatch[jax]"``)."""
    missing = (error.name or "").partition(".")[0]
    if missing not in _BACKEND_EXTRAS:
        return error
    import os

    backend = os.environ.get("KERAS_BACKEND", "tensorflow (Keras' default)")
    return ModuleNotFoundError(
        f"mpwatch: Keras' backend {backend} needs the {missing!r} package, which is not "
        f'installed: pip install "mpwatch[{_BACKEND_EXTRAS[missing]}]" (or set KERAS_BACKEND to '
        "an installed backend before importing keras)",
        name=missing,
    )


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # pragma: no cover
    from mpwatch.judge import Finding, diagnose
    from mpwatch.judge.fixes.apply import apply_recommendations
    from mpwatch.launch.check import Preflight, preflight
    from mpwatch.read import Run, load_run, load_runs
    from mpwatch.record.callbacks.gradient_health import GradientHealthMonitor
    from mpwatch.record.callbacks.input_health import InputHealthMonitor
    from mpwatch.record.callbacks.layer_dtypes import LayerDtypeMonitor
    from mpwatch.record.callbacks.loop import TrainingLoopRecorder, share_skip_decision
    from mpwatch.record.callbacks.loss_scale import LossScaleMonitor
    from mpwatch.record.callbacks.monitor import MixedPrecisionMonitor
    from mpwatch.record.callbacks.probe_monitor import ProbeMonitor
    from mpwatch.record.callbacks.profile_capture import ProfileMonitor, record_trace
    from mpwatch.record.callbacks.step_time import StepTimeMonitor
    from mpwatch.record.callbacks.train_step import TrainStepMonitor
