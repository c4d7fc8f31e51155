"""The pre-flight's change against a short fit with it (issue 53's acceptance: "where it
recommends a policy map, a short fit with it does not [show the problem]").

:func:`fit_with_the_change` applies the report's findings to the model as the fit built it
(``mpwatch.apply_recommendations``: the policy map and the loss scale, the weights copied) and
trains it on the fit's own batches, reading the optimizer's own iterations after every batch.
:func:`check_the_change` holds that record against what the pre-flight said the change leaves
(the candidate recorded again with the change: ``Verdict.checked.predictions``): no stuck scale
(steps applied, losses finite), the first step skipped or not as predicted, and the skips before
the first applied step within the predicted range (from 0 where only some draws of the random
masks overflowed).
"""

from __future__ import annotations

import math

import keras
import numpy as np

import mpwatch

#: most steps a change's fit runs (a prediction of more skips is checked as far as this)
MOST_STEPS = 8


class Iterations(keras.callbacks.Callback):
    """The optimizer's own iterations (steps applied) after every batch, and the batch's loss."""

    def __init__(self):
        super().__init__()
        self.iterations, self.losses = [], []

    def on_train_batch_end(self, batch, logs=None):
        opt = self.model.optimizer
        if keras.backend.backend() == "jax":
            self.model.jax_state_sync()
        self.iterations.append(int(np.asarray(keras.ops.convert_to_numpy(opt.iterations))))
        self.losses.append(float((logs or {}).get("loss", math.nan)))


def steps_for(verdict) -> int:
    """Steps enough to see the first applied step the checked change predicts."""
    most = (verdict.checked.predictions.get("skipped_steps") or [0, 0])[1] or 0
    return min(MOST_STEPS, most + 2)


def fit_with_the_change(model, report, x, y, batch: int, steps: int) -> Iterations:
    """``model`` (as the fit built it, not trained) with the report's change applied, trained
    ``steps`` batches of ``batch`` from the start of ``(x, y)``, in order (from the start again
    where the data are fewer)."""
    applied = mpwatch.apply_recommendations(model, report.findings)
    rows = len(keras.tree.flatten(x)[0])
    idx = np.arange(steps * batch) % rows  # the data again where it has fewer batches
    xs, ys = keras.tree.map_structure(lambda a: np.asarray(a)[idx], (x, y))
    seen = Iterations()
    applied.model.fit(xs, ys, batch_size=batch, epochs=1, shuffle=False, verbose=0,
                      callbacks=[seen])  # fmt: skip
    assert len(seen.iterations) == steps
    return seen


def first_applied(iterations: list[int]) -> int:
    """Skips before the first applied step (all of them where none was applied)."""
    return next((i for i, n in enumerate(iterations) if n > 0), len(iterations))


def check_the_change(verdict, seen: Iterations) -> None:
    """The fit with the change against the pre-flight's predictions for it (module doc)."""
    assert verdict.checked is not None, verdict.reason
    p = verdict.checked.predictions
    its = seen.iterations
    first = first_applied(its)
    assert p["stuck"] is False, p
    fewest, most = p.get("skipped_steps") or [0 if p["skips"] is not True else 1, len(its)]
    if most < len(its):  # (a longer descent: checked as far as the fit went)
        assert first < len(its), ("no step applied with the change", p, its)
    assert all(math.isfinite(v) for v in seen.losses[first:]), seen.losses
    if p["skips"] is True:
        assert its[0] == 0, (p, its)
    elif p["skips"] is False:
        assert first == 0, (p, its)
    assert fewest <= first <= most, (p, its)


def check_same_causes(verdict, fit_findings) -> None:
    """What the fit's diagnosis asks of the code (the target or inputs to standardise: a cause a
    policy cannot fix), the pre-flight asks too, before the fit; and each output the fit keeps in
    float32 for an error, the pre-flight's change keeps (one advice, before and after)."""
    from mpwatch.judge.fixes.apply import float32_layers
    from mpwatch.launch.verdict import CODE_RULES

    asked = {f.rule for f in fit_findings if f.rule in CODE_RULES and f.severity == "error"}
    asked.discard("train-step")  # a custom train_step: traced at the fit, said unchecked before
    assert asked <= {f.rule for f in verdict.code_changes}, (asked, verdict.reason)
    # (layers kept for what later batches and weights did are the fit's own: one batch of the
    # first weights is probed, which the report says; an output in 16 bits is there from the
    # start)
    # (by role: a model built again in one session has other automatic layer names)
    if any(f.severity == "error" and f.rule == "output-16bit" for f in fit_findings):
        mine = [f for f in verdict.problems if f.rule == "output-16bit"]
        assert mine and set(float32_layers(mine)) <= set(verdict.fix.float32_layers), verdict
