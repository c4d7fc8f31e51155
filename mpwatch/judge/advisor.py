"""The advisor: pure rules, a :class:`~mpwatch.read.run.Run` in, a list of :class:`Finding` out.

No TensorFlow here: every rule reads the tables of a Run (see ``contract.py`` for their schemas), so
the rules run in milliseconds and are tested on constructed tables. The TensorBoard tab and
``mpwatch diagnose`` both call :func:`diagnose`: a recommendation is computed in one place.

Each rule is documented in :data:`RULES` (why, threshold, source). Sources: the seeds of the project
(``shared/seeds``: 000 Perichon, "What's under the hood of TensorFlow mixed precision"; 001
"Mastering mixed precision training in TensorFlow"; 002 Minnaar, "GPU performance analysis: mixed
precision training"; 003 "Using mixed precision training with Gradient"; 004 Keydana, "First
experiments with TensorFlow mixed-precision training"), the TensorFlow mixed precision guide and
Micikevicius et al., "Mixed Precision Training" (2017).

Example:
    >>> import mpwatch  # doctest: +SKIP
    >>> for f in mpwatch.diagnose("logs/run1"):  # doctest: +SKIP
    ...     print(f.severity, f.title)
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

from mpwatch import contract
from mpwatch.contract import json_safe
from mpwatch.formats import FLOAT16, SIXTEEN_BIT
from mpwatch.read.run import Run, load_run, load_runs

__all__ = ["Finding", "Rule", "RULES", "diagnose", "diagnose_runs", "SEVERITIES"]

SEVERITIES = ("info", "warning", "error")
_RANK = {s: i for i, s in enumerate(SEVERITIES)}

FLOAT16_MAX = FLOAT16.max
MODEL_CLASSES = ("Sequential", "Functional", "Model")

# --- thresholds (documented in RULES) ----------------------------------------------------------
HEADROOM_WARN_BITS = 3.0  # activations within 3 doublings of 65504 (> 8188)
UNDERFLOW_WARN = 0.01  # model-wide underflow fraction at the scale used
UNDERFLOW_ERROR = 0.10
LAYER_UNDERFLOW_WARN = 0.05  # one layer's underflow fraction
SUBNORMAL_WARN = 0.05  # share of scaled training gradients in float16's subnormal range
SKIP_RATE_WARN = 0.01  # skipped steps after warm-up, per step
SKIP_RATE_ERROR = 0.10
WARMUP_STEPS = 100  # the scale starts at 2**15 and halves down: early skips are expected
WARMUP_SKIP_ALLOWANCE = 10  # ...but no more than 10 of them (the scale down to 2**5) in warm-up
WARMUP_SKIP_ERROR = 15  # more than 15 and the scale fell below 1: it protects nothing
SCALE_STUCK_LOW = 1.0  # a final dynamic scale at or below this cannot protect gradients
SCALE_FAR_BITS = 4.0  # |log2(scale / recommended)| at or above this
REL_ERROR_WARN = {"float16": 1e-2, "bfloat16": 5e-2, "preflight": 1e-2}
CAST_SHARE_WARN = 0.10
SHARE_16BIT_WARN = 0.50
FLOAT32_LAYER_SHARE = 0.10  # a float32 layer taking this share of profiled time
LOSS_AGREE_REL = 0.05  # final losses of a mixed and a float32 run within 5% agree
SLOWER_RATIO = 0.95
# Tensor Core dims the user sets in the layer's constructor (input dims follow from the previous
# layer, or from the data: the previous layer's own finding covers them)
SETTABLE_DIMS = (
    "units",
    "filters",
    "output_dim",
    "key_dim",
    "heads_x_key_dim",
)  # mixed step time / float32 step time above this: no speed-up


@dataclass
class Finding:
    """One diagnosis.

    Attributes:
        rule: the rule's id (a key of :data:`RULES`).
        severity: ``"info"``, ``"warning"`` or ``"error"``.
        title: one line.
        evidence: the numbers that triggered it.
        fix: what to change, as code.
        layer: the layer it is about, or None for the whole run.
        run: the run's name (set by :func:`diagnose` on a logdir).
        why: why it matters (the rule's rationale).
        source: where the rule comes from.
        action: machine-readable advice for :func:`mpwatch.apply_recommendations`
            (``{"dtype": "float32"}`` to keep ``layer`` in float32, ``{"loss_scale": S}``, ...).
        data: the numbers, machine-readable.
    """

    rule: str
    severity: str
    title: str
    evidence: str
    fix: str = ""
    layer: str | None = None
    run: str | None = None
    why: str = ""
    source: str = ""
    action: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, not {self.severity!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (non-finite numbers become None)."""
        return json_safe(asdict(self))

    def at_least(self, severity: str) -> bool:
        return _RANK[self.severity] >= _RANK[severity]


@dataclass(frozen=True)
class Rule:
    id: str
    title: str
    why: str
    threshold: str
    source: str


RULES: dict[str, Rule] = {
    r.id: r
    for r in [
        Rule(
            "output-16bit",
            "Model output computed in 16 bits",
            "A softmax or sigmoid in float16 saturates and rounds: probabilities of 0 or 1, "
            "log(0) in the loss, a loss that stops improving. The guide keeps the model's last "
            "layer (or a final Activation) in float32; it costs nothing measurable.",
            "Any output layer (is_output, else the last layer) whose output or compute dtype is "
            "float16 or bfloat16: error for float16, warning for bfloat16.",
            "TensorFlow mixed precision guide; seed 001 (Dense(10, activation='softmax', "
            "dtype='float32')); seed 004 (layer_activation('softmax', dtype='float32')).",
        ),
        Rule(
            "activation-overflow",
            "Activations overflow or come close to float16's maximum",
            "float16's largest value is 65504; a larger activation becomes inf and every later "
            "value NaN. Within a few doublings of it, one unlucky batch overflows.",
            f"Probe max |activation| > 65504 or non-finite: error; activation headroom below "
            f"{HEADROOM_WARN_BITS:g} bits (max |activation| > 65504/2^{HEADROOM_WARN_BITS:g}): "
            "warning. float16 and pre-flight probes only (bfloat16 has float32's range).",
            "DESIGN.md (max |activation| against 65504); Micikevicius et al. 2017.",
        ),
        Rule(
            "gradient-underflow",
            "Gradients underflow at the loss scale used",
            "Gradient values below float16's smallest subnormal (2^-24) become zero: those "
            "weights stop learning. The probe counts them against a float32 reference, so dead "
            "ReLUs are not counted.",
            f"Latest probe's model-wide underflow fraction > {UNDERFLOW_WARN:g}: warning, > "
            f"{UNDERFLOW_ERROR:g}: error; a layer's > {LAYER_UNDERFLOW_WARN:g}: warning. Without "
            f"a probe: share of subnormal scaled gradients > {SUBNORMAL_WARN:g}: info.",
            "Micikevicius et al. 2017 (loss scaling); seed 003 (values outside FP16's limit are "
            "equated to zero); DESIGN.md (underflow fraction).",
        ),
        Rule(
            "loss-scale",
            "Loss scale stuck low, or far from the recommended one",
            "A dynamic scale that ends at 1 or below no longer protects small gradients (and "
            "usually means the forward pass overflows); far below the probe's recommended scale, "
            "gradients underflow that a larger scale would keep.",
            f"Median scale over the last quarter of steps <= {SCALE_STUCK_LOW:g}: error; "
            f"|log2(scale / recommended)| >= {SCALE_FAR_BITS:g}: warning when below and the "
            f"probe's underflow fraction at the scale used is >= {UNDERFLOW_WARN:g}, otherwise "
            "info (the dynamic scale will grow on its own).",
            "Keras LossScaleOptimizer (starts at 2^15, halves on overflow, doubles after 2000 "
            "good steps); DESIGN.md (recommended scale).",
        ),
        Rule(
            "skipped-steps",
            "Many steps skipped for non-finite gradients",
            "A skipped step is a batch thrown away: the update is dropped and the scale halves. "
            "A few at the start (the scale coming down from 2^15) and one per 2000 steps (a "
            "failed doubling) are normal; more means overflow in the model, not the scale.",
            f"Skipped steps after the first {WARMUP_STEPS} steps, per step: > {SKIP_RATE_WARN:g} "
            f"warning, > {SKIP_RATE_ERROR:g} error; within the first {WARMUP_STEPS}: more than "
            f"{WARMUP_SKIP_ALLOWANCE} warning, more than {WARMUP_SKIP_ERROR} (the scale fell "
            "below 1) error: a NaN storm at the start is no warm-up.",
            "Keras LossScaleOptimizer dynamic scaling; DESIGN.md (skipped step).",
        ),
        Rule(
            "output-rel-error",
            "Layer output differs from float32",
            "A layer whose 16-bit output differs from its float32 reference by more than a few "
            "units of rounding loses information the next layers cannot recover; keep it "
            "float32.",
            "Latest probe's output_rel_error above "
            + ", ".join(f"{k}: {v:g}" for k, v in REL_ERROR_WARN.items())
            + " (float16 rounds at 2^-11, bfloat16 at 2^-8): warning.",
            "DESIGN.md (per-layer output relative error); seed 001 (keep numerically sensitive "
            "layers in float32).",
        ),
        Rule(
            "float32-inside",
            "Layers that already compute in float32",
            "Some layers (LayerNormalization, BatchNormalization under mixed_float16) compute in "
            "float32 inside whatever their policy says; casting them yourself changes nothing "
            "and mpwatch never recommends it.",
            "effective_dtype float32 while the policy computes in 16 bits: info (listed once).",
            "Keras layer implementations; DESIGN.md (report what really happens).",
        ),
        Rule(
            "tensor-core-alignment",
            "Dimensions that are not multiples of 8",
            "Tensor Cores run float16 matrix multiplies and convolutions only when the "
            "dimensions (units, filters, input features, batch size) are multiples of 8; "
            "others fall back to slower kernels.",
            "A settable dimension (units, filters, output_dim, key_dim) of a non-output layer, or "
            "the batch size, not a multiple of 8: warning on a device with Tensor Cores, info "
            "otherwise (16-bit policies only).",
            "Seed 004 (filters multiples of 8, as the documentation says); seed 003; NVIDIA "
            "deep learning performance guide.",
        ),
        Rule(
            "try-mixed-precision",
            "float32 model on hardware that gains from mixed precision",
            "GPUs of compute capability 7.0+ have Tensor Cores for 16-bit math: mixed precision "
            "is often 1.5-3x faster and halves activation memory. bfloat16 (8.0+) needs no loss "
            "scale.",
            "Policy float32 on a GPU with Tensor Cores (or compute capability >= 7.0): info, "
            "with the pre-flight probe's predicted underflow and overflow when recorded.",
            "Seed 000 and 003 (compute capability 7.0+); TensorFlow mixed precision guide.",
        ),
        Rule(
            "mixed-vs-float32",
            "Mixed run compared with a float32 run of the same model",
            "The point of mixed precision is speed and memory at the same loss. Seed 004 found "
            "no speed-up on a V100 for a small CNN: measure it.",
            f"Same model (name and parameter count) in one logdir: step-time ratio above "
            f"{SLOWER_RATIO:g} warning (no speed-up), final training losses differing by more "
            f"than {LOSS_AGREE_REL:.0%} warning; otherwise info with the ratios.",
            "Seed 004 (MPT vs float32 ms/step tables); seed 000 (memory divided by 4, -30% time).",
        ),
        Rule(
            "profile",
            "Where the time goes (profiler)",
            "Casts between float32 and float16 are pure overhead; float32 layers that could run "
            "in 16 bits, or a low 16-bit share of compute, explain a missing speed-up.",
            f"Cast share > {CAST_SHARE_WARN:.0%}: warning; 16-bit share of time < "
            f"{SHARE_16BIT_WARN:.0%} under a 16-bit policy: warning; a float32 layer taking > "
            f"{FLOAT32_LAYER_SHARE:.0%} of time that could compute in 16 bits: info.",
            "Seed 000 (casts on old GPUs and CPUs); seed 002 (GPU performance analysis); "
            "TensorFlow AMP's float32 op list.",
        ),
        Rule(
            "recording",
            "A recording part stopped or was unavailable",
            "Missing data means a missing diagnosis: say which part and why.",
            "Any notice record with level error: warning; info otherwise.",
            "mpwatch notices (contract.py).",
        ),
    ]
}


# --- helpers -------------------------------------------------------------------------------------
def _f(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _fmt(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "n/a"
    if float(x).is_integer() and abs(x) < 1e9:
        return f"{int(x)}"
    if x != 0 and (abs(x) >= 1e5 or abs(x) < 1e-3):
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}g}"


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%" if x < 0.1 else f"{100 * x:.1f}%"


def _log2(x: float) -> float:
    return math.log2(x) if x > 0 else float("-inf")


def _mk(rule: str, severity: str, title: str, evidence: str, **kw: Any) -> Finding:
    r = RULES[rule]
    return Finding(
        rule=rule, severity=severity, title=title, evidence=evidence, why=r.why,
        source=r.source, **kw,
    )  # fmt: skip


def _policy(run: Run) -> str:
    return str(run.info.get("policy") or "")


def _compute_dtype(run: Run) -> str:
    cd = run.info.get("compute_dtype")
    if cd:
        return str(cd)
    pol = _policy(run)
    if pol.startswith("mixed_"):
        return pol[len("mixed_") :]
    if pol:
        return pol
    if len(run.layers) and "compute_dtype" in run.layers:
        vals = run.layers["compute_dtype"].dropna().astype(str)
        if (vals.isin(SIXTEEN_BIT)).any():
            return str(vals[vals.isin(SIXTEEN_BIT)].iloc[0])
        if len(vals):
            return str(vals.iloc[0])
    return ""


def _effective_float32(run: Run) -> set[str]:
    """Layers that compute in float32 inside although their policy is 16-bit."""
    lt = run.layers
    if not len(lt) or "effective_dtype" not in lt or "name" not in lt:
        return set()
    m = (lt["effective_dtype"].astype(str) == "float32") & (
        lt.get("compute_dtype", pd.Series(index=lt.index, dtype=object))
        .astype(str)
        .isin(SIXTEEN_BIT)
    )
    return set(lt.loc[m, "name"].astype(str))


def _layer_row(run: Run, name: str) -> dict[str, Any] | None:
    """The layer table's first row of that name (rules look rows up many times: the name index
    is built once per layer table and kept on the run)."""
    lt = run.layers
    if not len(lt) or "name" not in lt:
        return None
    cached = run.__dict__.get("_advisor_layer_rows")
    if cached is None or cached[0] is not lt:
        rows: dict[str, dict[str, Any]] = {}
        for rec in lt.to_dict("records"):
            rows.setdefault(str(rec["name"]), rec)
        cached = run.__dict__["_advisor_layer_rows"] = (lt, rows)
    return cached[1].get(str(name))


def _keep_float32_fix(name: str, cls: str | None) -> str:
    cls = cls or "Layer"
    return (
        f'keras.layers.{cls}(..., dtype="float32", name="{name}")  # keep {name!r} in float32\n'
        "# or, without editing the model code:\n"
        "model = mpwatch.apply_recommendations(model, findings).model"
    )


def _latest_probe(run: Run, modes: Iterable[str] | None = None) -> tuple[int, dict, pd.DataFrame]:
    """(step, model row, layers table) of the latest probe of these modes; (-1, {}, empty)."""
    pm = run.probe_model
    if not len(pm):
        return -1, {}, pd.DataFrame()
    if modes is not None and "mode" in pm:
        pm = pm[pm["mode"].isin(list(modes))]
        if not len(pm):
            return -1, {}, pd.DataFrame()
    row = pm.sort_values("step").iloc[-1].to_dict()
    step = int(row["step"])
    pl = run.probes
    layers = pl[pl["step"] == step] if len(pl) and "step" in pl else pd.DataFrame()
    return step, row, layers


# --- the rules -----------------------------------------------------------------------------------
def rule_output_16bit(run: Run) -> list[Finding]:
    lt = run.layers
    if not len(lt) or "name" not in lt:
        return []
    if "is_output" in lt and lt["is_output"].fillna(False).astype(bool).any():
        outs = lt[lt["is_output"].fillna(False).astype(bool)]
    else:
        outs = lt.iloc[[-1]]
    if len(outs) > 1 and "class" in outs:
        # a nested model and the layer inside it that makes its output: advise on the layer
        inner = outs[~outs["class"].astype(str).isin(MODEL_CLASSES)]
        outs = inner if len(inner) else outs
    found = []
    for _, row in outs.iterrows():
        out_dt = str(row.get("output_dtype") or row.get("compute_dtype") or "")
        if out_dt not in SIXTEEN_BIT:
            # float32 output: fine (even if compute was 16-bit, e.g. a final Activation float32)
            continue
        bad = out_dt
        name = str(row["name"])
        cls = str(row.get("class") or "Layer")
        sev = "error" if bad == "float16" else "warning"
        found.append(
            _mk(
                "output-16bit",
                sev,
                f"Model output {name!r} ({cls}) is computed in {bad}: keep it float32",
                f"layer {name!r}: policy {row.get('policy')}, compute dtype "
                f"{row.get('compute_dtype')}, output dtype {row.get('output_dtype')}; it is the "
                "model's output",
                fix=(
                    f'keras.layers.{cls}(..., dtype="float32", name="{name}")\n'
                    "# or keep the layer and add a float32 activation after it:\n"
                    'outputs = keras.layers.Activation("softmax", dtype="float32")(x)\n'
                    "# or, without editing the model code:\n"
                    "model = mpwatch.apply_recommendations(model, findings).model"
                ),
                layer=name,
                action={"dtype": "float32", "output": True},
                data={"output_dtype": row.get("output_dtype"), "class": cls},
            )
        )
    return found


def rule_activation_overflow(run: Run) -> list[Finding]:
    step, model, layers = _latest_probe(run, modes=("float16", "preflight"))
    if step < 0:
        return []
    found: list[Finding] = []
    inside = _effective_float32(run)
    first_bad = model.get("first_nonfinite_layer")
    flagged: set[str] = set()
    if isinstance(first_bad, str) and first_bad:
        row = _layer_row(run, first_bad) or {}
        found.append(
            _mk(
                "activation-overflow",
                "error",
                f"Non-finite values first appear in layer {first_bad!r}",
                f"probe at step {step} ({model.get('mode')}): first non-finite layer "
                f"{first_bad!r}; model max |activation| "
                f"{_fmt(_f(model.get('max_abs_activation')))}",
                fix=_keep_float32_fix(first_bad, row.get("class")),
                layer=first_bad,
                action={} if first_bad in inside else {"dtype": "float32"},
                data={"step": step},
            )
        )
        flagged.add(first_bad)
    if not len(layers) or "layer" not in layers:
        return found
    for _, r in layers.iterrows():
        name = str(r["layer"])
        if name in flagged:
            continue
        mx = _f(r.get("max_abs_activation"))
        head = _f(r.get("activation_headroom_bits"))
        nf = r.get("nonfinite")
        nonfinite = (
            bool(nf) if nf is not None and not (isinstance(nf, float) and nf != nf) else False
        )
        if head is None and mx is not None and mx > 0:
            head = math.log2(FLOAT16_MAX / mx)
        raw_mx = r.get("max_abs_activation")
        overflow = nonfinite or (mx is not None and mx > FLOAT16_MAX)
        try:
            overflow = overflow or (raw_mx is not None and math.isinf(float(raw_mx)))
        except (TypeError, ValueError):
            pass
        if not overflow and (head is None or head >= HEADROOM_WARN_BITS):
            continue
        row = _layer_row(run, name) or {}
        sev = "error" if overflow else "warning"
        title = (
            f"Activations of layer {name!r} overflow float16"
            if overflow
            else f"Activations of layer {name!r} come within {head:.1f} doublings of 65504"
        )
        found.append(
            _mk(
                "activation-overflow",
                sev,
                title,
                f"probe at step {step}: max |activation| {_fmt(mx)} (float16 max 65504), "
                f"headroom {_fmt(head)} bits" + ("; non-finite values" if nonfinite else ""),
                fix=_keep_float32_fix(name, row.get("class"))
                + "\n# or normalize / scale the input of this layer",
                layer=name,
                action={} if name in inside else {"dtype": "float32"},
                data={"step": step, "max_abs_activation": mx, "headroom_bits": head},
            )
        )
        flagged.add(name)
    return found


def rule_gradient_underflow(run: Run) -> list[Finding]:
    step, model, layers = _latest_probe(run, modes=("float16",))
    found: list[Finding] = []
    if step >= 0:
        uf = _f(model.get("underflow_fraction"))
        scale = _f(model.get("loss_scale"))
        rec = _f(model.get("recommended_scale"))
        fix = (
            "optimizer = keras.optimizers.LossScaleOptimizer(optimizer, "
            f"initial_scale={rec:g})" if rec else
            "optimizer = keras.optimizers.LossScaleOptimizer(optimizer)  # dynamic scale"
        )  # fmt: skip
        if uf is not None and uf > UNDERFLOW_WARN:
            found.append(
                _mk(
                    "gradient-underflow",
                    "error" if uf > UNDERFLOW_ERROR else "warning",
                    f"{_pct(uf)} of gradient values underflow to zero at loss scale {_fmt(scale)}",
                    f"probe at step {step}: {_fmt(_f(model.get('underflow_count')))} of "
                    f"{_fmt(_f(model.get('ref_nonzero')))} reference-nonzero gradient elements "
                    "are zero in "
                    f"float16 (underflow fraction {_fmt(uf)}) at scale {_fmt(scale)}; "
                    f"recommended scale {_fmt(rec)}",
                    fix=fix,
                    action={"loss_scale": rec} if rec else {},
                    data={
                        "step": step,
                        "underflow_fraction": uf,
                        "loss_scale": scale,
                        "recommended_scale": rec,
                    },
                )  # fmt: skip
            )
        if len(layers) and "underflow_fraction" in layers:
            for _, r in layers.iterrows():
                luf = _f(r.get("underflow_fraction"))
                if luf is None or luf <= LAYER_UNDERFLOW_WARN:
                    continue
                name = str(r["layer"])
                found.append(
                    _mk(
                        "gradient-underflow",
                        "warning",
                        f"{_pct(luf)} of the gradient values of layer {name!r} underflow",
                        f"probe at step {step}: {_fmt(_f(r.get('underflow_count')))} of "
                        f"{_fmt(_f(r.get('ref_nonzero')))} nonzero reference gradient elements of "
                        f"{name!r} are zero at scale {_fmt(scale)}",
                        fix=fix,
                        layer=name,
                        action={"loss_scale": rec} if rec else {},
                        data={"step": step, "underflow_fraction": luf},
                    )
                )
        return found
    # no probe: the training gradients' subnormal share tells precision loss, not underflow
    sub = run.scalar(contract.GRAD_SUBNORMAL_FRACTION)
    if len(sub):
        tail = sub.iloc[-max(1, len(sub) // 4) :]
        med = float(tail.median())
        if med > SUBNORMAL_WARN:
            found.append(
                _mk(
                    "gradient-underflow",
                    "info",
                    f"{_pct(med)} of scaled gradients are float16 subnormals",
                    f"median share of |g*S| < 2^-14 over the last {len(tail)} logged steps: "
                    f"{_fmt(med)} (no probe recorded: true underflow not measured)",
                    fix="mpwatch.MixedPrecisionMonitor(log_dir=..., probe_every=...)"
                    "  # measure underflow against a float32 reference",
                    data={"subnormal_fraction": med},
                )
            )
    return found


def rule_loss_scale(run: Run) -> list[Finding]:
    ls = run.scalar(contract.LOSS_SCALE)
    if not len(ls):
        return []
    found: list[Finding] = []
    tail = ls.iloc[-max(1, len(ls) // 4) :]
    med = float(tail.median())
    if med <= SCALE_STUCK_LOW:
        found.append(
            _mk(
                "loss-scale",
                "error",
                f"Loss scale stuck at {_fmt(med)}",
                f"median dynamic loss scale over the last {len(tail)} logged steps "
                f"(steps {int(tail.index[0])}-{int(tail.index[-1])}): {_fmt(med)}; minimum "
                f"{_fmt(float(ls.min()))}. A scale this low means the forward or backward pass "
                "itself overflows float16.",
                fix="# find the overflowing layer (activation-overflow findings) and keep it "
                'float32:\nkeras.layers.Dense(..., dtype="float32")',
                data={"median_scale": med, "min_scale": float(ls.min())},
            )
        )
    step, model, _ = _latest_probe(run, modes=("float16",))
    rec = _f(model.get("recommended_scale")) if step >= 0 else None
    if rec and med > SCALE_STUCK_LOW:
        bits = _log2(med) - _log2(rec)
        if abs(bits) >= SCALE_FAR_BITS:
            below = bits < 0
            # far below only matters when float16 really loses gradients at the scale used:
            # otherwise Keras' dynamic scaling (x2 every 2000 good steps) is doing its job
            uf = _f(model.get("underflow_fraction"))
            losing = uf is not None and uf >= UNDERFLOW_WARN
            found.append(
                _mk(
                    "loss-scale",
                    "warning" if below and losing else "info",
                    f"Loss scale {_fmt(med)} is {abs(bits):.0f} doublings "
                    f"{'below' if below else 'above'} the recommended {_fmt(rec)}",
                    f"median scale over the last {len(tail)} logged steps {_fmt(med)}; probe at "
                    f"step {step} recommends {_fmt(rec)} (least underflow with a safety margin "
                    "below overflow)"
                    + (
                        f"; underflow at the scale used: {uf:.2%} of the reference's nonzero "
                        "gradient values"
                        if uf is not None
                        else ""
                    ),
                    fix=f"keras.optimizers.LossScaleOptimizer(optimizer, initial_scale={rec:g})",
                    action={"loss_scale": rec},
                    data={"median_scale": med, "recommended_scale": rec, "log2_ratio": bits},
                )
            )
    return found


def rule_skipped_steps(run: Run) -> list[Finding]:
    sk = run.scalar(contract.STEP_SKIPPED)
    if len(sk):
        after = sk[sk.index > WARMUP_STEPS]
        n_steps = len(after)
        n_skip = int((after > 0.5).sum())
        total = int((sk > 0.5).sum())
    else:
        tot = run.scalar(contract.SKIPPED_STEPS_TOTAL)
        if not len(tot):
            return []
        before = tot[tot.index <= WARMUP_STEPS]
        base = float(before.iloc[-1]) if len(before) else 0.0
        last_step = int(tot.index[-1])
        n_steps = max(0, last_step - WARMUP_STEPS)
        n_skip = int(round(float(tot.iloc[-1]) - base))
        total = int(round(float(tot.iloc[-1])))
    rate = n_skip / n_steps if n_steps > 0 else 0.0
    early = total - n_skip  # skipped at or before step WARMUP_STEPS
    sev_rate = None
    if n_steps > 0 and rate > SKIP_RATE_WARN:
        sev_rate = "error" if rate > SKIP_RATE_ERROR else "warning"
    sev_early = None
    if early > WARMUP_SKIP_ALLOWANCE:
        sev_early = "error" if early > WARMUP_SKIP_ERROR else "warning"
    if sev_rate is None and sev_early is None:
        return []
    severity = "error" if "error" in (sev_rate, sev_early) else "warning"
    if sev_rate is not None:
        title = f"{_pct(rate)} of steps skipped for non-finite gradients"
    else:
        title = f"{early} steps skipped for non-finite gradients in the first {WARMUP_STEPS}"
    return [
        _mk(
            "skipped-steps",
            severity,
            title,
            f"{total} steps skipped in all: {early} at or before step {WARMUP_STEPS} (the "
            f"scale's descent from 2^15 explains up to {WARMUP_SKIP_ALLOWANCE}), {n_skip} of "
            f"{max(n_steps, 0)} after it; the dynamic scale expects about 1 per 2000",
            fix="# a model that overflows at any scale: find the layer (activation-overflow) and "
            'keep it float32\nkeras.layers.Dense(..., dtype="float32")',
            data={
                "skipped": n_skip,
                "steps": n_steps,
                "rate": rate,
                "total": total,
                "early": early,
            },
        )
    ]


def rule_output_rel_error(run: Run) -> list[Finding]:
    step, model, layers = _latest_probe(run, modes=("float16", "bfloat16"))
    if step < 0 or not len(layers) or "output_rel_error" not in layers:
        return []
    mode = str(model.get("mode") or "float16")
    thr = REL_ERROR_WARN.get(mode, REL_ERROR_WARN["float16"])
    inside = _effective_float32(run)
    found = []
    for _, r in layers.iterrows():
        err = _f(r.get("output_rel_error"))
        name = str(r["layer"])
        if err is None or err <= thr or name in inside:
            continue
        row = _layer_row(run, name) or {}
        if str(row.get("compute_dtype", "")) == "float32":
            continue
        found.append(
            _mk(
                "output-rel-error",
                "warning",
                f"Output of layer {name!r} differs from float32 by {_pct(err)}: keep it float32",
                f"probe at step {step} ({mode}): output relative error {_fmt(err)} against the "
                f"float32 reference (threshold {thr:g})",
                fix=_keep_float32_fix(name, row.get("class")),
                layer=name,
                action={"dtype": "float32"},
                data={"step": step, "output_rel_error": err, "threshold": thr},
            )
        )
    return found


def rule_float32_inside(run: Run) -> list[Finding]:
    names = sorted(_effective_float32(run))
    if not names:
        return []
    lt = run.layers
    notes = []
    for n in names:
        row = _layer_row(run, n) or {}
        notes.append(
            f"{n} ({row.get('class')}{': ' + str(row['note']) if row.get('note') else ''})"
        )
    return [
        _mk(
            "float32-inside",
            "info",
            f"{len(names)} layer(s) already compute in float32 inside: nothing to change",
            "; ".join(notes[:20]) + (f"; and {len(names) - 20} more" if len(names) > 20 else ""),
            fix="# nothing to do: do not cast these layers yourself",
            data={"layers": names, "count_layers": int(len(lt))},
        )
    ]


def rule_tensor_core_alignment(run: Run) -> list[Finding]:
    if _compute_dtype(run) not in SIXTEEN_BIT:
        return []
    dev = run.info.get("device") or {}
    tc = bool(dev.get("tensor_cores"))
    sev = "warning" if tc else "info"
    where = "" if tc else " (no Tensor Cores on this device: matters when you move to a GPU)"
    found = []
    lt = run.layers
    if len(lt) and "tc_dims" in lt and "name" in lt:
        for _, r in lt.iterrows():
            dims = r.get("tc_dims")
            aligned = r.get("tc_aligned")
            if not isinstance(dims, dict) or aligned is True or bool(r.get("is_output")):
                continue  # an output's units are the number of classes: not the user's choice
            bad = {
                k: v
                for k, v in dims.items()
                if k in SETTABLE_DIMS and isinstance(v, (int, float)) and int(v) % 8
            }
            if not bad:
                continue
            name = str(r["name"])
            cls = str(r.get("class") or "Layer")
            changes = ", ".join(f"{k}={int(v)} -> {_round8(int(v))}" for k, v in bad.items())
            settable = {k: _round8(int(v)) for k, v in bad.items() if k in ("units", "filters")}
            fix = (
                f"keras.layers.{cls}({', '.join(f'{k}={v}' for k, v in settable.items())}, ...)"
                if settable
                else f"# {cls} {name!r}: "
                + ", ".join(f"{k}={_round8(int(v))}" for k, v in bad.items())
            )
            found.append(
                _mk(
                    "tensor-core-alignment",
                    sev,
                    f"Layer {name!r}: {', '.join(bad)} not a multiple of 8",
                    f"{cls} {name!r}: {changes}{where}",
                    fix=fix,
                    layer=name,
                    data={"dims": {k: int(v) for k, v in bad.items()}, "tensor_cores": tc},
                )
            )
    bs = run.info.get("batch_size")
    if isinstance(bs, (int, float)) and int(bs) % 8:
        found.append(
            _mk(
                "tensor-core-alignment",
                sev,
                f"Batch size {int(bs)} is not a multiple of 8",
                f"batch size {int(bs)} -> {_round8(int(bs))}{where}",
                fix=f"model.fit(..., batch_size={_round8(int(bs))})",
                data={"batch_size": int(bs), "tensor_cores": tc},
            )
        )
    return found


def _round8(v: int) -> int:
    return max(8, int(math.ceil(v / 8.0)) * 8)


def rule_try_mixed_precision(run: Run) -> list[Finding]:
    pol = _policy(run)
    if pol and pol != "float32":
        return []
    if not pol and _compute_dtype(run) in SIXTEEN_BIT:
        return []
    if not run.info:
        return []
    dev = run.info.get("device") or {}
    cc = _f(str(dev.get("compute_capability") or "").split(" ")[0] or None)
    gains = bool(dev.get("tensor_cores")) or (
        str(dev.get("type")) == "GPU" and cc is not None and cc >= 7.0
    )
    if not gains:
        return []
    target = "mixed_bfloat16" if cc is not None and cc >= 8.0 else "mixed_float16"
    step, model, layers = _latest_probe(run, modes=("preflight",))
    evidence = (
        f"policy float32 on {dev.get('name') or 'a GPU'} (compute capability "
        f"{dev.get('compute_capability')}, Tensor Cores)"
    )
    keep: list[str] = []
    data: dict[str, Any] = {"target": target, "compute_capability": cc}
    if step >= 0:
        uf = _f(model.get("underflow_fraction"))
        mx = _f(model.get("max_abs_activation"))
        evidence += (
            f"; pre-flight at step {step}: {_pct(uf or 0.0)} of gradient values would underflow "
            f"in float16 at the initial scale {_fmt(_f(model.get('loss_scale')))}, max "
            f"|activation| {_fmt(mx)}"
        )
        data.update({"preflight_underflow_fraction": uf, "preflight_max_abs_activation": mx})
        if len(layers) and "max_abs_activation" in layers:
            mxs = pd.to_numeric(layers["max_abs_activation"], errors="coerce")
            keep = layers.loc[mxs > FLOAT16_MAX / 2**HEADROOM_WARN_BITS, "layer"].astype(str)
            keep = list(keep)
            if keep:
                evidence += f"; would overflow or come close in float16: {', '.join(keep)}"
        data["keep_float32"] = keep
    else:
        evidence += "; no pre-flight probe recorded"
    fix = f'keras.mixed_precision.set_global_policy("{target}")  # before building the model\n'
    fix += "# keep the output float32:\n"
    fix += 'outputs = keras.layers.Activation("softmax", dtype="float32")(x)'
    for k in keep:
        fix += f'\n# and keep {k!r} float32: dtype="float32"'
    return [
        _mk(
            "try-mixed-precision",
            "info",
            f"float32 model on hardware that gains from mixed precision: try {target}",
            evidence,
            fix=fix,
            action={"policy": target},
            data=data,
        )
    ]


def rule_profile(run: Run) -> list[Finding]:
    prof = run.profile
    if not prof:
        return []
    found = []
    cast = _f(prof.get("cast_share"))
    share16 = _f(prof.get("share_16bit"))
    total = _f(prof.get("total_us"))
    if cast is not None and cast > CAST_SHARE_WARN:
        found.append(
            _mk(
                "profile",
                "warning",
                f"{_pct(cast)} of profiled time is spent in Cast ops",
                f"Cast ops {_fmt(_f(prof.get('cast_us')))} us of {_fmt(total)} us over steps "
                f"{prof.get('steps')}",
                fix="# fewer float32<->float16 boundaries: keep neighbouring layers in one dtype; "
                "feed float16 inputs\n"
                "# (on CPUs and pre-Volta GPUs 16-bit math is emulated: use float32 there)",
                data={"cast_share": cast},
            )
        )
    mixed = _compute_dtype(run) in SIXTEEN_BIT
    if mixed and share16 is not None and share16 < SHARE_16BIT_WARN:
        found.append(
            _mk(
                "profile",
                "warning",
                f"Only {_pct(share16)} of compute time runs in 16 bits",
                f"16-bit share of profiled op time {_fmt(share16)} under policy {_policy(run)}",
                fix="# see the per-layer time table: move the heaviest float32 layers to the "
                "mixed policy",
                data={"share_16bit": share16},
            )
        )
    pl = pd.DataFrame()
    t = prof.get("layers")
    if isinstance(t, dict) and "columns" in t:
        pl = pd.DataFrame(t.get("data") or [], columns=t["columns"])
    if mixed and len(pl) and total and "time_32bit_us" in pl:
        inside = _effective_float32(run)
        outputs = set()
        if len(run.layers) and "is_output" in run.layers:
            outputs = set(
                run.layers.loc[run.layers["is_output"].fillna(False).astype(bool), "name"]
            )
        for _, r in pl.iterrows():
            name = str(r.get("layer"))
            t32 = _f(r.get("time_32bit_us")) or 0.0
            if t32 / total <= FLOAT32_LAYER_SHARE or name in inside or name in outputs:
                continue
            row = _layer_row(run, name) or {}
            if str(row.get("compute_dtype")) != "float32":
                continue  # already under a 16-bit policy: its float32 time is Keras' own choice
            found.append(
                _mk(
                    "profile",
                    "info",
                    f"Layer {name!r} spends {_pct(t32 / total)} of profiled time in float32",
                    f"{_fmt(t32)} us in 32-bit ops of {_fmt(total)} us total; policy "
                    f"{row.get('policy')}",
                    fix=f"keras.layers.{row.get('class') or 'Layer'}(..., "
                    f'dtype="{_policy(run) or "mixed_float16"}")  # if its numerics allow',
                    layer=name,
                    data={"time_32bit_us": t32, "share": t32 / total},
                )
            )
    return found


def rule_notices(run: Run) -> list[Finding]:
    out = []
    for n in run.notices:
        lvl = str(n.get("level") or "info")
        out.append(
            _mk(
                "recording",
                "warning" if lvl == "error" else "info",
                f"Recording part {n.get('part')!r}: {n.get('message')}",
                f"notice at step {n.get('step')} (level {lvl})",
                data={"part": n.get("part"), "step": n.get("step")},
            )
        )
    return out


RUN_RULES = (
    rule_output_16bit,
    rule_activation_overflow,
    rule_gradient_underflow,
    rule_loss_scale,
    rule_skipped_steps,
    rule_output_rel_error,
    rule_float32_inside,
    rule_tensor_core_alignment,
    rule_try_mixed_precision,
    rule_profile,
    rule_notices,
)


# --- comparing runs ------------------------------------------------------------------------------
def _model_key(run: Run) -> tuple[Any, Any] | None:
    m = run.info.get("model") or {}
    if not m:
        return None
    return (m.get("name"), m.get("params"))


def compare_runs(mixed: Run, fp32: Run) -> list[Finding]:
    """Step time, memory and loss of a mixed run against a float32 run of the same model."""
    parts = []
    data: dict[str, Any] = {"float32_run": fp32.name, "mixed_run": mixed.name}
    sev = "info"
    problems = []
    st_m, st_f = mixed.scalar(contract.STEP_TIME_MS), fp32.scalar(contract.STEP_TIME_MS)
    if len(st_m) and len(st_f):
        # skip the first interval (tracing, warm-up)
        tm = float((st_m.iloc[1:] if len(st_m) > 1 else st_m).median())
        tf_ = float((st_f.iloc[1:] if len(st_f) > 1 else st_f).median())
        if tf_ > 0:
            ratio = tm / tf_
            data.update({"step_time_ms_mixed": tm, "step_time_ms_float32": tf_,
                         "step_time_ratio": ratio})  # fmt: skip
            parts.append(f"step time {tm:.3g} ms vs {tf_:.3g} ms (x{ratio:.2f}, "
                         f"speed-up {1 / ratio:.2f}x)")  # fmt: skip
            if ratio > SLOWER_RATIO:
                sev = "warning"
                problems.append("no speed-up")
    mm, mf = mixed.scalar(contract.PEAK_MEMORY_MB), fp32.scalar(contract.PEAK_MEMORY_MB)
    if len(mm) and len(mf) and float(mf.max()) > 0:
        r = float(mm.max()) / float(mf.max())
        data.update({"peak_memory_mb_mixed": float(mm.max()),
                     "peak_memory_mb_float32": float(mf.max()), "memory_ratio": r})  # fmt: skip
        parts.append(f"peak memory {float(mm.max()):.4g} MiB vs {float(mf.max()):.4g} MiB "
                     f"(x{r:.2f})")  # fmt: skip
    lm, lf = mixed.scalar(contract.TRAIN_LOSS), fp32.scalar(contract.TRAIN_LOSS)
    if len(lm) and len(lf):
        common = lm.index.intersection(lf.index)
        if len(common):
            k = max(1, len(common) // 10)
            a = float(lm.loc[common[-k:]].mean())
            b = float(lf.loc[common[-k:]].mean())
            rel = abs(a - b) / max(abs(b), 1e-12)
            agree = rel <= LOSS_AGREE_REL
            data.update({"final_loss_mixed": a, "final_loss_float32": b, "loss_rel_diff": rel,
                         "losses_agree": agree, "common_steps": int(len(common))})  # fmt: skip
            parts.append(f"final training loss {a:.4g} vs {b:.4g} ({_pct(rel)} apart: "
                         f"{'agree' if agree else 'DIFFER'})")  # fmt: skip
            if not agree:
                sev = "warning"
                problems.append("losses differ")
    if not parts:
        return []
    title = f"{mixed.name!r} ({_policy(mixed)}) vs {fp32.name!r} (float32)"
    if problems:
        title += ": " + ", ".join(problems)
    fix = "# nothing to change" if sev == "info" else (
        "# no speed-up: check Tensor Cores (compute capability >= 7.0), multiples of 8, and the "
        "profile's Cast share\n# losses differ: see the underflow and output findings"
    )  # fmt: skip
    return [
        _mk("mixed-vs-float32", sev, title, "; ".join(parts), fix=fix, run=mixed.name, data=data)
    ]


def compare_all(runs: Iterable[Run]) -> list[Finding]:
    runs = [r for r in runs if r.info]
    out = []
    f32 = [r for r in runs if _policy(r) == "float32"]
    mixed = [r for r in runs if _policy(r).startswith("mixed_")]
    for m in mixed:
        key = _model_key(m)
        partner = [f for f in f32 if key is not None and _model_key(f) == key]
        if not partner:
            # same model class and parameter count, differently named
            mk = (m.info.get("model") or {}).get("params")
            partner = [f for f in f32 if mk and (f.info.get("model") or {}).get("params") == mk]
        if partner:
            out.extend(compare_runs(m, partner[0]))
    return out


# --- entry points --------------------------------------------------------------------------------
def _sorted(findings: list[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: (-_RANK[f.severity], f.run or "", f.rule))


def diagnose_run(run: Run) -> list[Finding]:
    """Every run-level rule on one Run, most severe first."""
    out: list[Finding] = []
    for rule in RUN_RULES:
        for f in rule(run):
            if f.run is None:
                f.run = run.name
            out.append(f)
    return _sorted(out)


def diagnose_runs(runs: Mapping[str, Run] | Iterable[Run]) -> list[Finding]:
    """Every rule on every run with mpwatch data, plus the mixed-vs-float32 comparisons."""
    items = list(runs.values()) if isinstance(runs, Mapping) else list(runs)
    out: list[Finding] = []
    for r in items:
        if r.has_data:
            out.extend(diagnose_run(r))
    out.extend(compare_all(r for r in items if r.has_data))
    return _sorted(out)


def diagnose(
    run_or_logdir: Run | str | os.PathLike[str] | Mapping[str, Run] | Iterable[Run],
    run: str | None = None,
) -> list[Finding]:
    """Findings for a Run, several Runs, or a logdir (every run in it, or the one named ``run``).

    Most severe first. Each Finding's ``run`` names the run it is about.

    Example:
        >>> findings = diagnose("logs")  # doctest: +SKIP
        >>> [f.title for f in findings if f.severity == "error"]  # doctest: +SKIP
    """
    if isinstance(run_or_logdir, Run):
        return diagnose_run(run_or_logdir)
    if isinstance(run_or_logdir, (str, os.PathLike)):
        if run is not None:
            return diagnose_run(load_run(run_or_logdir, run, warn=False))
        return diagnose_runs(load_runs(run_or_logdir))
    return diagnose_runs(run_or_logdir)
