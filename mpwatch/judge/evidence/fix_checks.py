"""The probe's fix checks, read for the rules: each candidate fix re-run on the batch that showed
the problem (``fix_checks`` of a ``probe`` record, written by
``mpwatch/record/probe/fix_check.py``).

:func:`latest_checks` finds them, :func:`describe` says what each did, and :func:`checked_layers`
turns a "keep this layer float32" advice into the smallest set of layers the probe saw make the
pass finite (or says none did), so a fix is shown only as far as it was seen to work.

Example:
    >>> describe([{"fix": "none", "first_nonfinite_layer": "d1"},
    ...           {"fix": "float32_layers", "layers": ["d1"], "finite": True}])
    ["as it is, the output of 'd1' is not finite", "keeping 'd1' float32: finite"]
"""

from __future__ import annotations

from typing import Any

from mpwatch import contract
from mpwatch.judge.rule import fmt, names_list, pct
from mpwatch.read.run import Run

#: a fix's other way out (activation-overflow's), left out where the probe checked it and it did
#: not fix the pass
NORMALIZE_ALTERNATIVE = "# or normalize / scale the input of this layer"

__all__ = [
    "latest_checks", "describe", "checked_layers", "works", "checked_gradient",
    "normalizing_works", "stopped", "checked_on", "scale_only",
]  # fmt: skip


def works(check: dict[str, Any]) -> bool:
    """The candidate left the pass finite with its 16-bit activations in range (records from
    before ``in_range`` existed: finite)."""
    return bool(check.get("in_range", check.get("finite")))


def latest_checks(run: Run) -> tuple[int, float | None, list[dict[str, Any]]] | None:
    """(step, loss scale, fix checks) of the latest probe whose pass was not finite and that
    checked fixes, else of the latest that checked fixes (its activations near the maximum), or
    None: the worst the probes saw is what the advice must fix. (A probe's checks run at
    least the pass as it is, ``fix: none``, before anything counts.)"""
    found = [
        (int(step), payload.get("loss_scale"), list(payload["fix_checks"]))
        for step, payload in run.records.get(contract.KIND_PROBE) or []
        if any(c.get("fix") == "none" for c in payload.get("fix_checks") or [])
    ]
    if not found:
        return None
    overflowed = [f for f in found if not _base_finite(f[2])]
    return (overflowed or found)[-1]


def _base_finite(checks: list[dict[str, Any]]) -> bool:
    base = next((c for c in checks if c.get("fix") == "none"), {})
    return bool(base.get("finite", False))


def _where(check: dict[str, Any]) -> str:
    first = check.get("first_nonfinite_layer")
    if first is None and check.get("finite"):
        return f"16-bit activations reach {fmt(check.get('max_abs_activation_16bit'))}"
    if first == "gradients":
        return "the scaled gradients are not finite"
    if first == "loss":
        return "the loss is not finite"
    return f"the output of {first!r} is not finite" if first else "not finite"


def _at(check: dict[str, Any]) -> str:
    first = check.get("first_nonfinite_layer")
    return {"gradients": "the scaled gradients", "loss": "the loss"}.get(
        str(first), f"at {first!r}"
    )


def _result(check: dict[str, Any]) -> str:
    if works(check):
        return "finite, in range"
    if check.get("finite"):
        peak = fmt(check.get("max_abs_activation_16bit"))
        return f"finite, but 16-bit activations still reach {peak}"
    return f"still not finite ({_at(check)})"


def describe(checks: list[dict[str, Any]]) -> list[str]:
    """Each check as a phrase: what was tried and what it did."""
    base = next((c for c in checks if c.get("fix") == "none"), None)
    out = []
    for c in checks:
        fix = c.get("fix")
        if fix == "none":
            out.append(f"as it is, {_where(c)}")
        elif fix == "float32_layers":
            what = f"keeping {names_list(list(c.get('layers') or []), 4)} float32"
            out.append(f"{what}: " + _result(c))
        elif fix == "normalize_inputs":
            text = "normalizing the inputs: " + _result(c)
            if works(c):
                text += f", 16-bit activations peak at {fmt(c.get('max_abs_activation_16bit'))}"
                if base is not None:
                    text += f" ({fmt(base.get('max_abs_activation_16bit'))} as it is)"
            out.append(text)
        elif fix == "normalize_target":
            out.append("standardising the target: " + _result(c))
        elif fix == "stopped":
            out.append(f"the checks stopped here ({c.get('reason') or 'not run'})")
    return out


def checked_on(step: int, scale: float | None, checks: list[dict[str, Any]]) -> str:
    """The evidence of a rule reading the checks of step ``step``'s probe: where, at which
    scale, and what each candidate did (:func:`describe`)."""
    from mpwatch.judge.evidence import scale_evidence as se

    at_scale = f" at loss scale {se.scale_text(float(scale))}" if scale else ""
    return f"checked on step {step}'s batch{at_scale}: " + "; ".join(describe(checks))


def stopped(checks: list[dict[str, Any]]) -> str | None:
    """Why the fix checks stopped before their end (mpwatch's cost budget), or None: a
    candidate that was not reached is not checked, neither fixing nor failing to."""
    last = checks[-1] if checks else {}
    return str(last.get("reason") or "stopped") if last.get("fix") == "stopped" else None


def checked_layers(run: Run, layer: str) -> tuple[list[str] | None, str] | None:
    """For advice that keeps ``layer`` float32: ``(layers, evidence)`` where ``layers`` is the
    smallest set of float32 layers, starting with ``layer``, that the latest fix checks saw make
    the pass finite (None: none did), and ``evidence`` says what was checked; None when no probe
    checked a fix starting with ``layer``."""
    got = latest_checks(run)
    if got is None:
        return None
    step, _, checks = got
    tried = [
        c for c in checks
        if c.get("fix") == "float32_layers" and (c.get("layers") or [None])[0] == layer
    ]  # fmt: skip
    if not tried:
        return None
    ok = next((c for c in tried if works(c)), None)
    text = f"checked on step {step}'s batch: " + "; ".join(describe(checks))
    return (list(ok["layers"]) if ok else None), text


def scale_only(got: tuple[int, float | None, list[dict[str, Any]]] | None) -> bool:
    """Whether the checks saw only the scaled gradients overflow: the pass as it is and every
    change tried finite up to the gradients at the probe's loss scale, none finite there (a
    scale too high for the batch, which Keras' dynamic scale lowers: the checks say nothing of a
    layer's change then)."""
    if got is None:
        return False
    tried = [c for c in got[2] if c.get("fix") not in ("stopped",)]
    return bool(tried) and all(
        not c.get("finite") and c.get("first_nonfinite_layer") == "gradients" for c in tried
    )


def normalizing_works(run: Run) -> bool | None:
    """Whether normalizing the inputs made the pass finite and in range in the latest fix checks
    (None: not checked)."""
    got = latest_checks(run)
    tried = [c for c in got[2] if c.get("fix") == "normalize_inputs"] if got else []
    return works(tried[-1]) if tried else None


#: a float32 layer fixes its gradient error when the error falls below the gradient-error rule's
#: threshold for the probe's 16-bit dtype and to at most this share of what it was
GRAD_FIXED_SHARE = 0.5


def checked_gradient(
    run: Run, layer: str, limits: dict[str, float]
) -> tuple[bool | None, str] | None:
    """For a "keep this layer float32" advice against its gradient error: ``(fixed, evidence)``
    from the latest probe that re-ran its pass with the layer in float32 (``grad_fix_checks``;
    ``fixed`` None where that pass could not run), or None when none did. ``limits``: the error
    a fixed gradient stays within, by the probe's mode (the rule's threshold)."""
    for step, payload in reversed(run.records.get(contract.KIND_PROBE) or []):
        for c in payload.get("grad_fix_checks") or []:
            if c.get("layer") != layer:
                continue
            before, after = c.get("before"), c.get("after")
            if c.get("skipped"):
                return None, (
                    f"the probe of step {step} did not check {layer!r} in float32 "
                    f"({c['skipped']}): this fix is not checked"
                )
            if c.get("error"):
                return None, (
                    f"the probe of step {step} could not run the pass with {layer!r} in float32 "
                    f"({c['error']}): this fix is not checked"
                )
            if not isinstance(before, (int, float)) or not isinstance(after, (int, float)):
                return None
            limit = limits.get(str(payload.get("mode")), limits["float16"])
            fixed = after <= limit and after <= GRAD_FIXED_SHARE * before
            what = (
                f"brings its gradient error from {pct(before)} to {pct(after)}"
                if fixed
                else f"leaves its gradient error at {pct(after)} (from {pct(before)})"
            )
            text = f"checked on step {step}'s batch: keeping {layer!r} float32 {what}"
            return fixed, text
    return None


# --- a finding's advice, as the checks judge it (mpwatch.judge.folds.checked_fixes) ---------------
def settle_layers(run: Run, f: Any, stopped_why: str | None) -> None:
    """A finding that keeps its layer float32, where the probe checked that fix on the batch that
    showed the problem: its evidence says what the check saw; when the layer alone did not make
    the pass finite but a few more layers did, the advice (action and fix) grows to those
    layers; when none did, the finding keeps no float32 action (a fix that does not fix is not
    offered), unless the checks stopped before their end (``stopped_why``, mpwatch's cost
    budget): then the advice stands, said unchecked."""
    from mpwatch.judge.fixes.fix import Fix, layers_code

    got = checked_layers(run, f.layer)
    if got is None:
        return
    layers, text = got
    f.evidence += f"; {text}"
    f.data = {**f.data, "checked_layers": layers}
    if layers is None and stopped_why:  # not reached: not checked, and not refuted either
        f.evidence += "; so keeping these layers float32 is not checked"
        f.data = {**f.data, "fix_unchecked": stopped_why}
        return
    if layers is None and scale_only(latest_checks(run)):
        f.evidence += (
            "; there only the scaled gradients overflow, with and without the change: the loss "
            "scale is too high for this batch (Keras halves it at each skipped step), which this "
            "check neither confirms nor refutes the change for"
        )
        f.data = {**f.data, "fix_unchecked": "only the scaled gradients overflowed"}
        return
    if normalizing_works(run) is False:  # checked, and it did not fix: not offered
        f.fix = "\n".join(ln for ln in f.fix.split("\n") if ln != NORMALIZE_ALTERNATIVE)
    if layers is None:
        f.action = {}
        f.fix = (
            "# keeping this layer (or the next ones) in float32 did not make it finite:\n"
            "# see the evidence for what the probe tried on the batch that overflowed"
        )
    elif layers != [f.layer]:  # one advice, printed and applied: the same layers
        f.action = Fix.of(f).with_layers(layers).action()
        f.fix = layers_code(layers, run)


def settle_gradient(run: Run, f: Any, limits: dict[str, float]) -> None:
    """A gradient-error advice the probe checked (:func:`checked_gradient`, ``limits`` its
    threshold): shown with what the check saw, or, where float32 left the error as it was,
    withdrawn (info, no action): the error comes with the gradient from elsewhere."""
    got = checked_gradient(run, str(f.layer), limits)
    if got is None:
        return
    fixed, text = got
    f.evidence += f"; {text}"
    f.data = {**f.data, "checked_fixed": fixed}
    if fixed is False:
        f.severity = "info"
        f.title = (
            f"Gradient of layer {f.layer!r} differs from float32; float32 there does not fix it"
        )
        f.action = {}
        f.fix = (
            "# keeping this layer in float32 does not fix its gradient error (checked): the\n"
            "# error comes with the gradient from the layers after it, 16-bit arithmetic over\n"
            "# the network rather than one layer"
        )
