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
    "MixedPrecisionMonitor": "mpwatch.callbacks.monitor",
    "LossScaleMonitor": "mpwatch.callbacks.loss_scale",
    "GradientHealthMonitor": "mpwatch.callbacks.gradient_health",
    "LayerDtypeMonitor": "mpwatch.callbacks.layer_dtypes",
    "StepTimeMonitor": "mpwatch.callbacks.step_time",
    "ProbeMonitor": "mpwatch.callbacks.probe",
    "ProfileMonitor": "mpwatch.callbacks.profile_capture",
    "TrainingLoopRecorder": "mpwatch.loop",
    "share_skip_decision": "mpwatch.loop",
    "Run": "mpwatch.reader",
    "load_run": "mpwatch.reader",
    "load_runs": "mpwatch.reader",
    "Finding": "mpwatch.advisor",
    "diagnose": "mpwatch.advisor",
    "apply_recommendations": "mpwatch.apply",
}

__all__ = [
    "__version__",
    "MixedPrecisionMonitor",
    "LossScaleMonitor",
    "GradientHealthMonitor",
    "LayerDtypeMonitor",
    "StepTimeMonitor",
    "ProbeMonitor",
    "ProfileMonitor",
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
    from mpwatch.advisor import Finding, diagnose
    from mpwatch.apply import apply_recommendations
    from mpwatch.callbacks.gradient_health import GradientHealthMonitor
    from mpwatch.callbacks.layer_dtypes import LayerDtypeMonitor
    from mpwatch.callbacks.loss_scale import LossScaleMonitor
    from mpwatch.callbacks.monitor import MixedPrecisionMonitor
    from mpwatch.callbacks.probe import ProbeMonitor
    from mpwatch.callbacks.profile_capture import ProfileMonitor
    from mpwatch.callbacks.step_time import StepTimeMonitor
    from mpwatch.loop import TrainingLoopRecorder, share_skip_decision
    from mpwatch.reader import Run, load_run, load_runs
