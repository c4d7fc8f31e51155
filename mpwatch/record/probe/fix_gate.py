"""FixGate: the probe's fix checks under mpwatch's cost budget, one pass at a time.

A probe that finds its pass non-finite, near float16's maximum, or a layer's gradient error
standing out re-runs the pass under each candidate fix (:mod:`mpwatch.record.probe.fix_check`): up
to ``MAX_LAYERS + 2`` passes, or a float32 reference and up to ``GRAD_CHECKED`` layers, each a
program of its own to trace (on JAX, to compile) the first time. How many run depends on what the
pass shows, so the probe's budget decision cannot know it: on a model near the maximum they cost
more than the rest of the probe (MobileNetV2 on JAX, a CPU: 20 s of fix checks in a 39 s probe).

So each pass is asked for before it runs (:meth:`FixGate.allow`): it runs when its estimate fits
what the budget had left when the probe was decided, less what the probe has spent since and what
float8 readiness (which runs after the checks) is estimated at. A pass's estimate is what the same
program cost before (a later probe reuses it: JAX keeps it compiled), else the larger of
:func:`first_pass` and the dearest pass measured so far: Keras' first step on JAX (a program to
compile), :data:`EAGER_PASS_STEPS` steady steps on TensorFlow (the checks run eagerly there: no
trace, op by op). Measured on a CPU, MobileNetV2 under mixed_float16: TensorFlow's passes took
5.0-6.3 steps (keras.io's Transformer 2.1-5.4); JAX's new programs 0.23-0.79 of Keras' first step
(3.5 to 12.3 s: one program's cost does not tell the next one's), a program run again 1.3 steps.

A refused pass stops the checks: the probe's record says where (an entry with ``fix: "stopped"``
among its ``fix_checks``, or ``skipped`` on the gradient checks not run), the diagnosis shows
only what was checked and never reads a stopped sequence as "this fix does not fix", and the
budget record keeps one ``fix_checks`` decision per probe that wanted them (:meth:`decision`:
ran, or skipped with the refused estimate). A probe asked for explicitly (``probe_every``), one
that runs beyond the budget because the training is broken (``needed``: its fix checks are what
names the fix), or no budget: every pass runs, and is still counted.

Example:
    >>> gate = FixGate(allowance=3.0, started=0.0, first_estimate=1.0, clock=lambda: 1.5)
    >>> gate.allow(("none",))  # 1 s fits the 1.5 s left
    True
    >>> gate.ran(("none",), 1.2)
    >>> gate.allow(("float32", "dense"))  # a new program: the dearest so far, 1.2 s, fits
    True
    >>> FixGate(allowance=1.0, started=0.0, first_estimate=2.0, clock=lambda: 0.1).allow(("x",))
    False
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["EAGER_PASS_STEPS", "FixGate", "first_pass"]

#: a fix check's pass on TensorFlow runs eagerly (a policy view cannot enter a traced function):
#: its cost in steady training steps (measured on a CPU: MobileNetV2 5.0-6.3, keras.io's
#: Transformer 2.1-5.4)
EAGER_PASS_STEPS = 6.0


def first_pass(budget: Any, backend_name: str) -> float:
    """The estimate of a fit's first fix-check pass, from the budget's measurements: Keras' first
    step on JAX (the pass is compiled, as Keras' train step was), :data:`EAGER_PASS_STEPS` steady
    steps on TensorFlow."""
    step = budget.step_seconds() or budget.first_step_seconds() or 0.0
    if backend_name == "jax":
        first = max(budget.first_step_seconds() or 0.0, budget.trace_seconds or 0.0)
        return max(first, EAGER_PASS_STEPS * step)
    return EAGER_PASS_STEPS * step


class FixGate:
    """Whether each fix-check pass of one probe fits the budget (see the module docstring).

    Args:
        allowance: seconds the budget had left when the probe was decided (None: every pass
            runs: no budget, an explicit probe, or one the training needs).
        started: the clock when the probe started (its time since is spent).
        first_estimate: the estimate of a pass when no pass was measured yet.
        reserve: seconds kept for what the probe does after the checks (float8 readiness).
        known: the passes measured at earlier probes (key -> seconds), shared with them.
        clock: the clock (``time.perf_counter``).
    """

    def __init__(
        self,
        allowance: float | None,
        started: float,
        first_estimate: float,
        reserve: float = 0.0,
        known: dict[Any, float] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.allowance = allowance
        self.started = float(started)
        self.first_estimate = max(0.0, float(first_estimate))
        self.reserve = max(0.0, float(reserve))
        self.known = {} if known is None else known
        self.clock = clock
        self.asked = 0  # passes asked for
        self.seconds = 0.0  # what the passes that ran cost
        self.refused: tuple[float, float] | None = None  # (estimate, left) of the refused pass

    def estimate(self, key: Any) -> float:
        """What the pass ``key`` (its program: the layers it keeps float32) is expected to cost."""
        if key in self.known:
            return self.known[key]
        return max([self.first_estimate, *self.known.values()])

    def left(self) -> float | None:
        """Seconds still free for passes now (None: no limit)."""
        if self.allowance is None:
            return None
        return self.allowance - self.reserve - (self.clock() - self.started)

    def allow(self, key: Any) -> bool:
        """Whether the pass ``key`` runs; once one is refused, none after it does."""
        self.asked += 1
        if self.refused is not None:
            return False
        left, cost = self.left(), self.estimate(key)
        if left is None or cost <= left:
            return True
        self.refused = (cost, left)
        return False

    def ran(self, key: Any, seconds: float) -> None:
        """The pass ``key`` ran and cost ``seconds``."""
        self.known[key] = max(0.0, float(seconds))
        self.seconds += max(0.0, float(seconds))

    def reason(self) -> str | None:
        """Why the checks stopped, in words (None: they did not)."""
        if self.refused is None:
            return None
        cost, left = self.refused
        return (
            f"mpwatch's cost budget: the next pass was estimated at {cost:.2f} s, "
            f"{max(left, 0.0):.2f} s of the budget left"
        )

    def decision(self) -> dict[str, Any] | None:
        """The budget decision to keep for this probe's fix checks (``CostBudget.record``'s
        arguments), or None when it checked no fix."""
        if not self.asked:
            return None
        if self.refused is not None:
            cost, left = self.refused
            return {
                "action": "skipped", "estimate": cost, "allowance": left, "cost": None,
                "reason": self.reason() or "", "detail": {"ran_seconds": round(self.seconds, 4)},
            }  # fmt: skip
        return {
            "action": "ran", "estimate": self.seconds, "allowance": self.left(),
            "cost": self.seconds, "detail": {},
            "reason": "every pass fit the budget" if self.allowance is not None
            else "the probe runs whatever it costs (no budget, asked for, or needed)",
        }  # fmt: skip
