"""mpwatch: watch Keras mixed-precision training.

Add one callback to ``model.fit`` and read the result in TensorBoard's "Mixed Precision" tab or with
``mpwatch diagnose LOGDIR``:

    >>> import mpwatch  # doctest: +SKIP
    >>> monitor = mpwatch.MixedPrecisionMonitor(log_dir="logs/run1")  # doctest: +SKIP
    >>> model.fit(ds, callbacks=[monitor])  # doctest: +SKIP
    >>> run = mpwatch.load_run("logs/run1")  # doctest: +SKIP

Importing mpwatch is cheap: TensorFlow is imported only when a name that needs it is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mpwatch._version import __version__

# public name -> module that defines it (imported on first use)
_EXPORTS = {
    "MixedPrecisionMonitor": "mpwatch.record.monitor",
    "LossScaleMonitor": "mpwatch.record.loss_scale",
    "GradientHealthMonitor": "mpwatch.record.gradient_health",
    "LayerDtypeMonitor": "mpwatch.record.layer_dtypes",
    "StepTimeMonitor": "mpwatch.record.step_time",
    "InputHealthMonitor": "mpwatch.record.input_health",
    "TrainStepMonitor": "mpwatch.record.train_step",
    "ProbeMonitor": "mpwatch.record.probe_monitor",
    "ProfileMonitor": "mpwatch.record.profile_capture",
    "record_trace": "mpwatch.record.profile_capture",
    "TrainingLoopRecorder": "mpwatch.record.loop",
    "share_skip_decision": "mpwatch.record.loop",
    "Run": "mpwatch.read",
    "load_run": "mpwatch.read",
    "load_runs": "mpwatch.read",
    "Finding": "mpwatch.judge",
    "diagnose": "mpwatch.judge",
    "apply_recommendations": "mpwatch.judge.fixes.apply",
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
]
assert sorted(__all__[1:]) == sorted(_EXPORTS), "every lazy export is public"


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mpwatch' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # pragma: no cover
    from mpwatch.judge import Finding, diagnose
    from mpwatch.judge.fixes.apply import apply_recommendations
    from mpwatch.read import Run, load_run, load_runs
    from mpwatch.record.gradient_health import GradientHealthMonitor
    from mpwatch.record.input_health import InputHealthMonitor
    from mpwatch.record.layer_dtypes import LayerDtypeMonitor
    from mpwatch.record.loop import TrainingLoopRecorder, share_skip_decision
    from mpwatch.record.loss_scale import LossScaleMonitor
    from mpwatch.record.monitor import MixedPrecisionMonitor
    from mpwatch.record.probe_monitor import ProbeMonitor
    from mpwatch.record.profile_capture import ProfileMonitor, record_trace
    from mpwatch.record.step_time import StepTimeMonitor
    from mpwatch.record.train_step import TrainStepMonitor
