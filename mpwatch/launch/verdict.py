"""A pre-flight candidate's verdict, from its run's diagnosis: what training under it will do.

Pure: a candidate's :class:`~mpwatch.read.run.Run` and its findings in, a :class:`Verdict` out.

- **Problems**: the findings of warning or error about the numbers (every rule except those
  about speed and the device, which are the "worth it" question: ``SPEED_RULES``).
- **The change**: one :class:`~mpwatch.judge.fixes.fix.Fix`, the candidate policy with every
  problem's layers to keep in float32 and its loss scale, read exactly as
  :func:`mpwatch.apply_recommendations` reads the same findings (``float32_layers``,
  ``loss_scale_advice``). Problems whose fix is code the model cannot be given by a policy (the
  inputs or target to normalize, a custom ``train_step``) are ``code_changes``.
- **Checked**: the pre-flight records the candidate again with the change applied and judges that
  run too (``checked``): the change's problems gone there is measured, not assumed.
- **Predictions**, from the first probe (at the scale Keras would start with), each a statement a
  short fit can check: ``skips`` (the first steps' gradients or activations are not finite: Keras
  skips them and halves the scale; ``skipped_steps``: at least one, at most down to the scale a
  later probe measured the pass finite at; None where only some draws of the train step's random
  masks overflowed, ``train_step_draws`` says how many: the first step may skip, or not, and
  ``skipped_steps`` starts at 0), ``stuck`` (a layer's forward pass overflows float16
  at any scale: every step is skipped and the scale falls to its floor), ``underflow_fraction``
  (the share of the float32 reference's nonzero gradient elements below float16's smallest
  subnormal at that scale: underflow, from the probe's sweep) beside ``zero_fraction`` (the share
  the 16-bit pass has zero where float32's are not, whatever the cause: underflow, or another
  network, as ids rounded to other rows). All with the model's random layers off
  (``random_layers_off``: Dropout, noise), as the probe runs them: a fit's random masks can
  overflow where this pass did not.

Example:
    >>> from mpwatch.read import Run
    >>> v = judge_candidate("mixed_float16", Run(name="mixed_float16", path=""), [])
    >>> v.verdict
    'not measured'
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from mpwatch.contract import finite_float
from mpwatch.judge.finding import Finding
from mpwatch.judge.fixes.apply import float32_layers, loss_scale_advice
from mpwatch.judge.fixes.fix import Fix
from mpwatch.read.run import Run

__all__ = ["SPEED_RULES", "Verdict", "judge_candidate", "READY", "READY_WITH_CHANGE",
           "NOT_READY", "NOT_MEASURED"]  # fmt: skip

#: rules about speed, the device or the record itself: the "worth it" question, not the numbers
SPEED_RULES = frozenset(
    {"no-tensor-cores", "tensor-core-use", "tensor-core-alignment", "mixed-vs-float32", "profile",
     "float8-readiness", "try-mixed-precision", "preflight-policy", "budget", "float32-inside"}
)  # fmt: skip
#: problems whose fix is the user's code, never a policy (the probe's fix checks measure them)
CODE_RULES = frozenset({"input-range", "target-range", "train-step", "id-rounding"})

READY, READY_WITH_CHANGE = "ready", "ready with the change"
NOT_READY, NOT_MEASURED = "not ready", "not measured"


@dataclass
class Verdict:
    """One candidate policy's verdict.

    Attributes:
        policy: the candidate.
        run: its run's path.
        verdict: :data:`READY`, :data:`READY_WITH_CHANGE`, :data:`NOT_READY` or
            :data:`NOT_MEASURED`.
        reason: the verdict in words.
        findings: its run's findings (most severe first).
        problems: the findings about the numbers, of warning or error.
        code_changes: the problems whose fix is code (normalize the inputs, ...).
        fix: the change: the policy, the layers to keep in float32, the loss scale.
        checked: the verdict of the candidate recorded again with ``fix`` applied, or None.
        predictions: what a fit under the candidate as it is will show (see the module doc).
        added: findings of the runs with a change applied whose advice grew ``fix`` (a layer
            the first run's checks could not show to help); with ``findings`` they give
            ``apply_recommendations`` exactly ``fix``.

    Example:
        >>> v = Verdict("mixed_float16", "logs/pre/mixed_float16", READY, "no problem")
        >>> v.changes_model, v.to_dict()["fix"]
        (False, {})
    """

    policy: str
    run: str
    verdict: str
    reason: str
    findings: list[Finding] = field(default_factory=list)
    problems: list[Finding] = field(default_factory=list)
    code_changes: list[Finding] = field(default_factory=list)
    fix: Fix = field(default_factory=Fix)
    checked: Verdict | None = None
    predictions: dict[str, Any] = field(default_factory=dict)
    added: list[Finding] = field(default_factory=list)

    @property
    def changes_model(self) -> bool:
        """Whether the change keeps layers in float32 or sets a loss scale."""
        return bool(self.fix.float32_layers or self.fix.loss_scale)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict."""
        return {
            "policy": self.policy,
            "run": self.run,
            "verdict": self.verdict,
            "reason": self.reason,
            "predictions": dict(self.predictions),
            "fix": self.fix.action(),
            "problems": [f.to_dict() for f in self.problems],
            "code_changes": [f.rule for f in self.code_changes],
            "checked": self.checked.to_dict() if self.checked is not None else None,
        }


def problems_of(findings: list[Finding]) -> list[Finding]:
    """The findings about the numbers, of warning or error."""
    return [f for f in findings if f.at_least("warning") and f.rule not in SPEED_RULES]


def change_of(policy: str, problems: list[Finding]) -> Fix:
    """The one change for ``problems`` under ``policy`` (see the module doc)."""
    scale, growth = loss_scale_advice(problems)
    return Fix(
        float32_layers=tuple(float32_layers(problems)),
        policy=policy,
        loss_scale=scale if policy == "mixed_float16" else None,
        dynamic_growth_steps=growth if policy == "mixed_float16" else None,
    )


#: code changes exact by construction (an integer ``Input`` keeps every id as it is)
EXACT_CODE_RULES = frozenset({"id-rounding"})


def _checked_code_change(f: Finding) -> bool:
    """A code change the probe's fix checks measured as making the pass finite, or one exact by
    construction (:data:`EXACT_CODE_RULES`)."""
    if f.rule in EXACT_CODE_RULES:
        return True
    checks = (f.data or {}).get("fix_checks") or []
    return f.rule in CODE_RULES and any(
        isinstance(c, dict) and c.get("finite") and c.get("fix") != "none" for c in checks
    )


def predictions(run: Run) -> dict[str, Any]:
    """What the first probe (Keras' start) says a fit will show (see the module doc)."""
    pm = run.probe_model
    if not len(pm) or "step" not in pm:
        return {}
    row = pm.sort_values("step", kind="stable").iloc[0].to_dict()
    scale = finite_float(row.get("loss_scale")) or 1.0
    first = row.get("first_nonfinite_layer")
    first = str(first) if isinstance(first, str) and first else None
    over = under = None
    sweep = run.sweeps
    if len(sweep) and {"step", "scale", "predicted_overflow_fraction"} <= set(sweep.columns):
        at = sweep[(sweep["step"] == row["step"]) & (sweep["scale"] == scale)]
        if len(at):
            over = float(at["predicted_overflow_fraction"].iloc[0])
            under = finite_float(at["predicted_underflow_fraction"].iloc[0])
    halvings = _halvings(run, row, scale) if scale > 1 else None
    nonfinite = int(finite_float(row.get("nonfinite")) or 0)
    forward = _forward_overflow(run, int(row["step"]))
    payload = next((pl for st, pl in run.records.get("probe") or [] if st == row["step"]), {})
    trained = _training_modes(run).get(int(row["step"]))
    # measured, not the sweep's estimate (which scales every gradient as float16's, also those
    # of layers kept in float32: a finite pass where it predicted 0.7% overflow)
    skips: bool | None = nonfinite > 0
    if not skips and trained and not trained["finite"]:
        skips = None if _some_draws(trained) else True  # a matter of the masks: may skip
    if skips is None and halvings:
        halvings = [0, halvings[1]]
    return {
        "scale": scale,
        "random_layers_off": list(payload.get("random_layers_off") or []),
        "probe_pass_finite": nonfinite == 0,
        "train_step_pass_finite": None if trained is None else bool(trained.get("finite")),
        "train_step_draws": None if trained is None else _draws(trained),
        "skips": skips,
        "stuck": forward is not None,
        "first_nonfinite_layer": forward or first,
        "predicted_overflow_fraction": over,
        "skipped_steps": halvings if not forward else None,
        "underflow_fraction": under,
        "zero_fraction": finite_float(row.get("underflow_fraction")),
        "loss": finite_float(row.get("loss")),
        "reference_loss": finite_float(row.get("ref_loss")),
    }


def _halvings(run: Run, first: dict[str, Any], scale: float) -> list[int] | None:
    """``[fewest, most]`` steps Keras skips at the start, halving ``scale`` at each: at least one
    where the probe at ``scale`` measured non-finite values, at most down to the lowest scale a
    later probe measured the whole pass finite at (the sweep's, probed at step 2). None where no
    later probe was finite below ``scale`` (a forward overflow, or none ran)."""
    trained = _training_modes(run)
    start = trained.get(int(first["step"]))
    if not (finite_float(first.get("nonfinite")) or 0) > 0 and (start is None or start["finite"]):
        return [0, 0]
    pm = run.probe_model
    later = pm[(pm["step"] > first["step"]) & (pm["nonfinite"] == 0)] if "nonfinite" in pm else []
    fine = [
        s for st, v in zip(getattr(later, "step", []), getattr(later, "loss_scale", []))
        if (s := finite_float(v)) and s < scale and trained.get(int(st), {"finite": True})["finite"]
    ]  # fmt: skip
    if not fine:
        return None
    return [1, int(round(math.log2(scale / max(fine))))]


def _draws(trained: dict[str, Any]) -> list[int] | None:
    """``[not finite, draws]`` of a training-mode pass, where its draws are recorded."""
    n, bad = trained.get("draws"), trained.get("nonfinite_draws")
    return [int(bad), int(n)] if isinstance(n, int) and isinstance(bad, int) else None


def _some_draws(trained: dict[str, Any]) -> bool:
    """Whether some draws of the masks overflowed and others did not."""
    d = _draws(trained)
    return d is not None and 0 < d[0] < d[1]


def _training_modes(run: Run) -> dict[int, dict[str, Any]]:
    """Each probe's ``training_mode`` pass (Dropout on, as the train step runs it), by step."""
    return {
        int(st): pl["training_mode"]
        for st, pl in run.records.get("probe") or []
        if isinstance(pl.get("training_mode"), dict)
    }


def _forward_overflow(run: Run, step: int) -> str | None:
    """The first layer (forward order) whose activations the probe at ``step`` found not finite:
    a forward pass that overflows at any scale (a non-finite *gradient* at the probe's scale is
    the scale's, which Keras lowers), or None."""
    pl = run.probe_layers
    if not len(pl) or not {"step", "layer", "max_abs_activation"} <= set(pl.columns):
        return None
    for _, r in pl[pl["step"] == step].iterrows():
        v = r["max_abs_activation"]
        if isinstance(v, (int, float)) and not math.isfinite(v):  # inf, or NaN from inf - inf
            return str(r["layer"])
    return None


def judge_candidate(
    policy: str, run: Run, findings: list[Finding], checked: Verdict | None = None,
    error: str | None = None,
) -> Verdict:
    """The verdict of ``policy`` from its run and findings (``checked``: the verdict of the run
    with the change applied, when one was recorded; ``error``: why its probe could not run)."""
    problems = problems_of(findings)
    code = [f for f in problems if f.rule in CODE_RULES]
    if checked is not None:  # a code change the applied change made needless is not asked for
        code = [f for f in code if any(g.rule == f.rule for g in checked.problems)]
    fix = change_of(policy, problems)
    v = Verdict(policy, run.path, NOT_MEASURED, "", findings, problems, code, fix, checked,
                predictions(run))  # fmt: skip
    if run.latest_probe(reliable_only=False) is None:
        said = [error] if error else [f.title for f in findings if f.rule == "recording"]
        v.reason = said[0] if said else "the probe could not run"
        return v
    probe = run.latest_probe(reliable_only=False)
    if probe is not None and probe.model.get("reliable") is False:
        why = probe.model.get("unreliable_reason") or "its loss is not the train step's"
        v.reason = f"the probe is not reliable on this model: {why}"
        return v
    if not problems:
        v.verdict, v.reason = READY, "no problem with the numbers on this batch"
        return v
    left = problems if checked is None else checked.problems
    unchecked = [f for f in left if not _checked_code_change(f)]
    if (checked is not None or not v.changes_model) and not unchecked:
        v.verdict = READY_WITH_CHANGE
        v.reason = change_words(v, checked)
        return v
    v.verdict = NOT_READY
    names = ", ".join(dict.fromkeys(f"{f.rule}" + (f" ({f.layer})" if f.layer else "")
                                    for f in unchecked))  # fmt: skip
    v.reason = (
        f"with the change applied, still: {names}" if checked is not None
        else f"no checked change for: {names}"
    )  # fmt: skip
    return v


def change_words(v: Verdict, checked: Verdict | None) -> str:
    parts = []
    if v.fix.float32_layers:
        parts.append("keep " + ", ".join(repr(n) for n in v.fix.float32_layers) + " in float32")
    if v.fix.loss_scale:
        parts.append(f"start the loss scale at {v.fix.loss_scale:g}")
    parts += [f"{f.rule}: {f.title}" for f in v.code_changes]
    if checked is not None and not checked.problems:
        how = "recorded again with the change, its problems are gone"
    elif checked is not None:
        how = (
            "recorded again with the change, only the code changes' problems are left: each "
            "measured by the probe's fix checks or exact by construction"
        )
    else:
        how = "the probe's fix checks measured the code change on the batch"
    return "; ".join(parts) + f" ({how})"
