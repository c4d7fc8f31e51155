"""Rule `gradient-error`: a layer's 16-bit gradient differs from its float32 reference.

## What it finds
In the latest float16 or bfloat16 probe: the layers whose weight gradient, taken through the
16-bit model, differs from the float32 reference's gradient (same batch, same weights) by more
than the format's threshold (`grad_rel_error` = ||mixed - reference|| / ||reference|| over the
layer's variables) and stands out from the model's other layers (more than {OUTLIER:g}x the
median error of the other layers with weights). A contiguous run of such layers (forward order;
layers without weights pass through) is one finding. Backpropagation carries an error to the
layers before the one it enters at, so the finding is at the run's last 16-bit layer in forward
order, where the error enters the backward pass, with the others as evidence.

A run is left to the rule that names its cause, so that a cause gets one finding: gradients
that underflow (a layer of the run, or the gradient of its output, with more than
{UNDERFLOW_EXPLAINS:.0%} of its reference-nonzero values zero: `gradient-underflow` and
`loss-scale`), an error already present in the forward pass (a layer up to the run's last with
an output error over `output-rel-error`'s threshold), or a non-finite forward pass
(`activation-overflow`). Pre-flight probes (a float32 run) are not judged.

## Why it matters
The optimizer steps along the gradient: a gradient several percent off its float32 value moves
the weights elsewhere than float32 training would, step after step. A small network's 16-bit
gradients are a few units of rounding off (measured: 0.1-0.5% in float16, 1-5% in bfloat16); a
deep one's are off by far more in every layer (measured: a median of 26-43% per layer in
keras.applications' MobileNetV2 under mixed_float16, a network that trains well in mixed
precision): an error shared by every layer is what 16-bit arithmetic does to that network, and
no one layer's fix. A layer whose error stands out from the rest is one.

## Threshold
A layer's gradient relative error above float16: {GRAD_ERROR_WARN[float16]:g}, bfloat16:
{GRAD_ERROR_WARN[bfloat16]:g} (about 100 and 25 units of rounding, 2^-11 and 2^-8), and above
{OUTLIER:g}x the median of the other layers' errors (a model with one layer with weights: the
threshold alone): warning; above {GRAD_ERROR_ERROR:g} (the error as large as half the gradient):
error. One finding per contiguous run, none for a run whose cause another rule names (above).

## Example evidence
```text
Gradient of layer 'embed' differs from float32 by 14.0%: keep it float32
probe at step 30 (float16): gradient relative error 0.14 against the float32 reference
(threshold 0.05; the other layers' median 0.002); 0% of its gradient values underflow; output
relative error 0.0004
```

## Fix
```python
keras.layers.Dense(..., dtype="float32", name="embed")  # keep 'embed' in float32
# or, without editing the model code:
model = mpwatch.apply_recommendations(model, findings).model
```
A run made only of layers that compute in float32 already gets no float32 action: the error comes
from the 16-bit layers after them in the forward pass, which the backward pass reaches first. Nor
does a run whose float32 layers after its last 16-bit layer carry a larger error than it (a
convolution then its BatchNormalization): the error enters the backward pass after that layer.

## References
- Micikevicius et al. 2017, Mixed Precision Training: float16 gradients against float32 training,
  and the operations kept in float32
  <https://arxiv.org/abs/1710.03740>
- TensorFlow mixed precision guide: numerically sensitive layers can keep a float32 dtype under
  a mixed policy
  <https://www.tensorflow.org/guide/mixed_precision>
"""

from __future__ import annotations

from typing import Any

from mpwatch.judge.declare import Declared
from mpwatch.judge.evidence.fix_checks import settle_gradient
from mpwatch.judge.finding import Finding
from mpwatch.judge.rule import (
    Rule,
    computes_float32,
    contiguous_blocks,
    finite,
    fmt,
    keep_float32_fix,
    layer_row,
    names_list,
    pct,
    probe_overflow,
)
from mpwatch.judge.rules.output_rel_error import REL_ERROR_WARN
from mpwatch.read.run import Run

#: gradient relative error above which a layer's gradient is flagged, by probe mode
GRAD_ERROR_WARN = {"float16": 0.05, "bfloat16": 0.10}
GRAD_ERROR_ERROR = 0.5  # an error as large as half the gradient's norm
OUTLIER = 4.0  # a layer's error stands out: more than OUTLIER x the other layers' median
#: a run with a layer whose (weight or output) gradient underflows more than this is underflow's
UNDERFLOW_EXPLAINS = 0.01

RULE = Rule(
    id="gradient-error",
    title="Layer gradient differs from float32",
    severities=("warning", "error"),
    doc=__doc__,
    thresholds={
        "GRAD_ERROR_WARN": GRAD_ERROR_WARN,
        "GRAD_ERROR_ERROR": GRAD_ERROR_ERROR,
        "UNDERFLOW_EXPLAINS": UNDERFLOW_EXPLAINS,
        "OUTLIER": OUTLIER,
    },
)


def _explained(block: list[str], rows: dict[str, dict[str, Any]], order: list[str],
               out_thr: float) -> bool:  # fmt: skip
    """Whether another rule names this run's cause (underflow, or a forward-pass error)."""
    for n in block:
        r = rows[n]
        for col in ("underflow_fraction", "act_grad_underflow_fraction"):
            v = finite(r.get(col))
            if v is not None and v > UNDERFLOW_EXPLAINS:
                return True
    last = max(order.index(n) for n in block)
    for n in order[: last + 1]:
        v = finite(rows[n].get("output_rel_error"))
        if v is not None and v > out_thr:
            return True
    return False


#: a layer's cause; the fix checks judge its advice by the gradient's error brought within the
#: threshold
DECLARED = Declared(
    layer_cause=4, fix_check=lambda run, f: settle_gradient(run, f, GRAD_ERROR_WARN)
)


def check(run: Run) -> list[Finding]:
    """Findings of this rule on one run: one per contiguous run of erring layers."""
    probe = run.latest_probe(modes=("float16", "bfloat16"))
    if probe is None or not len(probe.layers) or "grad_rel_error" not in probe.layers:
        return []
    if probe_overflow(run, probe) is not None:
        return []  # non-finite gradients everywhere: activation-overflow names the cause
    step, model = probe.step, probe.model
    mode = str(model.get("mode") or "float16")
    thr = GRAD_ERROR_WARN.get(mode, GRAD_ERROR_WARN["float16"])
    out_thr = REL_ERROR_WARN.get(mode, REL_ERROR_WARN["float16"])
    rows: dict[str, dict[str, Any]] = {}
    for r in probe.layers.to_dict("records"):
        rows.setdefault(str(r["layer"]), r)
    order = list(rows)
    errs = {n: finite(r.get("grad_rel_error")) for n, r in rows.items()}
    measured = [(n, e) for n, e in errs.items() if e is not None]

    def stands_out(name: str, err: float) -> bool:
        others = sorted(e for n, e in measured if n != name)
        if not others:
            return True
        k = len(others)
        median = others[k // 2] if k % 2 else 0.5 * (others[k // 2 - 1] + others[k // 2])
        return err > OUTLIER * median

    flagged = {n: (None if e is None else e > thr and stands_out(n, e)) for n, e in errs.items()}
    found = []
    for block in contiguous_blocks(order, flagged):
        if _explained(block, rows, order, out_thr):
            continue
        sixteen = [n for n in block if not computes_float32(run, n)]
        name = (sixteen or block)[-1]
        err = errs[name] or 0.0
        worst = max(errs[n] or 0.0 for n in block)
        r = rows[name]
        row = layer_row(run, name) or {}
        uf = finite(r.get("underflow_fraction")) or 0.0
        others = sorted(e for n, e in measured if n not in block)
        evidence = (
            f"probe at step {step} ({mode}): gradient relative error {fmt(err)} against the "
            f"float32 reference (threshold {thr:g}"
            + (f"; the other layers' median {fmt(others[len(others) // 2])}" if others else "")
            + f"); {pct(uf)} of its gradient values underflow; output relative error "
            f"{fmt(finite(r.get('output_rel_error')))}"
        )
        rest = [n for n in block if n != name]
        if rest:
            evidence += f"; the run's other layers: {names_list(rest, 4)} (up to {pct(worst)})"
        # float32 layers after it (forward order) whose error is larger: the backward pass
        # reaches them first, so the error enters after it, and float32 there would not remove it
        later = [n for n in block[block.index(name) + 1 :] if (errs[n] or 0.0) > err]
        if sixteen and later:
            one = len(later) == 1
            fix = (
                f"# {names_list(later)} (float32, after {name!r} in the forward pass) "
                f"{'carries' if one else 'carry'} more of the error than {name!r}: it enters the "
                f"backward pass after {name!r}, from the 16-bit layers that follow "
                f"{'it' if one else 'them'}, and keeping {name!r} in float32 would not remove it"
            )
            action: dict[str, Any] = {}
            title = f"Gradient of layer {name!r} differs from float32 by {pct(err)}"
        elif sixteen:
            fix = keep_float32_fix(name, row.get("class"), run)
            action = {"dtype": "float32"}
            title = (
                f"Gradient of layer {name!r} differs from float32 by {pct(err)}: keep it float32"
            )
        else:
            fix = (
                f"# {names_list(block)} already compute in float32: the error comes from the "
                "16-bit layers after them in the forward pass (before them in the backward pass)"
            )
            action = {}
            title = f"Gradient of layer {name!r} differs from float32 by {pct(err)}"
        found.append(
            RULE.finding(
                "error" if worst > GRAD_ERROR_ERROR else "warning",
                title,
                evidence,
                fix=fix,
                layer=name,
                action=action,
                data={
                    "step": step,
                    "grad_rel_error": err,
                    "threshold": thr,
                    "layers": block,
                    "max_grad_rel_error": worst,
                },  # fmt: skip
            )
        )
    return found
