"""The loss-scale advice of one run: what scale to propose, and whether the scale is the problem.

The rules ``loss-scale``, ``gradient-underflow`` and ``skipped-steps`` read the same facts
(:mod:`mpwatch.judge.evidence.scale_facts`: the scale history and every skipped step with the scale
it ran
at, every reliable float16 probe's sweep and histogram, Keras' dynamic rule with the run's own
values), so that they never disagree (a rule proposing one scale while another proposes a lower
one). Here the decision drawn from all of them.

:func:`advise` turns them into one :class:`Advice`, computed once per run (cached on the Run).
The decision and its thresholds are documented in the ``loss-scale`` rule
(``mpwatch/judge/rules/loss_scale.py``); in short:

1. **Silence** unless the underflow measured at the scale used (latest reliable probe) is at least
   :data:`UNDERFLOW_MATERIAL`.
2. **What a probe allows** (:func:`max_k`): the powers of two at which its sweep predicts no
   overflow and its largest reference gradient (activation gradients included) stays
   :data:`HEADROOM_BITS` doublings below 65504 (room for batches with gradients up to 4x the
   probe's before Keras must halve the scale).
3. The **level the gradients need** (target): the smallest power of two above the scale used whose
   predicted underflow is at most :data:`UNDERFLOW_NEGLIGIBLE`, else the largest candidate; a
   candidate is one the latest probe allows, below every scale that overflowed after the first
   ``START_STEPS`` steps. Its predicted underflow must be at least :data:`UNDERFLOW_MATERIAL`
   below the one predicted at the scale used, else there is no target.
4. **initial_scale**: the target, lowered to what every probe allows and to below every scale that
   overflowed in the run. Proposed only above both the run's initial scale and the scale used, and
   where the sweep predicts less underflow than at the scale used: a lower one can only lose more,
   an equal one changes nothing. (The earliest probe stands for the start: if the start's
   gradients are larger, the scale overflows and halves back in a few skipped steps; Keras: a
   scale too high is lowered far more quickly than one too low is raised.)
5. **dynamic_growth_steps**: when the need rises over the probes faster than one doubling per
   ``dynamic_growth_steps`` (least-squares slope; at least two probes and a rise of two
   doublings), or when the scale, doubling once per ``dynamic_growth_steps`` from where it
   starts (the proposed initial scale, else where the descent of the first ``START_STEPS``
   steps left it, or the run's initial scale), would not reach each probe's need by that probe's
   step. The proposal is the largest of :data:`GROWTH_LADDER` that
   keeps up, never below :data:`MIN_GROWTH_STEPS`, and only below the run's own.
6. **No single scale fits** when even the best scale allowed predicts underflow of at least
   :data:`UNDERFLOW_MATERIAL`: the histogram is wider than float16's window. The layers whose
   gradients underflow most at the scale used (the probe's per-layer table, above
   :data:`LAYER_UNDERFLOW_WARN`, not already float32) are named to keep in float32, and
   ``mixed_bfloat16`` is named where the device has bfloat16 (a GPU of compute capability at least
   ``BFLOAT16_MIN_CC``).

Pure pandas/numpy: no TensorFlow (the judge's rule).

Example:
    >>> from mpwatch.read.run import Run
    >>> advise(Run(name=".", path="")).kind
    'none'
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from mpwatch import words
from mpwatch.contract import finite_float
from mpwatch.judge.evidence.scale_advice import Advice, names_text, number_code
from mpwatch.judge.evidence.scale_facts import (
    START_STEPS,
    WINDOW_BITS,
    ProbeView,
    bfloat16_device,
    float16_probes,
    float32_layer_names,
    growth_facts,
    overflows,
    underflow_without,
)
from mpwatch.judge.fixes.fix import layers_code
from mpwatch.read.run import Run

__all__ = [
    "Advice",
    "advise",
    "max_k",
    "need_k",
    "underflowing_layers",
    "scale_text",
    "UNDERFLOW_MATERIAL",
    "UNDERFLOW_NEGLIGIBLE",
    "HEADROOM_BITS",
    "MIN_GROWTH_STEPS",
    "GROWTH_LADDER",
    "LAYER_UNDERFLOW_WARN",
]

#: measured underflow at the scale used below this: the loss scale is not the problem (silence).
#: The same 1% at which ``gradient-underflow`` warns: no advice for a loss no rule reports.
UNDERFLOW_MATERIAL = 0.01
#: a target scale is the smallest whose predicted underflow is at most this (0.1%)
UNDERFLOW_NEGLIGIBLE = 0.001
#: a proposed scale keeps the probe's largest reference gradient this many doublings below 65504
HEADROOM_BITS = 2
#: one failed doubling per MIN_GROWTH_STEPS steps skips 1% of the steps: ``skipped-steps``'
#: warning rate. A faster growth would cost more than it saves.
MIN_GROWTH_STEPS = 100
#: the dynamic_growth_steps values proposed (the largest that keeps up)
GROWTH_LADDER = (1000, 500, 200, 100)
#: a layer losing more than this share of its gradient values at the scale used is named
LAYER_UNDERFLOW_WARN = 0.05


# --- what a probe allows and needs ---------------------------------------------------------------
def max_k(probe: ProbeView) -> float | None:
    """The largest power of two this probe allows (log2): its largest reference gradient
    (activation gradients included) at least HEADROOM_BITS doublings below 65504, and no
    overflow predicted by its sweep. Without the largest gradient, from the probe's
    recommended scale (which keeps ``margin_bits``); without either, the sweep's largest
    overflow-free scale less HEADROOM_BITS. None: no scale is allowed (non-finite gradients);
    ``inf``: no gradient at all."""
    free = [k for k, (_u, o) in probe.sweep.items() if o == 0]
    sweep_cap = max(free) if free else (None if probe.sweep else math.inf)
    if probe.max_ref is not None:
        if not math.isfinite(probe.max_ref):
            return None
        if probe.max_ref <= 0:
            return sweep_cap
        k = math.floor(math.log2(65504.0 / 2.0**HEADROOM_BITS / probe.max_ref))
    elif probe.recommended is not None:
        k = math.floor(math.log2(probe.recommended) + probe.margin_bits - HEADROOM_BITS)
    elif free:
        k = max(free) - HEADROOM_BITS
    else:
        return None
    return k if sweep_cap is None else min(k, sweep_cap)


def need_k(probe: ProbeView, cap: float) -> int | None:
    """The smallest ``k <= cap`` with predicted underflow at most UNDERFLOW_NEGLIGIBLE."""
    ks = sorted(k for k in probe.predicted_ks() if k <= cap)
    for k in ks:
        u = probe.under(k)
        if u is not None and u <= UNDERFLOW_NEGLIGIBLE:
            return k
    return None


# --- words ---------------------------------------------------------------------------------------
#: a loss scale in words (``2^20 (1048576)``): :func:`mpwatch.words.loss_scale`, everywhere
scale_text = words.loss_scale
_pct = words.percent


# --- the advice ----------------------------------------------------------------------------------
def _advice_cached(run: Run) -> Advice | None:
    cached = run.__dict__.get("_judge_scale_advice")
    if cached is not None and cached[0] == _key(run):
        return cached[1]
    return None


def _key(run: Run) -> tuple[int, ...]:
    """The tables the advice reads (by identity: a Run's tables are replaced, not edited)."""
    return tuple(id(t) for t in (run.probe_model, run.scalars, run.sweeps, run.probe_inputs,
                                 run.probe_layers, run.histograms, run.info))  # fmt: skip


def advise(run: Run) -> Advice:
    """The loss-scale advice for one run (see the module doc); computed once per Run."""
    got = _advice_cached(run)
    if got is not None:
        return got
    adv = _advise(run)
    run.__dict__["_judge_scale_advice"] = (_key(run), adv)
    return adv


def underflowing_layers(
    run: Run,
    layers: pd.DataFrame,
    threshold: float = LAYER_UNDERFLOW_WARN,
    fallback: float | None = UNDERFLOW_MATERIAL,
) -> list[tuple[str, float]]:
    """``(layer, underflow fraction)`` of a probe's layer table for the layers losing more than
    ``threshold`` of their gradient values (none: those above ``fallback``), in the table's
    (forward) order, leaving out layers already computing in float32."""
    if not len(layers) or "underflow_fraction" not in layers or "layer" not in layers:
        return []
    f32 = float32_layer_names(run)
    floor = threshold if fallback is None else min(threshold, fallback)
    rows = []
    for r in layers.to_dict("records"):
        u = finite_float(r.get("underflow_fraction"))
        name = str(r["layer"])
        if u is not None and u > floor and name not in f32:
            rows.append((name, u))
    if fallback is None or any(u > threshold for _, u in rows):
        rows = [(n, u) for n, u in rows if u > threshold]
    return rows


def _ladder(bound: float, current: int) -> int | None:
    """The largest GROWTH_LADDER value <= bound (MIN_GROWTH_STEPS at least), if below current."""
    fits = [g for g in GROWTH_LADDER if g <= bound]
    g = max(fits) if fits else MIN_GROWTH_STEPS
    g = max(g, MIN_GROWTH_STEPS)
    return g if g < current else None


def _advise(run: Run) -> Advice:
    initial, growth = growth_facts(run)
    adv = Advice(run_initial=initial, run_growth=growth)
    adv.probes = probes = float16_probes(run)
    if not probes:
        return adv
    adv.overflows = overflows(run)
    adv.latest = lt = probes[-1]
    used_k = lt.used_log2
    if lt.measured < UNDERFLOW_MATERIAL:
        adv.kind = "silent"
        adv.lines.append(
            f"underflow at the scale used ({scale_text(lt.scale)}, probe at step {lt.step}) is "
            f"{_pct(lt.measured)}, below {_pct(UNDERFLOW_MATERIAL)}: the scale is not the problem"
            + (
                f" (leaving out the id-rounded {', '.join(map(repr, lt.excluded))})"
                if lt.excluded
                else ""
            )  # fmt: skip
        )
        return adv
    # predicted underflow at the scale used (at the next power of two up when it is not one: a
    # lower bound, so that a gain is never overstated)
    pred_used = lt.under(math.ceil(used_k))
    ov_scales = [o.scale for o in adv.overflows if o.scale is not None]
    later = [o.scale for o in adv.overflows if o.scale is not None and not o.at_start]
    # strictly below a scale that overflowed: the largest power of two under it
    later_cap = math.ceil(math.log2(min(later))) - 1 if later else math.inf
    all_cap = math.ceil(math.log2(min(ov_scales))) - 1 if ov_scales else math.inf
    lt_cap = max_k(lt) if max_k(lt) is not None else -math.inf
    cands = [k for k in lt.predicted_ks() if used_k < k <= min(lt_cap, later_cap)]
    cands = [k for k in cands if lt.under(k) is not None]
    target = None
    if cands and pred_used:
        good = [k for k in cands if lt.under(k) <= UNDERFLOW_NEGLIGIBLE]
        t = min(good) if good else max(cands)
        if lt.under(t) <= pred_used - UNDERFLOW_MATERIAL:
            target = t
    if target is not None:
        adv.target = 2.0**target
        _propose(adv, target, pred_used, all_cap, later_cap)
        if adv.changes_scale:
            adv.kind = "change"
    # the best scale allowed (the largest: predicted underflow never rises with the scale)
    best_k = max(cands) if cands else None
    best_under = lt.under(best_k) if best_k is not None else pred_used
    adv.best_under = best_under
    adv.span = lt.span_log2
    if best_under is not None and best_under >= UNDERFLOW_MATERIAL:
        adv.kind = "range"  # the histogram is wider than float16's window
    elif target is None and pred_used is not None and pred_used < UNDERFLOW_MATERIAL:
        adv.kind = "unpredicted"  # lost in the backward pass, not in the final values
    if adv.kind == "none":
        adv.kind = "stays"
    if adv.kind in ("range", "unpredicted"):
        adv.layers = underflowing_layers(run, lt.layers)
        adv.keep_code = layers_code([n for n, _ in adv.layers], run)
        adv.layers_leave = underflow_without(lt.layers, [n for n, _ in adv.layers])
        adv.bfloat16 = bfloat16_device(run)
    _evidence(adv, pred_used, best_k, later_cap)
    return adv


def _propose(adv: Advice, target: int, pred_used: float, all_cap: float, later_cap: float) -> None:
    """initial_scale and dynamic_growth_steps toward ``2**target`` (see the module doc)."""
    lt = adv.latest
    assert lt is not None
    used_k = lt.used_log2
    # initial_scale: what every probe allows (the start's gradients are the earliest probe's), and
    # below every scale that overflowed in the run
    caps = [max_k(p) for p in adv.probes]
    if None not in caps:
        ik = min(target, all_cap, *caps)
        if ik > used_k and 2.0**ik > adv.run_initial and lt.under(ik) < pred_used:
            adv.initial_scale = 2.0**ik
    # growth: from where the scale starts, one doubling per G finite steps must reach each
    # probe's need by that probe's step: G <= (step - t0) / (need - l0)
    if adv.initial_scale is not None:
        # taken to hold: should the start's gradients bring it down, the run's next diagnosis
        # sees those overflows (they bar the initial scale, and this bound uses the descent)
        l0, t0 = math.log2(adv.initial_scale), 0
    else:
        start = [o for o in adv.overflows if o.at_start and o.scale is not None]
        if start:  # where the descent at the start left it
            l0, t0 = math.log2(start[-1].scale / 2.0), start[-1].step
        else:
            l0, t0 = math.log2(adv.run_initial), 0
    bounds = []
    needs = []  # (step, need) of every probe, each within what it allows
    for p in adv.probes:
        n = need_k(p, min(max_k(p) if max_k(p) is not None else -math.inf, later_cap))
        if p is lt:
            n = target if n is None else min(n, target)
        if n is None:
            continue
        needs.append((p.step, n))
        if p.step > t0 and n > l0:
            bounds.append((p.step - t0) / (n - l0))
    # the need rising over the probes faster than one doubling per G steps: the least-squares
    # slope of need against step (at least two probes, a rise of two doublings or more, so that a
    # one-doubling wobble between close probes is not taken for a trend)
    if len(needs) >= 2 and needs[-1][1] - needs[0][1] >= 2:
        t = np.asarray([a for a, _ in needs], np.float64)
        n = np.asarray([b for _, b in needs], np.float64)
        if np.ptp(t) > 0:
            slope = float(np.polyfit(t, n, 1)[0])
            if slope > 0:
                bounds.append(1.0 / slope)
    if bounds:
        adv.growth_steps = _ladder(min(bounds), adv.run_growth)


def _evidence(adv: Advice, pred_used: float | None, best_k: int | None, later_cap: float) -> None:
    lt = adv.latest
    assert lt is not None
    L = adv.lines
    L.append(
        f"probe at step {lt.step}: {_pct(lt.measured)} of the reference's nonzero gradient values "
        f"are zero in float16 at the scale used, {scale_text(lt.scale)}"
        + (f" (the sweep predicts {_pct(pred_used)})" if pred_used is not None else "")
        + (
            f", leaving out {', '.join(repr(n) for n in lt.excluded)}: fed integer ids a float16 "
            "cast rounds (id-rounding), its gradient lands on other rows"
            if lt.excluded
            else ""
        )
    )
    ovs = [o for o in adv.overflows if o.scale is not None]
    if ovs:
        top = max(ovs, key=lambda o: (o.scale, -o.step))
        start = [o for o in ovs if o.at_start]
        later = [o for o in ovs if not o.at_start]
        s = f"{sum(o.count for o in adv.overflows)} skipped steps"
        if start:
            s += (
                f": {len(start)} in the first {START_STEPS} (steps {start[0].step}-"
                f"{start[-1].step}, scales {scale_text(start[0].scale)} down to "
                f"{scale_text(start[-1].scale)})"
            )
        if later:
            lo = min(later, key=lambda o: o.scale)
            s += (
                f"{';' if start else ':'} {len(later)} after them, the lowest at "
                f"{scale_text(lo.scale)} (step {lo.step})"
            )
        s += f"; the largest scale that overflowed: {scale_text(top.scale)} at step {top.step}"
        L.append(s)
    else:
        L.append("no skipped step: no scale the run used overflowed")
    L.append(
        f"the run's LossScaleOptimizer: initial_scale={number_code(adv.run_initial)}, "
        f"dynamic_growth_steps={adv.run_growth} (halves on overflow, doubles after "
        f"{adv.run_growth} finite steps)"
    )
    if len(adv.probes) > 1:
        needs = []
        for p in adv.probes:
            n = need_k(p, max_k(p) if max_k(p) is not None else -math.inf)
            needs.append(f"step {p.step}: {scale_text(2.0**n) if n is not None else 'none fits'}")
        L.append(
            "scale with predicted underflow <= "
            f"{_pct(UNDERFLOW_NEGLIGIBLE)} at each probe (within its margin): " + ", ".join(needs)
        )
    for r in adv.predicted_rows():
        if r["what"] == "used" or r["underflow"] is None:
            continue
        L.append(
            f"predicted at {scale_text(r['scale'])} ({r['what']}): underflow "
            f"{_pct(r['underflow'])}, overflow {_pct(r['overflow'])} at step {r['probe_step']}; "
            f"at most {_pct(r['max_overflow_any_probe'] or 0.0)} overflow in any of the "
            f"{len(adv.probes)} probes"
        )
    if adv.kind == "range":
        sp = adv.span
        if sp is not None:
            L.append(
                f"the reference gradients span 2^{sp[0]}..2^{sp[1]} ({sp[1] - sp[0]} doublings); "
                f"float16 holds {WINDOW_BITS} (2^-24..65504)"
            )
        if best_k is not None:
            L.append(
                f"the best scale allowed, {scale_text(2.0**best_k)}, still loses "
                f"{_pct(adv.best_under or 0.0)} (predicted)"
            )
        elif math.isfinite(later_cap) and later_cap <= lt.used_log2:
            L.append("a larger scale overflowed later in the run")
        free = [k for k, (_u, o) in lt.sweep.items() if o == 0]
        top = max(free) if free else None
        if top is not None and top > max(best_k if best_k is not None else -math.inf,
                                         lt.used_log2):  # fmt: skip
            L.append(
                f"even {scale_text(2.0**top)}, the largest at which the sweep predicts no overflow "
                f"on this batch (no margin kept), would lose {_pct(lt.under(top) or 0.0)}"
            )
        if adv.layers:
            least = min(u for _, u in adv.layers)
            over = LAYER_UNDERFLOW_WARN if least > LAYER_UNDERFLOW_WARN else UNDERFLOW_MATERIAL
            L.append(
                f"layers losing more than {_pct(over)} at {scale_text(lt.scale)}: "
                + names_text(adv.layers)
            )
            if adv.layers_leave is not None:
                L.append(
                    f"with them in float32 the probe's per-layer counts leave about "
                    f"{_pct(adv.layers_leave)} model-wide (if the gradient reaching them is "
                    "intact)"
                )
