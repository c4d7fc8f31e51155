"""CostBudget: mpwatch's own time against the fit's, and the optional work it may still do.

``MixedPrecisionMonitor(budget=0.05)`` (the default) keeps mpwatch's own wall time within that share
of the fit's. The ledger counts, per part, the host time of every mpwatch hook (the tap's reads,
the writes, the probe's trace and passes, the profiler's start, stop and conversion) between
``on_train_begin`` and ``on_train_end``; the fit's time is its wall time so far plus the steps
still to come at the fit's steady step time (Keras' ``params``: epochs x steps per epoch; a fit of
unknown length counts only the time so far). What optional work may still spend
(:meth:`CostBudget.allowance`) is the budget's share of that, less mpwatch's own time so far and
what its recurring parts (the tap's reads, the writes) will cost the steps still to come at their
rate so far. Before each piece of *optional* work it is asked (:meth:`CostBudget.decide`) with
an estimate of that work's cost:

- the probe (``probe``): the first probe traces its functions, so it is estimated from the fit's
  own first step (Keras' trace of the train step: :data:`PROBE_TRACE_FACTOR` of it; in a later fit
  of a model whose trace Keras reuses, the first step of the model's first monitored fit,
  :attr:`CostBudget.trace_seconds`) plus :data:`PROBE_PASS_STEPS` steady steps, less a trace
  already paid ahead (JAX); the second probe by the first one's measured cost less that trace,
  later probes by the last probe's measured cost;
- the probe's fix checks (``fix_checks``), inside a probe that ran: each pass asked for as it
  comes, against what was left at the probe's decision less what the probe has spent since
  (:class:`mpwatch.record.probe.fix_gate.FixGate`; one decision a probe, kept with :meth:`record`);
- the profile capture (``profile``): :data:`PROFILE_STEPS_COST` steady steps per profiled step
  (the tracer's slowdown) plus the profiler's start and stop (:data:`PROFILE_FIXED_S`, by
  backend);
- its conversion (``profile_conversion``): by the size of the trace it wrote
  (:data:`CONVERT_S_PER_MB`); conversion that does not fit is *deferred*, not lost: the trace
  stays in the logdir and ``mpwatch.load_run``, ``mpwatch diagnose`` and the tab convert it when
  they first read the run (joined to the run's ``layers`` record, cached outside the logdir).

Work that fits runs and is charged what it really cost (measured, not estimated); work that does
not is skipped (or deferred) and says so: each decision is kept, with its estimate and the
allowance left, in the ``budget`` record (``contract.KIND_BUDGET``) written when the fit ends,
and the diagnosis (rule ``budget``) names what was skipped and how to get it. An explicit user
setting always wins: ``probe_every=N`` probes every N steps whatever it costs, ``profile=True``
(or a batch range) captures and converts; those decisions are kept as ``explicit``.
``budget=None`` switches the budget off (everything at its defaults runs, as before issue 27).

What the ledger does not see: the tap's ops inside Keras' traced train step (their trace is part of
Keras' first step; their per-step cost is in the step time, measured by
``benchmarks/real_models.py``), and work on other threads.

Example:
    >>> b = CostBudget(0.05)
    >>> b.begin_fit({"epochs": 1, "steps": 100}, now=0.0)
    >>> for i in range(1, 4):
    ...     b.batch_end(1, now=float(i))  # 1 s a step (the first includes Keras' trace)
    >>> round(b.projected_fit_seconds(now=3.0), 1)
    100.0
    >>> b.decide("probe", 3, estimate=10.0, now=3.0)  # 5% of 100 s is 5 s: a 10 s probe waits
    False
    >>> b.decide("probe", 3, estimate=2.0, now=3.0)
    True
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "BUDGET_ENV",
    "CONVERT_S_PER_MB",
    "CostBudget",
    "DEFAULT_BUDGET",
    "Decision",
    "PROBE_PASS_STEPS",
    "PROBE_TRACE_FACTOR",
    "PROFILE_FIXED_S",
    "PROFILE_STEPS_COST",
    "check_budget",
    "default_budget",
]

#: the default share of the fit's wall time mpwatch may spend on itself
DEFAULT_BUDGET = 0.05
#: the first probe traces (and on JAX compiles) a forward and backward pass in two policies and a
#: forward check, and where its activations come near the 16-bit maximum checks its fixes (more
#: passes to trace): up to twice Keras' own first step (measured on a CPU, MobileNetV2, its
#: first probe less its passes and float8 readiness: TensorFlow 1.2-2.1x, in a bare process and
#: in 300 s fits; JAX 1.0x, and 2.1x with its fix checks' 20 s; EfficientNetB0 and the
#: Transformer of benchmarks/real_models.py earlier: 0.6-1.4x)
PROBE_TRACE_FACTOR = 2.0
#: a probe's passes, in steady training steps (two forward-backward passes and a forward pass)
PROBE_PASS_STEPS = 3.0
#: the profiler's start and stop, seconds, by Keras backend (measured on a CPU: TensorFlow's
#: 0.06-0.13 s for MobileNetV2; JAX's 1.3-1.6 s for MobileNetV2, 3.6 s for keras.io's small
#: Transformer; the larger, rounded up)
PROFILE_FIXED_S = {"tensorflow": 0.3, "jax": 4.0}
#: a profiled step costs this many steady steps (the tracer records every op)
PROFILE_STEPS_COST = 1.5
#: converting a trace, seconds per MB of trace files (xprof's converter, the trace's decode and
#: the HLO join, on a CPU: 0.1-0.4 s/MB measured without the model's layers, 0.2-0.45 s/MB in a
#: JAX fit with them, since protobuf decodes the trace; the larger, rounded up)
CONVERT_S_PER_MB = 0.5

#: the steady step time is the median of the last this many Keras calls
STEP_WINDOW = 50

OPTIONAL = ("probe", "profile", "profile_conversion")
ACTIONS = ("ran", "skipped", "deferred", "explicit", "needed")


#: the environment variable that sets the default budget: a share ("0.2") or "off"
BUDGET_ENV = "MPWATCH_BUDGET"


def default_budget() -> float | None:
    """The budget a monitor gets when none is passed: ``$MPWATCH_BUDGET`` (a share, or ``off``)
    when set, else :data:`DEFAULT_BUDGET`. A bad value is a ValueError naming the variable."""
    import os

    raw = os.environ.get(BUDGET_ENV, "").strip()
    if not raw:
        return DEFAULT_BUDGET
    if raw.lower() in ("off", "none"):
        return None
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not (0.0 < value <= 1.0):
        raise ValueError(f"mpwatch: ${BUDGET_ENV} must be a share in (0, 1] or 'off', not {raw!r}")
    return value


def check_budget(budget: Any) -> float | None:
    """``budget`` as a share of the fit's time in (0, 1], or None (no budget); else ValueError.

    >>> check_budget(0.05), check_budget(None), check_budget(1)
    (0.05, None, 1.0)
    """
    if budget is None:
        return None
    if isinstance(budget, bool) or not isinstance(budget, (int, float)):
        raise ValueError(f"mpwatch: budget must be a share of the fit's time, got {budget!r}")
    value = float(budget)
    if not (0.0 < value <= 1.0) or math.isnan(value):
        raise ValueError(
            f"mpwatch: budget must be in (0, 1] (0.05: 5% of the fit's time), or None for no "
            f"budget; got {budget!r}"
        )
    return value


@dataclass
class Decision:
    """One decision: at batch ``step``, ``part`` was ``action`` (ran, skipped, deferred, or
    explicit: the user asked for it); ``estimate_s`` its estimated cost, ``allowance_s`` what the
    budget had left then, ``cost_s`` what it really cost (None when it did not run)."""

    step: int
    part: str
    action: str
    estimate_s: float
    allowance_s: float | None
    cost_s: float | None = None
    reason: str = ""
    detail: dict[str, Any] = field(default_factory=dict)


class CostBudget:
    """mpwatch's own time against the fit's wall time, and the decisions on optional work.

    Args:
        fraction: the share of the fit's wall time mpwatch may spend (0.05: 5%); None: no budget
            (every decision runs, and is still recorded with its cost).
    """

    def __init__(self, fraction: float | None = DEFAULT_BUDGET) -> None:
        self.fraction = check_budget(fraction)
        self.spent: dict[str, float] = {}
        self.decisions: list[Decision] = []
        self.costs: dict[str, list[float]] = {}  # part -> measured costs of its runs
        self._t0: float | None = None
        # (wall clock, own seconds) at the last batch ends: the steady step time's window (a
        # long fit keeps no per-step list)
        self._recent: deque[tuple[float, float]] = deque(maxlen=STEP_WINDOW + 1)
        # the device's time per step, from when each call's results were ready (Keras' worker
        # thread notes it): the host's clock alone reads the dispatch when it runs ahead
        self._done: deque[float] = deque(maxlen=STEP_WINDOW)
        self._first_step: float | None = None  # the first Keras call, mpwatch's own time out
        # (steps, recurring own seconds) at the first call's end: the recurring parts' rate is
        # counted from there (what on_train_begin did once is not a rate)
        self._recurring_from: tuple[int, float] | None = None
        self._calls = 0
        self._steps_done = 0
        self._total_steps: int | None = None
        self._fit_end: float | None = None
        # Keras' first call of the model's first monitored fit (its trace of the train step),
        # set by MixedPrecisionMonitor: a later fit of the same model reuses that trace and
        # starts fast, but a new monitor's probe still traces its passes as much as then
        self.trace_seconds: float | None = None

    # --- the fit's clock --------------------------------------------------------------------
    def begin_fit(self, params: dict[str, Any] | None, now: float | None = None) -> None:
        """A fit starts (``on_train_begin``): its clock, and its length from Keras' params."""
        self._t0 = time.perf_counter() if now is None else now
        self.spent, self.decisions = {}, []
        self._recent.clear()
        self._done.clear()
        self._first_step, self._calls = None, 0
        self._recurring_from = None
        self._steps_done, self._fit_end = 0, None
        params = params or {}
        epochs, steps = params.get("epochs"), params.get("steps")
        ok = all(isinstance(v, int) and v > 0 for v in (epochs, steps))
        self._total_steps = int(epochs) * int(steps) if ok else None

    def batch_end(self, n_steps: int, now: float | None = None) -> None:
        """``n_steps`` batches ran (one Keras call)."""
        self._steps_done += max(1, int(n_steps))
        end, own = (time.perf_counter() if now is None else now), self.own_seconds()
        if self._calls == 0:
            if self._t0 is not None:
                self._first_step = max(0.0, end - self._t0 - own)
            self._recurring_from = (self._steps_done, self.recurring_seconds())
        self._calls += 1
        self._recent.append((end, own))

    def call_done(self, seconds: float, n_steps: int) -> None:
        """A call's results were ready ``seconds`` after the previous call's (Keras' worker
        thread's clock; not the fit's first call): the step time the device keeps up."""
        self._done.append(max(0.0, float(seconds)) / max(1, int(n_steps)))

    def end_fit(self, now: float | None = None) -> None:
        self._fit_end = time.perf_counter() if now is None else now

    @contextlib.contextmanager
    def spend(self, part: str) -> Iterator[None]:
        """Charge the block's wall time to ``part``."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.charge(part, time.perf_counter() - t0)

    def charge(self, part: str, seconds: float) -> None:
        self.spent[part] = self.spent.get(part, 0.0) + max(0.0, float(seconds))

    def own_seconds(self) -> float:
        return sum(self.spent.values())

    def recurring_seconds(self) -> float:
        """mpwatch's own seconds outside the optional parts: the tap's reads, the records'
        writes, the monitor's bookkeeping (they run on every fit, budget or not)."""
        return sum(v for k, v in self.spent.items() if k not in OPTIONAL)

    def recurring_step_seconds(self) -> float | None:
        """The recurring parts' own seconds per step since the fit's first call (None before
        the second): what each step still to come will cost mpwatch whatever it decides."""
        if self._recurring_from is None:
            return None
        steps0, spent0 = self._recurring_from  # (no step since: before the second call)
        steps = self._steps_done - steps0
        return max(0.0, self.recurring_seconds() - spent0) / steps if steps > 0 else None

    def elapsed(self, now: float | None = None) -> float:
        if self._t0 is None:
            return 0.0
        end = self._fit_end
        if end is None:
            end = time.perf_counter() if now is None else now
        return max(0.0, end - self._t0)

    @property
    def total_steps(self) -> int | None:
        """The fit's batch steps from Keras' params (None: its length is not known)."""
        return self._total_steps

    def first_step_seconds(self) -> float | None:
        """The fit's first Keras call, mpwatch's own time taken out (Keras' trace of the step)."""
        return self._first_step

    def step_seconds(self) -> float | None:
        """The fit's steady time per step: the median of its calls after the first, mpwatch's own
        time taken out (None before the second call); when Keras' worker thread notes the calls'
        results (:meth:`call_done`), at least the median time between them."""
        if self._calls < 2:
            return None
        recent = list(self._recent)
        per = [max(0.0, (e1 - e0) - (o1 - o0)) for (e0, o0), (e1, o1) in zip(recent, recent[1:])]
        n = self._steps_done / self._calls  # steps per call (steps_per_execution)
        host = statistics.median(per) / max(1.0, n)
        # the host may dispatch ahead of the device (batch ends on Keras' worker thread): then
        # the calls' results, as they came, say the step's time
        return max(host, statistics.median(self._done)) if self._done else host

    def projected_fit_seconds(self, now: float | None = None) -> float:
        """The fit's wall time: so far, plus the steps to come at the steady step time (only so
        far when the fit's length or its step time is not known yet)."""
        so_far = self.elapsed(now)
        step = self.step_seconds()
        if self._total_steps is None or step is None:
            return so_far
        return so_far + max(0, self._total_steps - self._steps_done) * step

    def allowance(self, now: float | None = None) -> float | None:
        """Seconds mpwatch may still spend on optional work in this fit (None without a
        budget): its share of the projected fit, less what it spent so far and what its
        recurring parts will cost the steps still to come (at their rate so far)."""
        if self.fraction is None:
            return None
        left = self.fraction * self.projected_fit_seconds(now) - self.own_seconds()
        rate = self.recurring_step_seconds()
        if rate is not None and self._total_steps is not None:
            left -= rate * max(0, self._total_steps - self._steps_done)
        return left

    # --- estimates -------------------------------------------------------------------------
    def estimate(self, part: str, **facts: float) -> float:
        """The cost of ``part`` before it runs, from what this fit measured (see the module)."""
        step = self.step_seconds() or self.first_step_seconds() or 0.0
        done = self.costs.get(part) or []
        if part == "probe":
            # its trace: none when compiled ahead beside training, else less what was traced
            # ahead and paid then
            trace = 0.0 if facts.get("ahead") else self._probe_trace(facts.get("traced", 0.0))
            if len(done) > 1:  # the trace is paid: a later probe costs what the last one did
                return done[-1]
            if done:  # the first probe's real cost, less the trace it was estimated to pay
                return max(done[-1] - trace, PROBE_PASS_STEPS * step)
            return trace + PROBE_PASS_STEPS * step
        if part == "profile":
            fixed = PROFILE_FIXED_S.get(_backend_name(), max(PROFILE_FIXED_S.values()))
            return fixed + PROFILE_STEPS_COST * step * facts.get("steps", 3.0)
        if part == "profile_conversion":
            return CONVERT_S_PER_MB * facts.get("megabytes", 0.0)
        raise ValueError(f"mpwatch: no estimate for {part!r}; one of {OPTIONAL}")

    def _probe_trace(self, traced: float = 0.0) -> float:
        """The first probe's trace (and compile): :data:`PROBE_TRACE_FACTOR` of Keras' first
        step, less ``traced`` seconds of it already paid ahead."""
        first = max(self.first_step_seconds() or 0.0, self.trace_seconds or 0.0)
        return max(0.0, PROBE_TRACE_FACTOR * first - float(traced))

    def fits(self, part: str, **facts: float) -> bool:
        """Whether ``part``'s estimate fits what is left now (no decision kept); True without a
        budget."""
        left = self.allowance()
        return left is None or self.estimate(part, **facts) <= left

    # --- decisions -------------------------------------------------------------------------
    def decide(
        self,
        part: str,
        step: int,
        estimate: float | None = None,
        explicit: bool = False,
        now: float | None = None,
        defer: bool = False,
        detail: dict[str, Any] | None = None,
        needed: str | None = None,
        **facts: float,
    ) -> bool:
        """Whether ``part`` runs now at batch ``step``; the decision is kept. ``explicit``: the
        user asked for it (it runs); ``defer``: a "no" is a deferral (the work is done later, by
        the reader), not a skip; ``needed``: why the run cannot do without it (the training is
        broken, and only this part finds the cause): it runs whatever it costs."""
        cost = self.estimate(part, **facts) if estimate is None else float(estimate)
        left = self.allowance(now)
        if explicit:
            action, why = "explicit", "asked for explicitly: runs whatever it costs"
        elif needed and left is not None and cost > left:
            action, why = "needed", f"{needed}: it finds the cause, whatever it costs"
        elif left is None:
            action, why = "ran", "no budget"
        elif cost <= left:
            action, why = "ran", "fits the budget"
        else:
            action = "deferred" if defer else "skipped"
            why = f"estimated {cost:.2f} s, {max(left, 0.0):.2f} s of the budget left"
        self.record(part, step, action, cost, left, reason=why, detail=detail)
        return action in ("ran", "explicit", "needed")

    def record(
        self,
        part: str,
        step: int,
        action: str,
        estimate: float,
        allowance: float | None,
        cost: float | None = None,
        reason: str = "",
        detail: dict[str, Any] | None = None,
    ) -> None:
        """Keep a decision taken elsewhere (the probe's fix checks, pass by pass:
        :class:`mpwatch.record.probe.fix_gate.FixGate`); ``action`` one of :data:`ACTIONS`."""
        if action not in ACTIONS:
            raise ValueError(f"mpwatch: a budget action is one of {ACTIONS}, not {action!r}")
        self.decisions.append(
            Decision(
                int(step),
                part,
                action,
                round(float(estimate), 4),
                _round(allowance),
                cost_s=_round(cost),
                reason=reason,
                detail=dict(detail or {}),
            )
        )

    def overrule(self, part: str, step: int, reason: str) -> None:
        """The last decision on ``part`` at ``step`` to run it becomes a skip, for ``reason``
        (a probe that would not fit the device's free memory: :mod:`.probe_memory`)."""
        for d in reversed(self.decisions):
            if d.part == part and d.step == int(step):
                if d.action in ("ran", "explicit", "needed"):
                    d.action, d.reason = "skipped", reason
                return
        self.record(part, step, "skipped", 0.0, self.allowance(), reason=reason)

    def ran(self, part: str, seconds: float) -> None:
        """What the last decision on ``part`` that ran really cost (already charged by
        :meth:`spend`)."""
        self.costs.setdefault(part, []).append(float(seconds))
        for d in reversed(self.decisions):
            if d.part == part and d.action in ("ran", "explicit", "needed"):
                if d.cost_s is None:
                    d.cost_s = round(float(seconds), 4)
                break

    # --- the record ------------------------------------------------------------------------
    def payload(self, explicit: dict[str, Any] | None = None) -> dict[str, Any]:
        """The ``budget`` record's payload (``contract.KIND_BUDGET``)."""
        fit = self.elapsed()
        own = self.own_seconds()
        return {
            "fraction": self.fraction,
            "fit_seconds": round(fit, 4),
            "own_seconds": round(own, 4),
            "own_share": (own / fit) if fit > 0 else None,
            "first_step_seconds": _round(self.first_step_seconds()),
            "step_seconds": _round(self.step_seconds()),
            "steps": self._steps_done,
            "spent": {k: round(v, 4) for k, v in sorted(self.spent.items())},
            "explicit": dict(explicit or {}),
            "decisions": [asdict(d) for d in self.decisions],
        }


def _backend_name() -> str:
    from mpwatch.record.runtime.backend import name

    try:
        return name()
    except Exception:  # noqa: BLE001 - no Keras backend to ask: the larger estimate
        return ""


def _round(value: float | None) -> float | None:
    return None if value is None else round(float(value), 4)
