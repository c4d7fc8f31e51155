"""Why each step was skipped: every skip of a run attributed to a cause found in its records.

Keras' ``LossScaleOptimizer`` skips a step whose gradients are not finite and halves the scale;
after ``dynamic_growth_steps`` finite steps it doubles it. So a skip is one of:

- ``descent``: the scale coming down from its initial value to one the model's gradients fit
  in: the consecutive skips the run starts with, and, within its first 100 steps, every
  skip at a scale lower than any skip before it ran at (a count of halvings, read from the
  per-step flags and scales: 2^15 down to 2^12 is 3 skips; a bad batch's skip is not one).
  Where a probe's sweep says at which scale the float32 reference's gradients would overflow
  float16, the descent ends 2 bits below it: a skip at a lower scale is
  the float16 model overflowing where its float32 twin would not, not a descent a sound model
  makes too;
- ``bad_input``: the batch itself holds NaN/inf, or, under float16 math, values beyond float16's
  range (the per-batch input health, ``mpwatch/input/*``): no scale helps, the data does;
- ``growth``: the scale it ran at is larger than the one the previous skip left (the scale had
  doubled since): a doubling that failed, as the dynamic scale expects about once per growth
  interval;
- ``model_overflow``: the model's own pass overflows at this scale: a probe saw its gradients
  (or activations) go non-finite at this scale or a smaller one, on its batch, first in the
  layer the probe names (a float16 softmax output, a layer near float16's maximum); or the
  float32 reference's gradients fit at this scale (the sweep) and the scale fell below the
  descent's end all the same. A probe whose forward pass itself was not finite outranks the
  descent (no scale helps an activation overflow), and so does one whose gradients were not
  finite where there is no sweep to bound the descent; a sweep's prediction comes after the
  descent and a failed doubling; a probe whose pass as the train step runs it (Dropout on, at
  the largest scale a step skipped at since the probe before) overflowed where its own did not,
  and was finite with one layer in float32 (a float16 softmax output), ties to that layer the
  skips nearest it at that scale or more, and those at scales the float32 reference fits (not
  a sound model's descent), the descent's too;
- ``unexplained``: a step that overflowed at a scale that had worked before, on a batch whose
  input looks sound, where no probe saw an overflow at that scale.

:func:`skip_causes` returns one :class:`SkipCause` per skipped step; the ``skipped-steps`` and
``bad-batches`` rules read it.

Example:
    >>> from mpwatch.read import Run
    >>> skip_causes(Run(name=".", path=""))
    []
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from mpwatch import contract, words
from mpwatch.formats import FLOAT16
from mpwatch.judge.evidence.scale_facts import START_STEPS, overflows
from mpwatch.judge.rule import compute_dtype
from mpwatch.read.run import Run

__all__ = [
    "CAUSES",
    "SkipCause",
    "TWIN_FITS",
    "bad_input_steps",
    "by_cause",
    "descent_steps",
    "probe_overflows",
    "reference_overflow_scale",
    "skip_causes",
    "steps_text",
    "training_mode_fixes",
    "training_mode_overflows",
]

#: within so many steps, a skip at a new lowest scale is the scale's descent (Keras' scale starts
#: at 2**15 and finds its level in the first steps; later, a new low is something else)
DESCENT_STEPS = START_STEPS

#: a descent that stops this many bits below the scale at which the float32 reference's weight
#: gradients overflow is a sound model's (the backward pass's activation gradients run larger
#: than the weights'); below it, the float16 model overflows where its twin would not
REFERENCE_MARGIN_BITS = 2

#: how a skip's detail begins when the float32 reference fits at its scale (no probe saw where)
TWIN_FITS = "the float32 reference's gradients fit"

#: the causes, in the order they are tried after the descent
CAUSES = ("descent", "bad_input", "growth", "model_overflow", "unexplained")


@dataclass(frozen=True)
class SkipCause:
    """One skipped step: its step, the scale it ran at (None where unknown), its cause (one of
    :data:`CAUSES`) and the evidence as a phrase."""

    step: int
    scale: float | None
    cause: str
    detail: str


def descent_steps(run: Run) -> list[int]:
    """The skipped steps the run starts with, consecutively (the scale's descent), from the
    per-step skip flags; ``[]`` without them."""
    flags = run.scalar(contract.STEP_SKIPPED).dropna()
    out: list[int] = []
    for step, flag in flags.items():
        if int(step) == 0:
            continue
        if float(flag) < 0.5:
            break
        out.append(int(step))
    return out


def bad_input_steps(run: Run) -> dict[int, str]:
    """Step -> what is wrong with its batch: NaN/inf in its float features, or (under float16
    math) values beyond float16's range, from the per-batch input health."""
    bad = run.scalar(contract.INPUT_NONFINITE_COUNT).dropna()
    peak = run.scalar(contract.INPUT_MAX_ABS).dropna()
    out: dict[int, str] = {}
    for step, n in bad.items():
        if float(n) > 0:
            out[int(step)] = f"{int(n)} NaN/inf input values"
    if compute_dtype(run) == "float16":
        for step, mx in peak.items():
            if float(mx) > FLOAT16.max and int(step) not in out:
                out[int(step)] = f"max |x| {words.number(float(mx))} > float16's {FLOAT16.max:g}"
    return out


def probe_overflows(run: Run) -> list[tuple[int, float, str | None, bool]]:
    """``(probe step, scale, root layer, seen)`` for every float16 probe (not marked unreliable)
    that saw a non-finite pass at its own loss scale (``seen``: it names a first non-finite
    layer), or whose sweep predicts an overflow (at the smallest scale it does; not seen)."""
    pm = run.probe_model
    if not len(pm) or "step" not in pm:
        return []
    out: list[tuple[int, float, str | None, bool]] = []
    sweeps = run.sweeps
    for row in pm.to_dict("records"):
        if row.get("mode") not in (None, "float16") or row.get("reliable") is False:
            continue
        step = int(row["step"])
        root = row.get("first_nonfinite_layer")
        root = str(root) if isinstance(root, str) and root else None
        scale = row.get("loss_scale")
        if root is not None and isinstance(scale, (int, float)) and math.isfinite(scale):
            out.append((step, float(scale), root, True))
            continue
        if len(sweeps) and {"step", "scale", "predicted_overflow_fraction"} <= set(sweeps):
            at = sweeps[(sweeps["step"] == step) & (sweeps["predicted_overflow_fraction"] > 0)]
            if len(at):
                out.append((step, float(at["scale"].min()), root, False))
    return out


def reference_overflow_scale(run: Run) -> float | None:
    """The smallest scale at which a float16 probe's sweep predicts the float32 reference's
    gradients would overflow float16 (twice the largest swept scale where none would); None
    without a sweep."""
    sweeps = run.sweeps
    pm = run.probe_model
    if not len(sweeps) or not {"step", "scale", "predicted_overflow_fraction"} <= set(sweeps):
        return None
    steps = set(sweeps["step"])
    if len(pm) and {"step", "mode"} <= set(pm):
        ok = pm[pm["mode"].isin([None, "float16"]) | pm["mode"].isna()]
        if "reliable" in pm:
            ok = ok[ok["reliable"].ne(False)]
        steps &= set(ok["step"])
    out = []
    for step in steps:
        rows = sweeps[sweeps["step"] == step]
        over = rows[rows["predicted_overflow_fraction"] > 0]
        out.append(float(over["scale"].min()) if len(over) else 2.0 * float(rows["scale"].max()))
    return min(out) if out else None


def skip_causes(run: Run) -> list[SkipCause]:
    """Every skipped step of the run with its cause (see the module docstring)."""
    ovs = overflows(run)
    if not ovs:
        return []
    descent = set(descent_steps(run))
    bad = bad_input_steps(run)
    probes = probe_overflows(run)
    out: list[SkipCause] = []
    left: float | None = None  # the scale the previous skip left (half the scale it ran at)
    low = math.inf  # the lowest scale a skip that was not a bad batch's ran at
    seen_probes = [p for p in probes if p[3]]
    trained = training_mode_overflows(run)
    forward = _forward_overflows(run)
    ref = reference_overflow_scale(run)
    floor = ref / 2.0**REFERENCE_MARGIN_BITS if ref is not None else None
    for o in sorted(ovs, key=lambda o: o.step):
        scale = o.scale
        seen = _probe_saw(seen_probes, o.step, scale) if scale is not None else None
        shaped = o.step in descent or (
            o.step <= DESCENT_STEPS and scale is not None and scale < low
        )
        below = floor is not None and scale is not None and scale < floor
        if o.step in bad:
            cause, detail = "bad_input", bad[o.step]
        elif seen is not None and seen[0] in forward:  # no scale helps a forward overflow
            cause, detail = "model_overflow", _saw(seen, "saw")
        elif (
            scale is not None
            and (tm := _nearest(trained, o.step)) is not None
            and (scale >= tm[1] or below)
        ):
            cause = "model_overflow"  # measured as training runs, and fixed by one layer
            detail = (
                f"the probe at step {tm[0]} saw the pass overflow at {_scale(tm[1])} as the "
                f"train step runs it (Dropout on; finite with {tm[2]!r} in float32)"
                + ("" if scale >= tm[1] else "; the float32 reference fits at this scale")
                + f", first in {tm[2]!r}"
            )
        elif shaped and floor is not None and not below:
            cause, detail = "descent", _descent(o.step in descent, scale)
        elif seen is not None:  # a probe saw the model's own pass overflow at this scale or less
            cause, detail = "model_overflow", _saw(seen, "saw")
        elif shaped and not below:
            cause, detail = "descent", _descent(o.step in descent, scale)
        elif scale is not None and left is not None and scale > left:
            cause, detail = "growth", f"the scale had grown to {_scale(scale)} since the last skip"
        elif shaped and below and ref is not None:
            cause = "model_overflow"
            detail = (
                f"{TWIN_FITS} at {_scale(scale)} (they would overflow "
                f"from {_scale(ref)}): the float16 pass overflowed where its float32 twin would not"
            )
        elif scale is not None and (pred := _probe_saw(probes, o.step, scale)) is not None:
            cause, detail = "model_overflow", _saw(pred, "predicts")
        else:
            cause, detail = "unexplained", "overflow at a scale that had worked, on a sound batch"
        out.append(SkipCause(o.step, scale, cause, detail))
        if cause != "bad_input" and scale is not None:
            low = min(low, scale)
        if scale is not None and math.isfinite(scale):
            left = scale / 2.0
    return out


def training_mode_overflows(run: Run) -> list[tuple[int, float, str | None, bool]]:
    """``(probe step, scale, layer, True)`` for every float16 probe whose pass as the train step
    runs it (Dropout on: the record's ``training_mode``) overflowed at that scale where its own
    pass, random layers off, did not, and was finite with that one layer in float32: the layer
    the training's skips at that scale or more come from."""
    return [
        (step, float(tm["scale"]), str(tm["float32_layers"][0]), True)
        for step, tm in training_mode_fixes(run)
    ]


def training_mode_fixes(run: Run) -> list[tuple[int, dict[str, Any]]]:
    """``(probe step, training_mode record)`` of :func:`training_mode_overflows`' probes: the
    record whole (the pre-flight's has ``draws``, ``nonfinite_draws`` and ``fixed_draws``)."""
    out: list[tuple[int, dict[str, Any]]] = []
    for step, payload in run.records.get(contract.KIND_PROBE) or []:
        tm = payload.get("training_mode") or {}
        layers = tm.get("float32_layers") or []
        if tm.get("finite") is False and tm.get("fixed") and len(layers) == 1 and tm.get("scale"):
            out.append((int(step), tm))
    return out


def _forward_overflows(run: Run) -> set[int]:
    """The steps of the probes whose forward pass itself was not finite (an activation beyond
    float16's range: no loss scale helps)."""
    pm = run.probe_model
    if not len(pm) or not {"step", "max_abs_activation"} <= set(pm):
        return set()
    peak = pm["max_abs_activation"].astype("float64")
    return {int(s) for s, v in zip(pm["step"], peak) if not math.isfinite(v)}


def _descent(consecutive: bool, scale: float | None) -> str:
    if consecutive or scale is None:
        return "the scale's descent"
    return f"the scale's descent (a new lowest scale, {_scale(scale)})"


def _saw(probe: tuple[int, float, str | None, bool], verb: str) -> str:
    p_step, p_scale, root, _ = probe
    return f"the probe at step {p_step} {verb} the pass overflow at {_scale(p_scale)}" + (
        f", first in {root!r}" if root else ""
    )


def _probe_saw(
    probes: list[tuple[int, float, str | None, bool]], step: int, scale: float
) -> tuple[int, float, str | None, bool] | None:
    """The probe nearest to ``step`` that saw an overflow at ``scale`` or less."""
    fits = [p for p in probes if p[1] <= scale]
    return min(fits, key=lambda p: abs(p[0] - step)) if fits else None


def _nearest(
    probes: list[tuple[int, float, str | None, bool]], step: int
) -> tuple[int, float, str | None, bool] | None:
    """The probe nearest to ``step``, the later of two as near."""
    return min(probes, key=lambda p: (abs(p[0] - step), -p[0])) if probes else None


def _scale(s: float) -> str:
    return words.loss_scale(s)


def by_cause(causes: list[SkipCause]) -> dict[str, list[SkipCause]]:
    """The skips grouped by cause, every cause of :data:`CAUSES` present (maybe empty)."""
    out: dict[str, list[SkipCause]] = {c: [] for c in CAUSES}
    for c in causes:
        out[c.cause].append(c)
    return out


def steps_text(steps: list[int], limit: int = 6) -> str:
    """``18, 32, 40 and 3 more``."""
    shown = ", ".join(str(s) for s in steps[:limit])
    return shown + (f" and {len(steps) - limit} more" if len(steps) > limit else "")
