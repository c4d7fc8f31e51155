"""Rule `float8-readiness`: which Dense/EinsumDense layers could train in float8, and which not.

## What it finds
From the latest reliable probe's ``float8`` table: for every Dense and EinsumDense layer, the
error its output and its two gradients would have if Keras trained it in float8
(``quantize("float8")``: E4M3 inputs and kernel, E5M2 output gradient, per-tensor scales from
the tensors' largest values), measured on the probe's batch against the layer in float32, beside
the run's 16-bit error. The layers float8 keeps within the bounds are listed with the code that
converts them (a layer producing a model output is kept out: float8 recipes keep the last layer in
higher precision; by name, or by Keras' own ``layer.path`` where names repeat, as each attention
block's ``query`` does); the others with the reason (values flushed to zero: a few large values
set the scale; or too few mantissa bits for its gradients).

## Why it matters
On GPUs of compute capability 8.9 and above (H100, L4, RTX 40) float8 matmuls run at twice the
16-bit Tensor Core rate and halve the bytes those layers read. float8 keeps 3 (E4M3) or 2 (E5M2)
mantissa bits, so each layer's error grows about ten times over bfloat16's: fine for most
projections, not for a layer whose inputs hold outliers or whose gradients need the precision.
On Keras' JAX backend, measured on an H200 (jax 0.11.2), XLA removed ``quantize("float8")``'s
float8 roundings (unless ``XLA_FLAGS=--xla_allow_excess_precision=false``) and ran no float8
matmul: the finding says so on a JAX GPU run.

## Threshold
Ready: float8 changes the layer's output by at most {READY_OUT:.0%} and both gradients by at most
{READY_GRAD:.0%} of what the run computes now in 16 bits (where the 16-bit values are close to
float32's, as on most layers, that is the error against float32; where the 16-bit run already
loses rows of a gradient, e.g. well-fit examples whose scaled gradient falls below float16's
range, float8 is judged on what it adds, and the 16-bit error is said beside it). Always info
(an opportunity, never a problem of the run).

## Example evidence
```text
float8: 7 of 8 Dense/EinsumDense layers are ready to convert
probe at step 8: ready: query (output 3.8%, gradients 7.0%; bfloat16 0.33%), ...
```

## Fix
```python
keep = {{"predictions"}}  # the layers float8 does not suit, and the model's output layer
model.quantize("float8", filters=lambda layer: layer.name not in keep)  # built model, before fit
```

## References
- Keras quantizers API: float8 training of Dense and EinsumDense
  <https://keras.io/api/quantizers/>
- Micikevicius et al. 2022, FP8 Formats for Deep Learning <https://arxiv.org/abs/2209.05433>
"""

from __future__ import annotations

import pandas as pd

from mpwatch.formats import FLOAT8_LOW_ERROR_SHOWN as LOW_ERROR_SHOWN
from mpwatch.formats import FLOAT8_READY_GRAD as READY_GRAD
from mpwatch.formats import FLOAT8_READY_OUT as READY_OUT
from mpwatch.judge.finding import Finding
from mpwatch.judge.rule import Rule, pct
from mpwatch.read.run import Run

#: measured on an H200 (jax 0.11.2, Keras 3.15.1; benchmarks/float8_real.py, issue 54)
JAX_GPU_CAVEAT = (
    "; on Keras' JAX backend XLA's GPU compiler removes quantize('float8')'s float8 roundings "
    "unless XLA_FLAGS has --xla_allow_excess_precision=false (measured on an H200, jax 0.11.2: "
    "the converted layers computed to bfloat16's error, and with the flag to the errors above), "
    "and it ran no float8 matmul either way: check the compiled program for f8 dots before "
    "counting on float8's speed"
)

RULE = Rule(
    id="float8-readiness",
    title="Layers ready for float8 training",
    severities=("info",),
    doc=__doc__,
    thresholds={"READY_OUT": READY_OUT, "READY_GRAD": READY_GRAD},
)

SHOWN = 8  # layers named in the evidence, each side


def _name(path: str) -> str:
    return str(path).rsplit("/", 1)[-1]


def _paths(rows: pd.DataFrame) -> list[str]:
    if "keras_path" in rows:
        return [str(k) for k in rows["keras_path"]]
    return [str(p) for p in rows["layer"]]


def _output_layers(run: Run) -> set[str]:
    """Names and paths of the layers that produce a model output (the layer table's
    ``is_output``)."""
    lt = run.layers
    if not len(lt) or "is_output" not in lt:
        return set()
    rows = lt[lt["is_output"].astype(bool)]
    return {str(v) for col in ("name", "path") if col in rows for v in rows[col]}


def check(run: Run) -> list[Finding]:
    """Findings of this rule on one run."""
    probe = run.latest_float8()
    if probe is None or not len(probe.float8):
        return []
    t = probe.float8
    mode = str(probe.model.get("mode") or "")
    low = "bfloat16" if mode == "bfloat16" else "float16"
    # a layer that produces a model output stays out (float8 recipes keep the last layer in
    # higher precision; the output-16bit rule keeps a softmax output in float32)
    outputs = _output_layers(run)
    is_out = t["layer"].map(lambda p: _name(p) in outputs or str(p) in outputs)
    kept = t[is_out & t["ready"].astype(bool)]
    ready = t[t["ready"].astype(bool) & ~is_out]
    not_ready = t[~t["ready"].astype(bool)]

    def grads(r: dict) -> float:
        return max(float(r["dx_error_8"]), float(r["dw_error_8"]))

    def low_grads(r: dict) -> str:  # a 16-bit gradient already off float32: said beside
        g16 = max(float(r["dx_error_16"]), float(r["dw_error_16"]))
        return f", its gradients already {pct(g16)}" if g16 > LOW_ERROR_SHOWN else ""

    shown_ready = [
        f"{_name(r['layer'])} (output {pct(r['out_error_8'])}, gradients {pct(grads(r))}; "
        f"{low} {pct(r['out_error_16'])}{low_grads(r)})"
        for r in ready.head(SHOWN).to_dict("records")
    ]
    shown_not = [
        f"{_name(r['layer'])} ({r['reason']})" for r in not_ready.head(SHOWN).to_dict("records")
    ]
    parts = []
    if shown_ready:
        more = f", and {len(ready) - SHOWN} more" if len(ready) > SHOWN else ""
        parts.append("ready: " + ", ".join(shown_ready) + more)
    if shown_not:
        more = f", and {len(not_ready) - SHOWN} more" if len(not_ready) > SHOWN else ""
        parts.append("not ready: " + "; ".join(shown_not) + more)
    if len(kept):
        parts.append(
            "kept out: " + ", ".join(_name(p) for p in kept["layer"]) + " (the model's output: "
            "float8 recipes keep the last layer in higher precision)"
        )
    device = run.info.get("device") or {}
    cc = device.get("compute_capability")  # recorded as text ("9.0"; older runs a number)
    try:
        capability = float(cc) if cc is not None else None
    except (TypeError, ValueError):
        capability = None
    where = (
        f"this GPU (compute capability {cc}) runs float8 matmuls"
        if capability is not None and capability >= 8.9
        else "float8 matmuls need a GPU of compute capability 8.9 or more (H100, L4, RTX 40); "
        f"this run's device: {device.get('name') or device.get('type') or 'unknown'}"
    )
    if str(run.info.get("backend") or "") == "jax" and device.get("type") == "GPU":
        where += JAX_GPU_CAVEAT
    if not len(ready) and not len(not_ready):
        return []  # only the output layer: nothing to convert, nothing float8 fails at
    # quantize's filters match a layer; by name where names are unique, else by Keras' own path
    by_name = t["layer"].map(_name)
    unique = by_name.is_unique or "keras_path" not in t or t["keras_path"].isna().any()
    attr = "name" if unique else "path"

    def keys(rows: pd.DataFrame) -> list[str]:
        return sorted({_name(p) if unique else str(k) for p, k in zip(rows["layer"], _paths(rows))})

    names = keys(ready)
    others = keys(pd.concat([not_ready, kept]))
    if not names:
        fix = f"# nothing to convert: float8 does not suit these layers (keep them in {low})"
    elif not others:
        fix = 'model.quantize("float8")  # every Dense/EinsumDense; built model, before fit'
    elif len(others) < len(names):  # the shorter list: the layers that stay as they are
        fix = (
            f"keep = {{{', '.join(repr(n) for n in others)}}}\n"
            f'model.quantize("float8", filters=lambda layer: layer.{attr} not in keep)'
            "  # built model, before fit"
        )
    else:
        fix = (
            f"ready = {{{', '.join(repr(n) for n in names)}}}\n"
            f'model.quantize("float8", filters=lambda layer: layer.{attr} in ready)'
            "  # built model, before fit"
        )
    return [
        RULE.finding(
            "info",
            f"float8: {len(ready)} of {len(t)} Dense/EinsumDense layers are ready to convert",
            f"probe at step {probe.step}: " + "; ".join(parts) + f" ({where})",
            fix=fix,
            data={
                "step": probe.step,
                "ready": list(ready["layer"]),
                "kept_out": list(kept["layer"]),
                "not_ready": {r["layer"]: r["reason"] for r in not_ready.to_dict("records")},
            },
        )
    ]
