"""The loss-scale evidence of one run in one place, and the advice drawn from all of it.

The rules ``loss-scale``, ``gradient-underflow`` and ``skipped-steps`` read the same facts, so that
they never disagree (a rule proposing one scale while another proposes a lower one):

- the **scale history** (``mpwatch/loss_scale``: the scale after each step; at step 0, when
  recorded, the scale before the first) and **every skipped step**: the scale each skipped step
  ran at is twice the scale recorded after it (Keras' rule: a step with non-finite gradients is
  dropped and the scale halved), else the scale recorded before it;
- **every reliable float16 probe** (not only the last): its measured underflow at the scale used,
  its log2 histogram of the float32 reference's gradients and its sweep (predicted underflow and
  overflow at each power-of-two scale), the largest reference gradient it saw (weights and, where
  measured, activation gradients), its per-layer underflow table;
- **Keras' dynamic rule**: the scale starts at ``initial_scale`` (2^15), halves on every step with
  non-finite gradients and doubles after ``dynamic_growth_steps`` (2000) finite steps in a row;
  the run's own values come from its ``run_info``.

:func:`advise` turns them into one :class:`Advice`, computed once per run (cached on the Run).
The decision and its thresholds are documented in the ``loss-scale`` rule
(``mpwatch/judge/rules/loss_scale.py``); in short:

1. **Silence** unless the underflow measured at the scale used (latest reliable probe) is at least
   :data:`UNDERFLOW_MATERIAL`.
2. **What a probe allows**: the powers of two at which its sweep predicts no overflow and its
   largest reference gradient (activation gradients included) stays :data:`HEADROOM_BITS`
   doublings below 65504 (room for batches with gradients up to 4x the probe's before Keras must
   halve the scale).
3. The **level the gradients need** (target): the smallest power of two above the scale used whose
   predicted underflow is at most :data:`UNDERFLOW_NEGLIGIBLE`, else the largest candidate; a
   candidate is one the latest probe allows, below every scale that overflowed after the first
   :data:`START_STEPS` steps. Its predicted underflow must be at least :data:`UNDERFLOW_MATERIAL`
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
   starts (the proposed initial scale, else where the descent of the first :data:`START_STEPS`
   steps left it, or the run's initial scale), would not reach each probe's need by that probe's
   step. The proposal is the largest of :data:`GROWTH_LADDER` that
   keeps up, never below :data:`MIN_GROWTH_STEPS`, and only below the run's own.
6. **No single scale fits** when even the best scale allowed predicts underflow of at least
   :data:`UNDERFLOW_MATERIAL`: the histogram is wider than float16's window. The layers whose
   gradients underflow most at the scale used (the probe's per-layer table, above
   :data:`LAYER_UNDERFLOW_WARN`, not already float32) are named to keep in float32, and
   ``mixed_bfloat16`` is named where the device has bfloat16 (a GPU of compute capability at least
   :data:`BFLOAT16_MIN_CC`).

Pure pandas/numpy: no TensorFlow (the judge's rule).

Example:
    >>> from mpwatch.read.run import Run
    >>> advise(Run(name=".", path="")).kind
    'none'
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from mpwatch import contract, words
from mpwatch.formats import KERAS_GROWTH_INTERVAL, KERAS_INITIAL_SCALE
from mpwatch.judge.rule import MIN_COMPUTE_CAPABILITY, fast_16bit, row_computes_float32
from mpwatch.read.run import Run

__all__ = [
    "Overflow",
    "ProbeView",
    "Advice",
    "overflows",
    "float16_probes",
    "probe_is_reliable",
    "id_rounded_layers",
    "without_layers",
    "unreliable_probes",
    "underflowing_layers",
    "underflow_without",
    "names_text",
    "float32_layer_names",
    "bfloat16_device",
    "advise",
    "optimizer_code",
    "scale_text",
    "UNDERFLOW_MATERIAL",
    "UNDERFLOW_NEGLIGIBLE",
    "HEADROOM_BITS",
    "START_STEPS",
    "MIN_GROWTH_STEPS",
    "GROWTH_LADDER",
    "LAYER_UNDERFLOW_WARN",
    "BFLOAT16_MIN_CC",
]

#: measured underflow at the scale used below this: the loss scale is not the problem (silence).
#: The same 1% at which ``gradient-underflow`` warns: no advice for a loss no rule reports.
UNDERFLOW_MATERIAL = 0.01
#: a target scale is the smallest whose predicted underflow is at most this (0.1%)
UNDERFLOW_NEGLIGIBLE = 0.001
#: a proposed scale keeps the probe's largest reference gradient this many doublings below 65504
HEADROOM_BITS = 2
#: skipped steps within the first START_STEPS steps are the scale's descent from its initial value
#: at initialisation (``skipped-steps`` calls them warm-up)
START_STEPS = 100
#: one failed doubling per MIN_GROWTH_STEPS steps skips 1% of the steps: ``skipped-steps``'
#: warning rate. A faster growth would cost more than it saves.
MIN_GROWTH_STEPS = 100
#: the dynamic_growth_steps values proposed (the largest that keeps up)
GROWTH_LADDER = (1000, 500, 200, 100)
#: a layer losing more than this share of its gradient values at the scale used is named
LAYER_UNDERFLOW_WARN = 0.05
#: layers named in one finding at most (the rest counted)
LAYERS_NAMED = 8
#: a GPU of at least this compute capability has bfloat16 (Ampere and later)
BFLOAT16_MIN_CC = MIN_COMPUTE_CAPABILITY["bfloat16"]

_UNDER_LOG2 = -24  # float16's smallest subnormal: |g| * S below 2**-24 is predicted lost
_OVER_LOG2 = 16  # |g| * S at or above 2**16 (past 65504) is predicted inf
_WINDOW_BITS = _OVER_LOG2 - _UNDER_LOG2  # 40 doublings from the smallest subnormal to overflow


# --- the facts -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Overflow:
    """One skipped step: ``scale`` is the scale it ran at (None when not recorded)."""

    step: int
    scale: float | None
    count: int = 1

    @property
    def at_start(self) -> bool:
        """Within the first :data:`START_STEPS` steps: the descent from the initial scale."""
        return self.step <= START_STEPS


@dataclass
class ProbeView:
    """One float16 probe as the advice reads it.

    Attributes:
        step: the probe's step.
        scale: the loss scale its mixed gradients were taken at.
        measured: the measured underflow fraction at that scale (vs the float32 reference).
        recommended: the probe's recommended scale (None: none keeps the probe's margin).
        max_ref: the largest |reference gradient| it saw, activation gradients included (None:
            not recorded).
        margin_bits: the margin the probe's recommended scale keeps.
        edges / counts: the log2 histogram of the reference's nonzero gradients (integer edges).
        sweep: ``scale_log2 -> (predicted underflow, predicted overflow)``, mpwatch's own sweep.
        layers: the probe's per-layer table (without ``excluded``).
        excluded: layers left out of ``measured`` and ``layers``: those fed integer ids that a
            16-bit cast rounded (:func:`id_rounded_layers`), whose gradient zeros are not
            underflow.
    """

    step: int
    scale: float
    measured: float
    recommended: float | None
    edges: np.ndarray
    counts: np.ndarray
    sweep: dict[int, tuple[float, float]]
    layers: pd.DataFrame
    excluded: list[str] = field(default_factory=list)
    max_ref: float | None = None
    margin_bits: float = 4.0

    def predicted(self, k: float) -> tuple[float, float] | None:
        """(underflow, overflow) predicted at ``2**k``: the sweep's row, else the histogram's bins
        (``|g| * 2**k < 2**-24`` lost, ``>= 2**16`` inf), None when neither covers it."""
        if float(k).is_integer() and int(k) in self.sweep:
            return self.sweep[int(k)]
        if len(self.counts):
            total = float(self.counts.sum())
            if total <= 0:
                return (0.0, 0.0)
            lo = self.edges[:-1]
            # a bin [2**e, 2**(e+1)) lies wholly below 2**(-24-k) when e + 1 <= -24 - k
            under = float(self.counts[lo + 1 <= _UNDER_LOG2 - k].sum()) / total
            over = float(self.counts[lo >= _OVER_LOG2 - k].sum()) / total
            return (under, over)
        return None

    def under(self, k: float) -> float | None:
        p = self.predicted(k)
        return None if p is None else p[0]

    @property
    def used_log2(self) -> float:
        return math.log2(self.scale)

    @property
    def max_k(self) -> float | None:
        """The largest power of two this probe allows (log2): its largest reference gradient
        (activation gradients included) at least HEADROOM_BITS doublings below 65504, and no
        overflow predicted by its sweep. Without the largest gradient, from the probe's
        recommended scale (which keeps ``margin_bits``); without either, the sweep's largest
        overflow-free scale less HEADROOM_BITS. None: no scale is allowed (non-finite gradients);
        ``inf``: no gradient at all."""
        free = [k for k, (_u, o) in self.sweep.items() if o == 0]
        sweep_cap = max(free) if free else (None if self.sweep else math.inf)
        if self.max_ref is not None:
            if not math.isfinite(self.max_ref):
                return None
            if self.max_ref <= 0:
                return sweep_cap
            k = math.floor(math.log2(65504.0 / 2.0**HEADROOM_BITS / self.max_ref))
        elif self.recommended is not None:
            k = math.floor(math.log2(self.recommended) + self.margin_bits - HEADROOM_BITS)
        elif free:
            k = max(free) - HEADROOM_BITS
        else:
            return None
        return k if sweep_cap is None else min(k, sweep_cap)

    def need_k(self, cap: float) -> int | None:
        """The smallest ``k <= cap`` with predicted underflow at most UNDERFLOW_NEGLIGIBLE."""
        ks = sorted(k for k in self._ks() if k <= cap)
        for k in ks:
            u = self.under(k)
            if u is not None and u <= UNDERFLOW_NEGLIGIBLE:
                return k
        return None

    def _ks(self) -> list[int]:
        ks = set(self.sweep)
        if len(self.edges):
            lo, hi = int(self.edges[0]), int(self.edges[-1])
            ks.update(range(_UNDER_LOG2 - hi - 1, _OVER_LOG2 - lo + 2))
        return sorted(ks)

    @property
    def span_log2(self) -> tuple[int, int] | None:
        """log2 of the smallest and (exclusive) largest nonzero reference gradient's bin."""
        nz = np.nonzero(self.counts)[0]
        if not len(nz):
            return None
        return int(self.edges[nz[0]]), int(self.edges[nz[-1] + 1])


def probe_is_reliable(row: dict[str, Any]) -> bool:
    """Whether a probe's model row may carry a finding: a row the probe marked ``reliable: false``
    (its loss disagrees with the train step's on the same batch and weights) may not; ``None``
    (not known, e.g. a custom train step) may, as in :meth:`Run.latest_probe`."""
    return row.get("reliable") is not False


def _f(x: Any) -> float | None:
    return contract.finite_float(x)


def _num_or_none(x: Any) -> float | None:
    """A number (inf kept: a non-finite gradient), or None when absent or NaN."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def id_rounded_layers(run: Run, step: int) -> list[str]:
    """Layers that, at this probe, take integer ids a 16-bit cast changed (the probe's inputs
    table: ``integer_valued`` and ``changed > 0``; the ``id-rounding`` rule's finding). Their
    mixed gradient lands on other embedding rows than the reference's: zeros there are the
    rounding, not underflow."""
    pi = run.probe_inputs
    if not len(pi) or "step" not in pi or "consumers" not in pi or "changed" not in pi:
        return []
    out: list[str] = []
    for r in pi[pi["step"] == step].to_dict("records"):
        changed = _f(r.get("changed"))
        if not changed or r.get("integer_valued") is not True:
            continue  # a real-valued input rounds too: that is precision, not ids
        cons = r.get("consumers")
        names = [cons] if isinstance(cons, str) else list(cons or [])
        out += [str(n) for n in names if str(n) not in out]
    return out


def without_layers(
    layers: pd.DataFrame, exclude: list[str]
) -> tuple[pd.DataFrame, float | None, int | None, int | None]:
    """The probe's layer table without ``exclude``, and the model-wide underflow (fraction, count,
    reference-nonzero) its remaining per-layer counts give (None without counts)."""
    if not exclude or not len(layers) or "layer" not in layers:
        return layers, None, None, None
    kept = layers[~layers["layer"].astype(str).isin(exclude)].reset_index(drop=True)
    if not {"ref_nonzero", "underflow_count"} <= set(kept):
        return kept, None, None, None
    nz = pd.to_numeric(kept["ref_nonzero"], errors="coerce").fillna(0).sum()
    uc = pd.to_numeric(kept["underflow_count"], errors="coerce").fillna(0).sum()
    return kept, (float(uc / nz) if nz else 0.0), int(uc), int(nz)


def float16_probes(run: Run) -> list[ProbeView]:
    """The run's reliable float16 probes measured against a float32 reference (with a scale, a
    measured underflow and a histogram or sweep), in step order."""
    pm = run.probe_model
    if not len(pm) or "mode" not in pm:
        return []
    out = []
    for row in pm.sort_values("step", kind="stable").to_dict("records"):
        if row.get("mode") != "float16" or not probe_is_reliable(row):
            continue
        if row.get("reference") not in (None, "float32_twin"):
            continue
        step = int(row["step"])
        scale, measured = _f(row.get("loss_scale")), _f(row.get("underflow_fraction"))
        if not scale or scale <= 0 or measured is None:
            continue
        hist = run.histograms.get(step) or {}
        if hist.get("source", "reference") != "reference":
            hist = {}
        edges = np.asarray(hist.get("edges_log2") or [], np.float64)
        counts = np.asarray(hist.get("counts") or [], np.float64)
        if len(edges) != len(counts) + 1:
            edges, counts = np.zeros(0), np.zeros(0)
        sweep: dict[int, tuple[float, float]] = {}
        sw = run.sweeps
        if len(sw) and "step" in sw and "scale_log2" in sw:
            for r in sw[sw["step"] == step].to_dict("records"):
                u = _f(r.get("predicted_underflow_fraction"))
                o = _f(r.get("predicted_overflow_fraction"))
                k = _f(r.get("scale_log2"))
                if u is not None and o is not None and k is not None:
                    sweep[int(k)] = (u, o)
        if not sweep and not len(counts):
            continue
        layers = pd.DataFrame()
        pl = run.probe_layers
        if len(pl) and "step" in pl:
            layers = pl[pl["step"] == step].reset_index(drop=True)
        excluded = id_rounded_layers(run, step)
        if excluded:
            layers, frac, _, _ = without_layers(layers, excluded)
            if frac is not None:
                measured = frac
        out.append(
            ProbeView(
                step=step,
                scale=scale,
                measured=measured,
                recommended=_f(row.get("recommended_scale")),
                max_ref=_num_or_none(row.get("max_abs_ref_grad")),
                margin_bits=_f(row.get("margin_bits")) or 4.0,
                edges=edges,
                counts=counts,
                sweep=sweep,
                layers=layers,
                excluded=excluded,
            )
        )
    return out


def overflows(run: Run) -> list[Overflow]:
    """Every skipped step with the scale it ran at: twice the scale recorded after it (the skip
    halved it), else the last scale recorded before it, else None."""
    hist = run.scalar(contract.LOSS_SCALE)
    skipped = run.skipped_steps()
    out = []
    steps = hist.index.to_numpy()
    values = hist.to_numpy()
    for step, n in skipped.items():
        step = int(step)
        scale = None
        if step in hist.index and math.isfinite(float(hist[step])):
            scale = 2.0 * float(hist[step])
        else:
            i = int(np.searchsorted(steps, step)) - 1
            if i >= 0 and math.isfinite(float(values[i])):
                scale = float(values[i])
        out.append(Overflow(step=step, scale=scale, count=int(n)))
    return out


def _growth_facts(run: Run) -> tuple[float, int]:
    """(initial scale, dynamic_growth_steps): run_info's, else the scale recorded at step 0 and
    Keras' defaults."""
    ls = run.info.get("loss_scale") or {}
    initial = _f(ls.get("initial")) if isinstance(ls, dict) else None
    growth = _f(ls.get("growth_interval")) if isinstance(ls, dict) else None
    if initial is None:
        hist = run.scalar(contract.LOSS_SCALE)
        if len(hist) and int(hist.index[0]) == 0:
            initial = float(hist.iloc[0])
    initial = initial if initial else KERAS_INITIAL_SCALE
    return initial, int(growth) if growth else KERAS_GROWTH_INTERVAL


def bfloat16_device(run: Run) -> str | None:
    """A phrase naming the device's bfloat16 when it has it (a GPU of compute capability >=
    BFLOAT16_MIN_CC: :func:`mpwatch.judge.rule.fast_16bit`), else None."""
    if not fast_16bit(run, "bfloat16"):
        return None
    dev = run.info.get("device") or {}
    raw = str(dev.get("compute_capability") or "").split(" ")[0]
    return f"this GPU ({dev.get('name') or 'GPU'}, compute capability {raw}) has bfloat16"


# --- formatting ----------------------------------------------------------------------------------
#: a loss scale in words (``2^20 (1048576)``): :func:`mpwatch.words.loss_scale`, everywhere
scale_text = words.loss_scale
_pct = words.percent


def _num(x: float) -> str:
    """A number as Python source that gives exactly that float (for code: ``initial_scale=``)."""
    x = float(x)
    return str(int(x)) if x.is_integer() else repr(x)


def optimizer_code(initial: float | None, growth: int | None) -> str:
    """The LossScaleOptimizer line for these values (a value equal to Keras' default is left out:
    ``LossScaleOptimizer(optimizer)`` uses it)."""
    args = ["optimizer"]
    if initial is not None and initial != KERAS_INITIAL_SCALE:
        args.append(f"initial_scale={_num(initial)}")
    if growth is not None and growth != KERAS_GROWTH_INTERVAL:
        args.append(f"dynamic_growth_steps={int(growth)}")
    return f"optimizer = keras.optimizers.LossScaleOptimizer({', '.join(args)})"


# --- the advice ----------------------------------------------------------------------------------
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
        layers_leave: the model-wide underflow predicted with them in float32
            (:func:`underflow_without`: an estimate).
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
            named = names_text(self.layers, with_fraction=False)
            lines.append(
                f'# keep {named} in float32 (dtype="float32" where each is built), or, '
                "without editing the model code:"
            )
            lines.append("model = mpwatch.apply_recommendations(model, findings).model")
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


def float32_layer_names(run: Run) -> set[str]:
    """Layers that already compute in float32 (their compute dtype, or float32 inside a 16-bit
    policy): keeping them "in float32" would change nothing."""
    lt = run.layers
    if not len(lt) or "name" not in lt:
        return set()
    return {str(r["name"]) for r in lt.to_dict("records") if row_computes_float32(r)}


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
        u = _f(r.get("underflow_fraction"))
        name = str(r["layer"])
        if u is not None and u > floor and name not in f32:
            rows.append((name, u))
    if fallback is None or any(u > threshold for _, u in rows):
        rows = [(n, u) for n, u in rows if u > threshold]
    return rows


def underflow_without(layers: pd.DataFrame, names: list[str]) -> float | None:
    """The model-wide underflow fraction the probe's per-layer counts leave when the named
    layers lose nothing (their gradients computed in float32): ``(lost - lost in them) /
    reference-nonzero``. An estimate: it assumes the gradient reaching them is intact (the
    float16 layers that feed it keep losing what they lose) and the other layers unchanged. None
    without counts."""
    if not len(layers) or not {"layer", "ref_nonzero", "underflow_count"} <= set(layers):
        return None
    total = lost = kept = 0.0
    for r in layers.to_dict("records"):
        nz, uc = _f(r.get("ref_nonzero")), _f(r.get("underflow_count"))
        if nz is None or uc is None:
            continue
        total += nz
        lost += uc
        if str(r["layer"]) in names:
            kept += uc
    return (lost - kept) / total if total else None


def names_text(layers: list[tuple[str, float]], with_fraction: bool = True) -> str:
    """``'a' 30.0%, 'b' 12.0% and 3 more`` (at most LAYERS_NAMED named)."""
    shown = layers[:LAYERS_NAMED]
    text = ", ".join(f"{n!r} {_pct(u)}" if with_fraction else repr(n) for n, u in shown)
    more = len(layers) - len(shown)
    return text + (f" and {more} more" if more else "")


def _ladder(bound: float, current: int) -> int | None:
    """The largest GROWTH_LADDER value <= bound (MIN_GROWTH_STEPS at least), if below current."""
    fits = [g for g in GROWTH_LADDER if g <= bound]
    g = max(fits) if fits else MIN_GROWTH_STEPS
    g = max(g, MIN_GROWTH_STEPS)
    return g if g < current else None


def _advise(run: Run) -> Advice:
    initial, growth = _growth_facts(run)
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
    lt_cap = lt.max_k if lt.max_k is not None else -math.inf
    cands = [k for k in lt._ks() if used_k < k <= min(lt_cap, later_cap)]
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
    caps = [p.max_k for p in adv.probes]
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
        n = p.need_k(min(p.max_k if p.max_k is not None else -math.inf, later_cap))
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
        f"the run's LossScaleOptimizer: initial_scale={_num(adv.run_initial)}, "
        f"dynamic_growth_steps={adv.run_growth} (halves on overflow, doubles after "
        f"{adv.run_growth} finite steps)"
    )
    if len(adv.probes) > 1:
        needs = []
        for p in adv.probes:
            n = p.need_k(p.max_k if p.max_k is not None else -math.inf)
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
                f"float16 holds {_WINDOW_BITS} (2^-24..65504)"
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


# --- probes no finding may rest on ----------------------------------------------------------------
def unreliable_probes(run: Run, mode: str) -> int:
    """How many probes of ``mode`` were marked unreliable."""
    pm = run.probe_model
    if not len(pm) or "mode" not in pm:
        return 0
    return sum(
        1 for r in pm.to_dict("records") if r.get("mode") == mode and not probe_is_reliable(r)
    )
