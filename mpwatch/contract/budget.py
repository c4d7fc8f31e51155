"""The ``budget`` record: mpwatch's own time in a fit, and what its cost budget ran or skipped."""

from __future__ import annotations

from mpwatch.contract import schema as s
from mpwatch.contract.tags import KIND_BUDGET

#: what a decision did with a piece of optional work
BUDGET_ACTIONS = ["ran", "skipped", "deferred", "explicit", "needed"]
#: the optional work the budget decides on
#: (fix_checks: the passes of a probe's fix checks, asked for one by one inside a probe that ran;
#: one decision per probe that wanted them: ran, or skipped from the first pass that did not fit;
#: gradient_counts: on JAX with the counts in a program of their own, the count steps a fit ran
#: without them while that program compiled beside training, one decision a fit, its detail the
#: steps: record/tap/jax_programs.py)
BUDGET_PARTS = ["probe", "fix_checks", "profile", "profile_conversion", "gradient_counts"]
#: how a gradient_counts decision's reason starts when the fit was too short to compile the
#: counts' program beside it (it never started)
COUNTS_TOO_SHORT = "the fit was too short to compile their program beside it"
#: the opening of a skipped probe's reason where the device's free memory could not hold it
#: (record/probe/probe_memory.py; the rule ``budget`` names it apart from the cost budget's skips)
MEMORY_SKIP = "memory:"

_DECISION = s._obj(
    {
        "step": s._int("the batch step of the decision"),
        "part": s._enum(BUDGET_PARTS, "the optional work"),
        "action": s._enum(
            BUDGET_ACTIONS,
            "ran: it fit the budget; skipped: it did not; deferred: it did not and is done when "
            "the run is read (the profile's conversion); explicit: the user asked for it, it ran "
            "whatever it cost; needed: it did not fit, and ran because the training was broken "
            "(its loss scale at 1 or below; without one, its loss not finite) and it finds the "
            "cause",
        ),
        "estimate_s": s._num("its cost estimated before it ran, seconds"),
        "allowance_s": s._num("what the budget had left then, seconds (None: no budget)", True),
        "cost_s": s._num("what it really cost, seconds (None: it did not run)", True),
        "reason": s._str("why, in words"),
        "detail": s._t(
            "object",
            "facts of the decision (the profiled steps, the trace's MB; gradient_counts: steps, "
            "the count steps run without counts, at most 50; missed, how many; count_steps, the "
            "fit's count steps; compile_s, their program's compile, None: not done)",
        ),
    },
    "one decision on optional work",
)

#: the ``budget`` record's payload schema
SCHEMA = s._record_schema(
    KIND_BUDGET,
    "mpwatch's own cost in one fit and the cost budget's decisions (record/runtime/budget.py), "
    "written when the fit ends.",
    {
        "fraction": s._num("the budget: the share of the fit's wall time (None: none)", True),
        "fit_seconds": s._num("the fit's wall time, on_train_begin to on_train_end"),
        "own_seconds": s._num("mpwatch's own host time in its hooks during the fit"),
        "own_share": s._num("own_seconds / fit_seconds", True),
        "first_step_seconds": s._num("the fit's first Keras call (its trace), mpwatch's out", True),
        "step_seconds": s._num("the fit's steady time per step, mpwatch's own out", True),
        "steps": s._int("batch steps in the fit"),
        "spent": s._t("object", "seconds per mpwatch part", additionalProperties=s._num()),
        "explicit": s._t("object", "the user's explicit settings that override the budget"),
        "decisions": s._t("array", "every decision, in order", items=_DECISION),
    },
    ["fraction", "fit_seconds", "own_seconds", "spent", "decisions"],
)
