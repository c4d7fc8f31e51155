"""Rule `activation-overflow`: activations overflow float16, or come close to its maximum.

## What it finds
In the latest float16 probe: the layer where the 16-bit forward pass first goes out of float16's
range (the first layer, in forward order, whose output is non-finite or above {FLOAT16_MAX:g};
where every output is finite, the first layer in backward order whose gradients are not),
as one finding whose evidence holds what followed from it (later layers going non-finite, the
loss, non-finite gradients); and the layers before it whose largest absolute activation leaves
less than {HEADROOM_WARN_BITS:g} doublings of headroom below {FLOAT16_MAX:g}. In a float32 run's
pre-flight probe (a mixed_float16 twin run on the same batch) the same, as a prediction for
mixed_float16.

## Why it matters
float16's largest value is {FLOAT16_MAX:g}; a larger activation becomes inf and every later value
NaN: the layers after it, the loss and every gradient follow, so the first layer is the cause and
the rest is evidence. Within a few doublings of the maximum, one unlucky batch overflows.

## Threshold
float16 probe: the first non-finite or overflowing layer: error (one finding; the layers after it
are not judged on their own: their numbers rest on its output); a layer before it with
activation headroom below {HEADROOM_WARN_BITS:g} bits (max |activation| >
{FLOAT16_MAX:g}/2^{HEADROOM_WARN_BITS:g}): warning. Pre-flight probe (float32 run): the same
layers, info, worded as a prediction for mixed_float16, with no action (the run itself is
float32). bfloat16 probes are not judged (bfloat16 has float32's range). A layer that already
computes in float32 gets no "keep float32" advice: its overflow is not float16's.

## Example evidence
```text
Non-finite values first appear in layer 'logsumexp_pool' (LogSumExpPool): its activations overflow
float16
probe at step 30: output of 'logsumexp_pool' non-finite (max |activation| inf, float16 max 65504);
its input was finite (max 21.6); consequences: non-finite outputs in 'dense', 'dense_1', 'output',
non-finite gradients in 'proj', loss non-finite
```

When the float16 probe's forward pass itself leaves float16's range (an activation, which the
loss scale does not touch), or its gradients are non-finite at a loss scale of 1 or less (no
scale helps: a float16 softmax output's gradient, for one), the run's skipped steps, its stuck
loss scale and its gradient measures are consequences too: `mpwatch.diagnose` folds those
findings (`skipped-steps`, `loss-scale`, `gradient-underflow`, `gradient-error`) into this one,
their titles in its evidence (and this one, where another rule names the same layer, into that
rule's finding: see `output-16bit`).

## Fix
```python
LogSumExpPool(..., dtype="float32", name="logsumexp_pool")  # your class, by its own name
keras.layers.Dense(..., dtype="float32", name="dense")  # one of Keras' own layers
# or, without editing the model code:
model = mpwatch.apply_recommendations(model, findings).model
# or normalize / scale the input of this layer
```
A layer that already computes in float32 inside (see `float32-inside`) gets no float32 action.

## References
- Micikevicius et al. 2017, Mixed Precision Training: float16's range, and the operations kept
  in float32
  <https://arxiv.org/abs/1710.03740>
- NVIDIA, Train With Mixed Precision: float16's dynamic range, and overflow of activations and
  gradients
  <https://docs.nvidia.com/deeplearning/performance/mixed-precision-training/index.html>
"""

from __future__ import annotations

import math
from typing import Any

from mpwatch.formats import FLOAT16
from mpwatch.judge.declare import Cause, Declared
from mpwatch.judge.evidence.fix_checks import NORMALIZE_ALTERNATIVE  # (a fix's other way out)
from mpwatch.judge.evidence.graph import NORMALIZING
from mpwatch.judge.finding import Finding
from mpwatch.judge.rule import (
    HEADROOM_WARN_BITS,
    Overflow,
    Rule,
    computes_float32,
    effective_float32,
    finite,
    fmt,
    keep_float32_fix,
    layer_row,
    names_list,
    probe_overflow,
)
from mpwatch.read.run import ProbeResult, Run
from mpwatch.words import loss_scale


def _alternative(cls: str | None) -> str:
    """The normalize alternative, on its own line; none for a layer that normalizes (its input
    is what it brings into range: normalizing before it is that layer's job)."""
    return "" if cls in NORMALIZING else "\n" + NORMALIZE_ALTERNATIVE


RULE = Rule(
    id="activation-overflow",
    title="Activations overflow or come close to float16's maximum",
    severities=("info", "warning", "error"),
    doc=__doc__,
    thresholds={"HEADROOM_WARN_BITS": HEADROOM_WARN_BITS, "FLOAT16_MAX": FLOAT16.max},
)


def _max(r: dict[str, Any]) -> float | None:
    try:
        x = float(r.get("max_abs_activation"))
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def _consequences(over: Overflow, loss_nonfinite: bool) -> str:
    parts = []
    if over.downstream:
        parts.append(f"non-finite outputs in {names_list(over.downstream, 4)}")
    if over.nonfinite_gradients:
        parts.append(f"non-finite gradients in {names_list(over.nonfinite_gradients, 2)}")
    if loss_nonfinite and over.root != "loss":
        parts.append("loss non-finite")
    return "; consequences: " + ", ".join(parts) if parts else ""


def _root_finding(run: Run, probe: ProbeResult, over: Overflow, preflight: bool) -> Finding:
    step, model = probe.step, probe.model
    rows = {str(r["layer"]): r for r in probe.layers.to_dict("records")} if len(
        probe.layers
    ) and "layer" in probe.layers else {}  # fmt: skip
    root = over.root
    r = rows.get(root, {})
    row = layer_row(run, root) or {}
    cls = row.get("class")
    mx = _max(r)
    loss = finite(model.get("loss"))
    loss_nonfinite = model.get("loss") is not None and loss is None
    what = "non-finite" if over.kind == "non-finite" else f"above {FLOAT16.max:g}"
    order = list(rows)
    before = order[: order.index(root)] if root in order else []
    inp = next((_max(rows[n]) for n in reversed(before) if _max(rows[n]) is not None), None)
    raw = r.get("max_abs_activation")
    try:
        raw_x = float(raw) if raw is not None else None
    except (TypeError, ValueError):
        raw_x = None
    # the forward pass itself left float16's range (an activation, not a scaled gradient): the
    # loss scale neither causes nor cures it
    forward = raw_x is not None and (not math.isfinite(raw_x) or raw_x > FLOAT16.max)
    scale = finite(model.get("loss_scale"))
    head = f"{'pre-flight ' if preflight else ''}probe at step {step}" + (
        " (a mixed_float16 twin of this float32 model)" if preflight else ""
    )
    if root == "loss":
        body = "the loss is non-finite while every layer's output is finite"
    elif forward or root not in rows:
        body = (
            f"output of {root!r} {what} (max |activation| {fmt(mx)}, float16 max {FLOAT16.max:g})"
        )
        if inp is not None and math.isfinite(inp):
            body += f"; the layer before it peaks at {fmt(inp)}"
    else:
        body = (
            f"the forward pass stays finite (max |activation| of {root!r} {fmt(mx)}); the first "
            f"layer, in backward order, whose gradients are non-finite: {root!r}, at loss scale "
            f"{loss_scale(scale)}"
            + (" (a scale of 1 or less: it overflows at any scale)" if scale and scale <= 1 else "")
        )
    evidence = f"{head}: {body}" + _consequences(over, loss_nonfinite)
    data: dict[str, Any] = {
        "step": step,
        "max_abs_activation": mx,
        "downstream": over.downstream,
        "nonfinite_gradients": over.nonfinite_gradients,
        "mode": model.get("mode"),
        "forward": forward,
        "loss_scale": scale,
        # no loss scale helps: the forward pass, or gradients non-finite at a scale of 1 or less
        "any_scale": forward or (scale is not None and scale <= 1),
    }
    label = f"{root!r}" + (f" ({cls})" if cls else "")
    if preflight:
        title = f"Under mixed_float16, activations of layer {label} would overflow float16"
    elif root == "loss":
        title = "The loss overflows float16"
    elif over.kind == "non-finite" and (forward or root not in rows):
        title = f"Non-finite values first appear in layer {label}: its activations overflow float16"
    elif forward or root not in rows:
        title = f"Activations of layer {label} overflow float16"
    else:
        title = f"Non-finite values first appear in the gradients of layer {label}"
    if root == "loss":
        fix = (
            "# the loss is computed from the model's output: keep the output layer float32\n"
            'outputs = keras.layers.Activation("softmax", dtype="float32")(x)'
        )
        action: dict[str, Any] = {}
    elif not preflight and computes_float32(run, root) and root not in effective_float32(run):
        fix = (
            f"# {root!r} already computes in float32: this overflow is not float16's; check "
            "its inputs (scale, normalization) and the learning rate"
        )
        action = {}
    else:
        fix = keep_float32_fix(root, cls, run) + _alternative(cls)
        if preflight:
            fix = "# when you switch to mixed_float16:\n" + fix
        # a pre-flight's too: moot while the model stays float32, kept when the policy that
        # try-mixed-precision advises is applied with it
        action = {} if root in effective_float32(run) else {"dtype": "float32"}
    return RULE.finding(
        "info" if preflight else "error",
        title,
        evidence,
        fix=fix,
        layer=None if root == "loss" else root,
        action=action,
        data=data,
    )


#: the findings that follow from a forward pass that leaves float16's range (non-finite
#: gradients at any scale: skipped steps, a scale driven down, meaningless gradient measures)
OVERFLOW_CONSEQUENCES = ("skipped-steps", "loss-scale", "gradient-underflow", "gradient-error")

#: what no loss scale changes (an activation out of float16's range, or gradients non-finite at
#: a scale of 1 or less) is the cause of OVERFLOW_CONSEQUENCES; a layer's cause too
DECLARED = Declared(
    causes=(
        Cause(
            "forward overflow",
            when=lambda f: f.severity == "error" and bool(f.data.get("any_scale")),
            rests=lambda f: f.rule in OVERFLOW_CONSEQUENCES,
        ),
    ),
    layer_cause=1,
)


def check(run: Run) -> list[Finding]:
    """Findings of this rule on one run."""
    probe = run.latest_probe(modes=("float16", "preflight"))
    if probe is None:
        return []
    preflight = str(probe.model.get("mode")) == "preflight"
    found: list[Finding] = []
    over = probe_overflow(run, probe)
    if over is not None:
        found.append(_root_finding(run, probe, over, preflight))
    layers = probe.layers
    if not len(layers) or "layer" not in layers:
        return found
    skip = {over.root} | over.after if over is not None else set()
    inside = effective_float32(run)
    for r in layers.to_dict("records"):
        name = str(r["layer"])
        if name in skip:
            continue
        mx = _max(r)
        head = finite(r.get("activation_headroom_bits"))
        if head is None and mx is not None and 0 < mx < math.inf:
            head = math.log2(FLOAT16.max / mx)
        if head is None or head >= HEADROOM_WARN_BITS:
            continue
        if mx is not None and mx > FLOAT16.max:
            continue  # a float32 output above 65504 (see probe_overflow): not float16's range
        row = layer_row(run, name) or {}
        out = str(row.get("output_dtype") or row.get("compute_dtype") or "")
        if out == "float32" and not preflight:
            continue  # a float32 output has float32's range (a pre-flight twin's are float16)
        cls = row.get("class")
        label = f"{name!r}" + (f" ({cls})" if cls else "")
        title = (
            f"Under mixed_float16, activations of layer {label} would come within {head:.1f} "
            f"doublings of {FLOAT16.max:g}"
            if preflight
            else f"Activations of layer {label} come within {head:.1f} doublings of {FLOAT16.max:g}"
        )
        fix = keep_float32_fix(name, cls, run) + _alternative(cls)
        if preflight:
            fix = "# when you switch to mixed_float16:\n" + fix
        found.append(
            RULE.finding(
                "info" if preflight else "warning",
                title,
                f"{'pre-flight ' if preflight else ''}probe at step {probe.step}: max "
                f"|activation| {fmt(mx)} (float16 max {FLOAT16.max:g}), headroom {fmt(head)} bits",
                fix=fix,
                layer=name,
                action={} if name in inside else {"dtype": "float32"},
                data={
                    "step": probe.step,
                    "max_abs_activation": mx,
                    "headroom_bits": head,
                    "mode": probe.model.get("mode"),
                },  # fmt: skip
            )
        )
    return found
