"""Rule `output-rel-error`: a layer's 16-bit output differs from its float32 reference.

## What it finds
In the latest float16 or bfloat16 probe: where a layer's output, computed in 16 bits, first
differs from the same layer's output in the float32 reference by more than the format's
threshold. An error carries forward: the layers after it (in forward order) inherit it, so a
contiguous run of such layers is one finding, at its first layer, with the rest as evidence; a
layer in the run whose error is more than {JUMP:g}x the previous one's starts a cause of its own.
Layers that compute in float32 already (their policy, or inside: see `float32-inside`) are never
advised to (they carry the error on); nor is a 16-bit model output (`output-16bit` names it).
When the probe's forward pass went non-finite, the first such layer and every layer after it are
left to `activation-overflow` (their errors are its consequences).

## Why it matters
A layer whose 16-bit output differs from its float32 reference by more than a few units of
rounding loses information the next layers cannot recover; keep it float32.

## Threshold
Latest probe's output relative error above float16: {REL_ERROR_WARN[float16]:g}, bfloat16:
{REL_ERROR_WARN[bfloat16]:g} (float16 rounds at 2^-11, bfloat16 at 2^-8): warning, one per
contiguous run of such layers (layers without a measured output pass through a run). A layer
more than {JUMP:g}x the error of the one before it in a run starts a new one.

## Example evidence
```text
Output of layer 'dense' differs from float32 by 2.00%: keep it float32
probe at step 10 (float16): output relative error 0.02 against the float32 reference (threshold
0.01); the error carries on into 'dense_1', 'dense_2' (up to 2.50%)
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
    contiguous_blocks,
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

JUMP = 4.0  # in a run of erring layers, more than JUMP x the previous layer's error: a new cause

RULE = Rule(
    id="output-rel-error",
    title="Layer output differs from float32",
    severities=("warning",),
    doc=__doc__,
    thresholds={"REL_ERROR_WARN": REL_ERROR_WARN, "JUMP": JUMP},
)


def _runs(order: list[str], errs: dict[str, float | None], thr: float) -> list[list[str]]:
    """Contiguous runs of layers over ``thr`` (None passes through), split where the error jumps
    more than JUMP x."""
    flagged = {n: (None if e is None else e > thr) for n, e in errs.items()}
    out: list[list[str]] = []
    for block in contiguous_blocks(order, flagged):
        cur = [block[0]]
        for n in block[1:]:
            if (errs[n] or 0.0) > JUMP * (errs[cur[-1]] or 0.0):
                out.append(cur)
                cur = [n]
            else:
                cur.append(n)
        out.append(cur)
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
    for block in _runs(order, errs, thr):
        advisable = [n for n in block if not computes_float32(run, n) and n not in outputs16]
        if not advisable:
            continue  # float32 layers carry an error on; a 16-bit output is output-16bit's
        name = advisable[0]
        err = errs[name] or 0.0
        rest = [n for n in block if n != name]
        row = layer_row(run, name) or {}
        evidence = (
            f"probe at step {step} ({mode}): output relative error {fmt(err)} against the "
            f"float32 reference (threshold {thr:g})"
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
