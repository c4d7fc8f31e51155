"""Rule `budget`: optional recording that mpwatch's cost budget skipped.

## What it finds
The probe, its fix checks (a probe that ran re-runs its pass under each candidate fix, asking the
budget before each pass: the checks stop at the first that does not fit) or the profile that did
not run because its estimated cost did not fit mpwatch's cost
budget (the `budget` record of each fit: `MixedPrecisionMonitor(budget=0.05)` keeps mpwatch's
own time within 5% of the fit's wall time), with how often it was skipped, its estimate, what was
left of the budget, and mpwatch's own share of the fit. A probe that ran beyond the budget because
the training was broken (the loss scale at 1 or below; without a loss scale, the loss Keras
reports not finite: one probe a fit, the one that names the cause) is said too, with why.

On JAX with the gradient counts in a program of their own (a GPU:
`mpwatch.record.tap.jax_programs`),
the count steps a fit ran without them while that program compiled beside training are said too:
the gradient-health and lost-update records start after them.

## Why it matters
What did not run cannot be judged: without a probe there is no float32 reference, so nothing is
said of gradient underflow, the loss scale the gradients need, the layers to keep in float32 or
the fixes checked on the batch; without a profile nothing is said of time by dtype or Tensor
Cores. A short fit is where this happens (the fixed costs of a probe, its trace, do not shrink
with the fit): the silence of those findings is not a clean bill of health. Fix checks stopped
part way leave the fixes past that point unchecked: the findings that give them say so, and
none reads a fix that was not reached as one that does not work.

## Threshold
Any skipped decision on the probe, its fix checks, the profile or the gradient counts: info. A
profile whose conversion was only deferred is no finding (the trace is in the logdir and is
converted when the run is read). A ``needed`` decision (a probe beyond the budget for a broken
training): info.

## Example evidence
```text
the probe was skipped at 2 of 2 chances (steps 20, 40): estimated 0.67 s each, 0.00 s of the
budget left (5% of this 1.00 s fit); mpwatch's own recording took 0.26 s (26%)
```

## Fix
Ask for it explicitly, which runs whatever it costs: `MixedPrecisionMonitor(log_dir,
probe_every=N)` (a probe every N steps and at each epoch's end) or `profile=True`; or give mpwatch
a larger share (the finding names the share that would have fit, `budget=0.3`), or `budget=None`
(no budget); or train longer.

## References
- `mpwatch.record.runtime.budget`: the ledger, the estimates and the decisions
- `mpwatch.contract`: the `budget` record
"""

from __future__ import annotations

import math
from typing import Any

from mpwatch.contract.budget import COUNTS_TOO_SHORT, MEMORY_SKIP
from mpwatch.judge.finding import Finding
from mpwatch.judge.rule import Rule, fmt, pct
from mpwatch.read.run import Run

RULE = Rule(
    id="budget",
    title="Optional recording skipped by mpwatch's cost budget",
    severities=("info",),
    doc=__doc__,
    thresholds={},
)

#: part -> (what it is, what is missing without it, the explicit setting that gets it)
PARTS = {
    "probe": (
        "the float32-reference probe",
        "no finding on gradient underflow, the loss scale the gradients need, layers to keep "
        "in float32 or fixes checked on the batch rests on a probe of this run",
        "probe_every=N",
    ),
    "fix_checks": (
        "the probe's fix checks",
        "the fixes shown are checked only as far as the checks ran (each finding's evidence "
        "says where they stopped): a fix past that point is advice not checked on the batch",
        "probe_every=N",
    ),
    "profile": (
        "the profiler trace",
        "no finding on time by dtype, casts or Tensor Cores rests on a profile of this run",
        "profile=True",
    ),
}


def _steps(decisions: list[dict[str, Any]]) -> str:
    steps = [str(d.get("step")) for d in decisions]
    return ", ".join(steps[:8]) + (" ..." if len(steps) > 8 else "")


def _seconds(x: Any) -> str:
    return f"{fmt(float(x))} s" if isinstance(x, (int, float)) else "n/a"


def _larger_budget(budget: dict[str, Any], estimate: float) -> str | None:
    """The budget share that would have let the cheapest skipped run fit (mpwatch's own time so
    far plus its estimate, over the fit's time), rounded up to 2 digits; None when it is 1 or
    more (no share fits it: ask explicitly)."""
    fit, own = budget.get("fit_seconds"), budget.get("own_seconds")
    if not isinstance(fit, (int, float)) or not isinstance(own, (int, float)) or fit <= 0:
        return None
    need = (own + estimate) / fit
    if need >= 1.0:
        return None
    return f"{math.ceil(need * 100) / 100:g}"


def _needed_words(needed: list[dict[str, Any]]) -> str:
    d = needed[-1]
    cost = d.get("cost_s")
    took = f" ({_seconds(float(cost))})" if isinstance(cost, (int, float)) else ""
    return f"it ran beyond the budget at step {_steps(needed)}{took}: {d.get('reason')}"


def _needed_finding(what: str, needed: list[dict[str, Any]]) -> Finding:
    """A part that did not fit the budget and ran because the training looked broken (the loss
    scale at 1 or below; without one, the loss Keras reports not finite): said, since mpwatch's
    share of the fit is then above its budget."""
    name = what[0].upper() + what[1:]
    why = str(needed[-1].get("reason") or "the training looked broken").split(":")[0]
    return RULE.finding(
        "info",
        f"{name} ran beyond mpwatch's cost budget: {why}",
        _needed_words(needed),
        fix="# nothing to change: a broken training gets one probe a fit, whatever it costs",
        data={"part": "probe", "needed": len(needed), "reason": needed[-1].get("reason")},
    )


def _counts_finding(decisions: list[dict[str, Any]]) -> Finding | None:
    """The count steps that ran without gradient counts while their program compiled (JAX, the
    counts in a program of their own), over the run's fits."""
    missed = sum(int((d.get("detail") or {}).get("missed") or 0) for d in decisions)
    chances = sum(int((d.get("detail") or {}).get("count_steps") or 0) for d in decisions)
    if not missed:
        return None
    steps = [s for d in decisions for s in (d.get("detail") or {}).get("steps") or []]
    shown = ", ".join(str(s) for s in steps[:8]) + (" ..." if missed > 8 else "")
    ran = max(0, chances - missed)
    reason = str(decisions[-1].get("reason") or "")
    if ran:
        title = (
            f"The gradient counts started late: {missed} of {chances} count steps ran without them"
        )
    elif reason.startswith(COUNTS_TOO_SHORT):
        title = f"No gradient counts: {COUNTS_TOO_SHORT}"
    else:
        s = "s" if missed != 1 else ""
        title = f"No gradient counts: the {missed} count step{s} ran before their program was ready"
    evidence = (
        f"count steps without the counts: {shown}; {reason}. The counts "
        "run in a program of their own, compiled on a thread beside training so the steps "
        "between them carry none of their cost; no finding on the gradients' range (underflow, "
        "headroom) or lost updates rests on those steps"
    )
    return RULE.finding(
        "info",
        title,
        evidence,
        fix="# nothing to change: a longer fit gets them once their program has compiled "
        "(later fits of the model reuse it)",
        data={"part": "gradient_counts", "skipped": missed, "chances": chances, "ran": ran},
    )


def _memory_finding(skipped: list[dict[str, Any]]) -> Finding:
    """Probes skipped because the device's free memory could not hold them."""
    why = str(skipped[-1].get("reason") or "")[len(MEMORY_SKIP) :].strip()
    return RULE.finding(
        "warning",
        f"The float32-reference probe did not run at {len(skipped)} step(s): it would not fit "
        "the device's free memory",
        f"skipped at steps {_steps(skipped)} so the fit would not run out of memory; last: {why}. "
        "The findings that rest on the probe (underflow, overflow, the recommended scale) are "
        "missing for those steps",
        fix="MixedPrecisionMonitor(log_dir, probe_data=(x[:n], y[:n]))  # a smaller probe batch\n"
        "# or leave more of the device free (a smaller training batch)",
        data={"part": "probe", "memory_skipped": len(skipped), "reason": why},
    )


def check(run: Run) -> list[Finding]:
    """One info finding per optional part the budget skipped in any fit of the run."""
    budgets = [b for b in run.budgets if isinstance(b, dict)]
    every = [(b, d) for b in budgets for d in b.get("decisions") or [] if isinstance(d, dict)]
    out: list[Finding] = []
    found = _counts_finding([d for _, d in every if d.get("part") == "gradient_counts"])
    if found is not None:
        out.append(found)
    memory = [d for _, d in every if str(d.get("reason") or "").startswith(MEMORY_SKIP)]
    if memory:
        out.append(_memory_finding(memory))
    every = [(b, d) for b, d in every if not any(d is m for m in memory)]
    for part, (what, missing, setting) in PARTS.items():
        mine = [(b, d) for b, d in every if d.get("part") == part]
        skipped = [(b, d) for b, d in mine if d.get("action") == "skipped"]
        needed = [d for _, d in mine if d.get("action") == "needed"]
        if needed and not skipped:
            out.append(_needed_finding(what, needed))
        if not skipped:
            continue
        ran = len(mine) - len(skipped)
        b, d = skipped[-1]
        fraction = b.get("fraction")
        share = pct(fraction) if isinstance(fraction, (int, float)) else "n/a"
        fit, own = b.get("fit_seconds"), b.get("own_seconds")
        costs = [float(x.get("estimate_s") or 0.0) for _, x in skipped]
        lo, hi = _seconds(min(costs)), _seconds(max(costs))
        estimate = f"{lo} each" if lo == hi else f"{lo} to {hi}"
        left = _seconds(max(0.0, float(d.get("allowance_s") or 0.0)))
        evidence = (
            f"{what} {'were' if what.endswith('s') else 'was'} skipped at {len(skipped)} of "
            f"{len(mine)} chances (steps "
            f"{_steps([x for _, x in skipped])}): estimated {estimate}, {left} of the budget "
            f"left ({share} of this {_seconds(fit)} fit)"
        )
        if isinstance(own, (int, float)) and isinstance(fit, (int, float)) and fit > 0:
            evidence += f"; mpwatch's own recording took {_seconds(own)} ({pct(own / fit)})"
        name = what[0].upper() + what[1:]
        larger = _larger_budget(b, min(costs))
        if needed:
            evidence += "; " + _needed_words(needed)
        if ran:
            title = f"{name} ran at {ran} of {len(mine)} chances: the rest did not fit the budget"
        else:
            title = (
                f"{name} did not run to their end: they did not fit mpwatch's cost budget "
                f"({share} of the fit)"
                if part == "fix_checks"
                else f"{name} did not run: it did not fit mpwatch's cost budget ({share} of "
                "the fit)"
            )
            evidence += f"; {missing}"
        out.append(
            RULE.finding(
                "info",
                title,
                evidence,
                fix=(
                    f"MixedPrecisionMonitor(log_dir, {setting})  # runs whatever it costs\n"
                    + (
                        f"# or: MixedPrecisionMonitor(log_dir, budget={larger})  # the share "
                        "that fits; budget=None: no budget; or train longer"
                        if larger
                        else "# or: MixedPrecisionMonitor(log_dir, budget=None)  # no budget; "
                        "or train longer"
                    )
                ),
                data={
                    "part": part,
                    "skipped": len(skipped),
                    "chances": len(mine),
                    "ran": ran,
                    "estimate_s": d.get("estimate_s"),
                    "allowance_s": d.get("allowance_s"),
                    "fraction": fraction,
                },
            )
        )
    return out
