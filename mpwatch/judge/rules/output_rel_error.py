"""Rule `output-rel-error`: a layer's 16-bit output differs from its float32 reference.

## What it finds
In the latest float16 or bfloat16 probe: the layers that make a 16-bit output error, rather than
pass one on. A layer is such a cause when its output, computed in 16 bits, differs from the same
layer's output in the float32 reference by more than the format's threshold and by more than
{GROWTH:g}x the error of the layer before it (forward order; the first layer's input has none).
An error carries forward: the layers after a cause that stay over the threshold (without growing
it {GROWTH:g}x again) are its evidence, not findings. An error that builds up slowly over many
layers (a deep network's rounding, crossing the threshold somewhere) has no such layer and no
finding. Layers that compute in float32 already (their policy, or inside: see `float32-inside`)
are never advised to; nor is a 16-bit model output (`output-16bit` names it). When the probe's
forward pass went non-finite, the first such layer and every layer after it are left to
`activation-overflow` (their errors are its consequences).

## Why it matters
A layer whose 16-bit output differs from its float32 reference by more than a few units of
rounding loses information the next layers cannot recover; keep it float32. The layers after it
inherit the error and need nothing: one finding per cause.

## Threshold
Latest probe's output relative error above float16: {REL_ERROR_WARN[float16]:g}, bfloat16:
{REL_ERROR_WARN[bfloat16]:g} (float16 rounds at 2^-11, bfloat16 at 2^-8), and above {GROWTH:g}x
the previous layer's (layers without a measured output are skipped over): warning, one per
cause, the layers that carry its error on as evidence. (Measured on keras.applications'
MobileNetV2 under mixed_float16: 35 layers between 1% and 1.7%, each at most 1.5x the one before
it: no cause.)

## Example evidence
```text
Output of layer 'dense' differs from float32 by 2.00%: keep it float32
probe at step 10 (float16): output relative error 0.02 against the float32 reference (threshold
0.01); the layer before it: 0.0004; the error carries on into 'dense_1', 'dense_2' (up to 2.50%)
```

## Fix
```python
keras.layers.Dense(..., dtype="float32", name="dense")  # keep 'dense' in float32
# or, without editing the model code:
model = mpwatch.apply_recommendations(model, findings).model
```

## References
- TensorFlow mixed precision guide: numerically sensitive layers can keep a float32 dtype under
  a mixed policy
  <https://www.tensorflow.org/guide/mixed_precision>
- Micikevicius et al. 2017, Mixed Precision Training: float16's rounding, and the operations kept
  in float32
  <https://arxiv.org/abs/1710.03740>
"""

from __future__ import annotations

from mpwatch.judge.finding import Finding
from mpwatch.judge.rule import (
    Rule,
    computes_float32,
    finite,
    fmt,
    keep_float32_fix,
    layer_row,
    names_list,
    pct,
    probe_overflow,
)
from mpwatch.judge.rules import output_16bit
from mpwatch.read.run import Run

#: output relative error above which a layer's 16-bit output is flagged, by probe mode
REL_ERROR_WARN = {"float16": 1e-2, "bfloat16": 5e-2, "preflight": 1e-2}

GROWTH = 2.0  # a cause: more than GROWTH x the error of the layer before it

RULE = Rule(
    id="output-rel-error",
    title="Layer output differs from float32",
    severities=("warning",),
    doc=__doc__,
    thresholds={"REL_ERROR_WARN": REL_ERROR_WARN, "GROWTH": GROWTH},
)


def _causes(order: list[str], errs: dict[str, float | None], thr: float) -> list[list[str]]:
    """Each cause (a layer over ``thr`` and over GROWTH x the previous measured layer's error)
    with the layers after it that stay over ``thr`` without growing it GROWTH x again."""
    out: list[list[str]] = []
    prev = 0.0
    cur: list[str] | None = None
    for name in order:
        e = errs.get(name)
        if e is None:
            continue  # not measured: passes through
        if e > thr and e > GROWTH * prev:
            cur = [name]
            out.append(cur)
        elif e > thr and cur is not None:
            cur.append(name)
        else:
            cur = None
        prev = e
    return out


def check(run: Run) -> list[Finding]:
    """Findings of this rule on one run."""
    probe = run.latest_probe(modes=("float16", "bfloat16"))
    if probe is None or not len(probe.layers) or "output_rel_error" not in probe.layers:
        return []
    step, model, layers = probe.step, probe.model, probe.layers
    mode = str(model.get("mode") or "float16")
    thr = REL_ERROR_WARN.get(mode, REL_ERROR_WARN["float16"])
    over = probe_overflow(run, probe)
    skip = ({over.root} | over.after) if over is not None else set()
    outputs16 = {f.layer for f in output_16bit.check(run)}
    order: list[str] = []
    errs: dict[str, float | None] = {}
    for r in layers.to_dict("records"):
        name = str(r["layer"])
        if name in skip or name in errs:
            continue
        order.append(name)
        errs[name] = finite(r.get("output_rel_error"))
    found = []
    for block in _causes(order, errs, thr):
        name = block[0]
        if computes_float32(run, name) or name in outputs16:
            continue  # a float32 layer's error is not float16's; a 16-bit output: output-16bit
        err = errs[name] or 0.0
        rest = [n for n in block if n != name]
        row = layer_row(run, name) or {}
        i = order.index(name)
        before = next((errs[n] for n in reversed(order[:i]) if errs[n] is not None), None)
        evidence = (
            f"probe at step {step} ({mode}): output relative error {fmt(err)} against the "
            f"float32 reference (threshold {thr:g}); "
            + (
                "it is the first layer measured"
                if before is None
                else f"the layer before it: {fmt(before)}"
            )  # fmt: skip
        )
        if rest:
            evidence += (
                f"; the error carries on into {names_list(rest, 4)} (up to "
                f"{pct(max(errs[n] or 0.0 for n in rest))})"
            )
        found.append(
            RULE.finding(
                "warning",
                f"Output of layer {name!r} differs from float32 by {pct(err)}: keep it float32",
                evidence,
                fix=keep_float32_fix(name, row.get("class"), run),
                layer=name,
                action={"dtype": "float32"},
                data={
                    "step": step,
                    "output_rel_error": err,
                    "threshold": thr,
                    "downstream": rest,
                },  # fmt: skip
            )
        )
    return found
