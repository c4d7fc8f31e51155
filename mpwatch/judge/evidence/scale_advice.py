"""The loss-scale advice as the findings say it: the :class:`Advice` and its words.

What :func:`mpwatch.judge.evidence.scale_evidence.advise` decided (its kind, the proposed
``initial_scale`` and ``dynamic_growth_steps``, the layers to keep in float32, the evidence lines)
and how a finding words it: a headline, the fix as code (:func:`optimizer_code`), the predicted
underflow and overflow at each proposed value, the numbers for a finding's ``data``; layer lists
as :func:`names_text` writes them.

Example:
    >>> optimizer_code(2.0**20, None)
    'optimizer = keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=1048576)'
    >>> names_text([("a", 0.3), ("b", 0.12)])
    "'a' 30.0%, 'b' 12.0%"
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from mpwatch.formats import KERAS_GROWTH_INTERVAL, KERAS_INITIAL_SCALE
from mpwatch.judge.evidence.scale_facts import Overflow, ProbeView
from mpwatch.words import loss_scale as scale_text
from mpwatch.words import percent as _pct

__all__ = ["Advice", "optimizer_code", "names_text", "number_code", "LAYERS_NAMED"]

#: layers named in one finding at most (the rest counted)
LAYERS_NAMED = 8


def number_code(x: float) -> str:
    """A number as Python source that gives exactly that float (for code: ``initial_scale=``)."""
    x = float(x)
    return str(int(x)) if x.is_integer() else repr(x)


def optimizer_code(initial: float | None, growth: int | None) -> str:
    """The LossScaleOptimizer line for these values (a value equal to Keras' default is left out:
    ``LossScaleOptimizer(optimizer)`` uses it)."""
    args = ["optimizer"]
    if initial is not None and initial != KERAS_INITIAL_SCALE:
        args.append(f"initial_scale={number_code(initial)}")
    if growth is not None and growth != KERAS_GROWTH_INTERVAL:
        args.append(f"dynamic_growth_steps={int(growth)}")
    return f"optimizer = keras.optimizers.LossScaleOptimizer({', '.join(args)})"


def names_text(layers: list[tuple[str, float]], with_fraction: bool = True) -> str:
    """``'a' 30.0%, 'b' 12.0% and 3 more`` (at most LAYERS_NAMED named)."""
    shown = layers[:LAYERS_NAMED]
    text = ", ".join(f"{n!r} {_pct(u)}" if with_fraction else repr(n) for n, u in shown)
    more = len(layers) - len(shown)
    return text + (f" and {more} more" if more else "")


@dataclass
class Advice:
    """What the loss-scale evidence says.

    Attributes:
        kind: ``"none"`` (no reliable float16 probe against a float32 reference: nothing to
            say), ``"silent"`` (underflow at the scale used immaterial), ``"change"`` (a scale or
            a growth to propose), ``"range"`` (no single scale fits; maybe a scale too),
            ``"unpredicted"`` (material underflow measured, but the sweep predicts next to none
            in the final gradients: it happens inside the backward pass, no scale is proposed),
            ``"stays"`` (material underflow, but no change to the scale that the evidence
            allows is predicted to halve it: nothing proposed).
        initial_scale / growth_steps: the proposals (None: not proposed).
        target: the level the gradients need at the latest probe (a power of two), or None.
        run_initial / run_growth: the run's own values.
        latest: the latest reliable float16 probe.
        probes: every reliable float16 probe.
        overflows: every skipped step with its scale.
        layers: ``(layer, underflow fraction)`` to keep in float32 (range problem), forward order.
        keep_code: the code that keeps those layers in float32, one line each (a layer that
            holds layers: all of it), then how to apply it
            (:func:`mpwatch.judge.fixes.fix.layers_code`).
        layers_leave: the model-wide underflow predicted with them in float32
            (:func:`mpwatch.judge.evidence.scale_facts.underflow_without`: an estimate).
        bfloat16: where the device has bfloat16: a phrase saying so.
        lines: the evidence, one sentence each.
    """

    kind: str = "none"
    initial_scale: float | None = None
    growth_steps: int | None = None
    target: float | None = None
    run_initial: float = KERAS_INITIAL_SCALE
    run_growth: int = KERAS_GROWTH_INTERVAL
    latest: ProbeView | None = None
    probes: list[ProbeView] = field(default_factory=list)
    overflows: list[Overflow] = field(default_factory=list)
    layers: list[tuple[str, float]] = field(default_factory=list)
    keep_code: str = ""
    layers_leave: float | None = None
    bfloat16: str | None = None
    span: tuple[int, int] | None = None
    best_under: float | None = None
    lines: list[str] = field(default_factory=list)

    @property
    def changes_scale(self) -> bool:
        return self.initial_scale is not None or self.growth_steps is not None

    @property
    def action(self) -> dict[str, Any]:
        """For :func:`mpwatch.apply_recommendations`: the optimizer's two values (the run's own
        where unchanged, so that applying changes exactly what the fix says) and the layers."""
        out: dict[str, Any] = {}
        if self.changes_scale:
            out["loss_scale"] = self.initial_scale or self.run_initial
            out["dynamic_growth_steps"] = self.growth_steps or self.run_growth
        if self.layers:
            out["float32_layers"] = [name for name, _ in self.layers]
        return out

    @property
    def proposed_scale(self) -> float | None:
        """The scale the change is about: the proposed initial scale, else the target level a
        faster growth is to reach; None without a change."""
        if not self.changes_scale:
            return None
        return self.initial_scale if self.initial_scale is not None else self.target

    def summary(self) -> dict[str, Any]:
        """The proposal's numbers for a finding's ``data``: ``proposed_scale`` and, at the latest
        probe, its ``predicted_underflow`` and ``predicted_overflow`` (the sweep's), with the
        predicted underflow at the scale used; all None without a proposal."""
        s = self.proposed_scale
        p = self.latest.predicted(math.log2(s)) if s is not None and self.latest else None
        used = self.latest.under(math.ceil(self.latest.used_log2)) if self.latest else None
        return {
            "proposed_scale": s,
            "predicted_underflow": p[0] if p else None,
            "predicted_overflow": p[1] if p else None,
            "predicted_underflow_at_used": used,
        }

    def predicted_rows(self) -> list[dict[str, Any]]:
        """Predicted underflow and overflow at each proposed value and at the scale used: at the
        latest probe, and the most any probe predicts."""
        rows = []
        if self.latest is None:
            return rows
        seen = set()
        for what, s in (
            ("used", self.latest.scale),
            ("initial_scale", self.initial_scale),
            ("target", self.target),
        ):
            if s is None or s in seen:
                continue
            seen.add(s)
            k = math.log2(s)
            p = self.latest.predicted(k)
            preds = [q.predicted(k) for q in self.probes]
            preds = [x for x in preds if x is not None]
            rows.append(
                {
                    "what": what,
                    "scale": s,
                    "probe_step": self.latest.step,
                    "underflow": p[0] if p else None,
                    "overflow": p[1] if p else None,
                    "max_underflow_any_probe": max((x[0] for x in preds), default=None),
                    "max_overflow_any_probe": max((x[1] for x in preds), default=None),
                }
            )
        return rows

    @property
    def fix(self) -> str:
        lines: list[str] = []
        rows = {r["what"]: r for r in self.predicted_rows()}
        if self.changes_scale:
            lines.append(optimizer_code(self.initial_scale or self.run_initial,
                                        self.growth_steps or self.run_growth))  # fmt: skip
            for what in ("initial_scale", "target"):
                r = rows.get(what)
                if r is None or r["underflow"] is None:
                    continue
                lines.append(
                    f"# predicted at {scale_text(r['scale'])} (probe at step {r['probe_step']}): "
                    f"underflow {_pct(r['underflow'])}, overflow {_pct(r['overflow'])}"
                )
        if self.layers:
            lines.append(self.keep_code)
        if self.bfloat16 and self.kind in ("range", "unpredicted"):
            lines.append(
                f"# or, as {self.bfloat16} (float32's exponent range: no loss scale needed):"
            )
            lines.append('keras.mixed_precision.set_global_policy("mixed_bfloat16")')
        return "\n".join(lines)

    @property
    def headline(self) -> str:
        """One line: what to change, and the predicted effect."""
        parts = []
        lt = self.latest
        if self.initial_scale is not None and lt is not None:
            u = lt.under(math.log2(self.initial_scale))
            parts.append(
                f"start the loss scale at {scale_text(self.initial_scale)}"
                + (
                    f" (predicted underflow {_pct(u)}; {_pct(lt.measured)} measured at "
                    f"{scale_text(lt.scale)})"
                    if u is not None
                    else ""
                )  # fmt: skip
            )
        if self.growth_steps is not None and self.target is not None:
            it = "let it" if parts else "let the loss scale"
            parts.append(
                f"{it} double every {self.growth_steps} steps to reach the "
                f"{scale_text(self.target)} the gradients need"
            )
        n = len(self.layers)
        keep = f": keep {n} layer{'s' if n != 1 else ''} in float32" if n else ""
        if n and lt is not None and self.layers_leave is not None:
            keep += f" (predicted underflow {_pct(lt.measured)} -> {_pct(self.layers_leave)})"
        if self.kind == "range":
            parts.append("no single loss scale fits the gradients" + keep)
        elif self.kind == "unpredicted":
            parts.append(
                "gradients underflow inside the backward pass, where a larger scale is not "
                "predicted to help" + keep
            )
        text = "; ".join(parts)
        return text[:1].upper() + text[1:]
