"""What a run's records say about its loss scale: the facts the scale advice and rules share.

The rules ``loss-scale``, ``gradient-underflow`` and ``skipped-steps`` (and the skip causes) read
the same facts, so that they never disagree:

- the **scale history** (``mpwatch/loss_scale``: the scale after each step; at step 0, when
  recorded, the scale before the first) and **every skipped step** (:func:`overflows`): the scale
  each skipped step ran at is twice the scale recorded after it (Keras' rule: a step with
  non-finite gradients is dropped and the scale halved), else the scale recorded before it; those
  within the first :data:`START_STEPS` steps are the scale's descent from its initial value;
- **every reliable float16 probe** (:func:`float16_probes`, one :class:`ProbeView` each): its
  measured underflow at the scale used, its log2 histogram of the float32 reference's gradients
  and its sweep (predicted underflow and overflow at each power-of-two scale), the largest
  reference gradient it saw (weights and, where measured, activation gradients), its per-layer
  underflow table without the layers fed integer ids a 16-bit cast rounded
  (:func:`id_rounded_layers`), and what its counts leave without some layers
  (:func:`underflow_without`);
- **Keras' dynamic rule** (:func:`growth_facts`): the scale starts at ``initial_scale`` (2^15),
  halves on every step with non-finite gradients and doubles after ``dynamic_growth_steps``
  (2000) finite steps in a row; the run's own values come from its ``run_info``;
- the layers already computing in float32 (:func:`float32_layer_names`), the probes no finding
  may rest on (:func:`unreliable_probes`), and whether the device has bfloat16
  (:func:`bfloat16_device`).

No threshold of the advice here: what these facts mean for the scale (what a probe allows, the
level the gradients need, what to propose) is :mod:`mpwatch.judge.evidence.scale_evidence`'s.

Pure pandas/numpy: no TensorFlow (the judge's rule).

Example:
    >>> from mpwatch.read.run import Run
    >>> overflows(Run(name=".", path="")), growth_facts(Run(name=".", path=""))
    ([], (32768.0, 2000))
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from mpwatch import contract
from mpwatch.formats import KERAS_GROWTH_INTERVAL, KERAS_INITIAL_SCALE
from mpwatch.judge.rule import MIN_COMPUTE_CAPABILITY, fast_16bit, row_computes_float32
from mpwatch.read.run import Run

__all__ = [
    "Overflow",
    "ProbeView",
    "overflows",
    "float16_probes",
    "probe_is_reliable",
    "id_rounded_layers",
    "without_layers",
    "underflow_without",
    "growth_facts",
    "unreliable_probes",
    "float32_layer_names",
    "bfloat16_device",
    "START_STEPS",
    "BFLOAT16_MIN_CC",
    "WINDOW_BITS",
]

#: skipped steps within the first START_STEPS steps are the scale's descent from its initial value
#: at initialisation (``skipped-steps`` calls them warm-up)
START_STEPS = 100
#: a GPU of at least this compute capability has bfloat16 (Ampere and later)
BFLOAT16_MIN_CC = MIN_COMPUTE_CAPABILITY["bfloat16"]

_UNDER_LOG2 = -24  # float16's smallest subnormal: |g| * S below 2**-24 is predicted lost
_OVER_LOG2 = 16  # |g| * S at or above 2**16 (past 65504) is predicted inf
#: 40 doublings from float16's smallest subnormal to overflow: the widest span of gradients one
#: loss scale can keep
WINDOW_BITS = _OVER_LOG2 - _UNDER_LOG2


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
    """One float16 probe as the advice reads it (what it allows and what it needs are the
    advice's: :func:`mpwatch.judge.evidence.scale_evidence.max_k` and ``need_k``).

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

    def predicted_ks(self) -> list[int]:
        """The powers of two (log2) :meth:`predicted` covers: the sweep's, and every one at which
        the histogram's bins can fall below float16's smallest subnormal or past 65504."""
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


def growth_facts(run: Run) -> tuple[float, int]:
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


def float32_layer_names(run: Run) -> set[str]:
    """Layers that already compute in float32 (their compute dtype, or float32 inside a 16-bit
    policy): keeping them "in float32" would change nothing."""
    lt = run.layers
    if not len(lt) or "name" not in lt:
        return set()
    return {str(r["name"]) for r in lt.to_dict("records") if row_computes_float32(r)}


def unreliable_probes(run: Run, mode: str) -> int:
    """How many probes of ``mode`` were marked unreliable."""
    pm = run.probe_model
    if not len(pm) or "mode" not in pm:
        return 0
    return sum(
        1 for r in pm.to_dict("records") if r.get("mode") == mode and not probe_is_reliable(r)
    )
