"""What a part of the recording needs of a model or a fit, and the error that says it is missing.

:class:`CannotRun` is raised by a part that cannot run on this model or fit (the probe on a model
compiled without a loss, a distributed fit without ``probe_data``); the callbacks' guard
(:mod:`mpwatch.record.callbacks.base`) says it once a run, in one line that names the fix.
:func:`check_loss` is the probe's own need: a loss to differentiate.

Example:
    >>> import keras  # doctest: +SKIP
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])  # doctest: +SKIP
    >>> model.compile("sgd")  # doctest: +SKIP
    >>> check_loss(model)  # doctest: +SKIP
    Traceback (most recent call last):
    CannotRun: Sequential was compiled without loss= and the probe needs one: ...
"""

from __future__ import annotations

from typing import Any


class CannotRun(ValueError):
    """A part that cannot run on this model or fit (a model compiled without a loss, a
    distributed fit without ``probe_data``): not mpwatch failing but a missing argument. Its
    message is one line that names the fix;
    :meth:`~mpwatch.record.callbacks.base.RecordingCallback._guard` says it once a run (a warning
    and a ``notice``), and its traceback goes to the DEBUG log only."""


def check_loss(model: Any) -> None:
    """Raise :class:`CannotRun` naming ``loss_fn=`` where Keras' own ``compute_loss`` has nothing
    to compute for ``model``: compiled without a loss (keras.io's knowledge-distillation
    ``Distiller``, whose train_step computes its own), no loss of its own (``add_loss``,
    regularizers: known after a forward pass) and ``compute_loss`` not overridden. TensorFlow's
    Keras would raise "No loss to compute"; JAX's returns 0 (every gradient would be zero)."""
    if getattr(model, "_compile_loss", None) is not None or model.losses:
        return
    owner = next((c for c in type(model).__mro__ if "compute_loss" in c.__dict__), object)
    if not (owner.__module__ or "").startswith("keras."):  # a compute_loss of the user's own
        return
    raise CannotRun(
        f"{type(model).__name__} was compiled without loss= and the probe needs one: pass "
        "loss_fn=<loss(y_true, y_pred) -> scalar> to MixedPrecisionMonitor or ProbeMonitor"
    )
