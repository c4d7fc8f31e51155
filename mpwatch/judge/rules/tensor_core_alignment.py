"""Rule `tensor-core-alignment`: layer dimensions or the batch size are not multiples of 8.

## What it finds
Under a 16-bit policy: layers whose settable dimensions ({SETTABLE_DIMS}) are not multiples of
8, and a batch size that is not one (run_info's batch size where Keras gives it, else the size of
the first training batch the probe captured: Keras 3 does not tell callbacks). Never a dimension
the task or the data fixes: a model output's units (the number of classes or targets), also
where the output is a float32 `Activation`, a `Dropout` or a merge after the layer that sets the
width (the layer table's graph: its inputs and output widths), a width merged element-wise with a
model input (the data's feature count), input features and vocabulary sizes (input dimensions,
never in the list).

## Why it matters
Tensor Cores run float16 matrix multiplies and convolutions only when the dimensions (units,
filters, input features, batch size) are multiples of 8; others fall back to slower kernels.

A layer inside a ``keras.applications`` model has the architecture's widths, which no argument
changes: those are one info naming the application and the layers, with nothing to change.

A layer that computes in float32 under the 16-bit policy (its own ``dtype="float32"``, or built
before the policy was set: a frozen teacher, a float32 head) runs no float16 kernel: its
dimensions get no finding.

## Threshold
A settable dimension of a hidden layer that the task does not fix, or the batch size, not a
multiple of 8: warning on a device with Tensor Cores, info otherwise (16-bit policies only).
Input dimensions are left out: they follow from the previous layer (whose own finding covers
them) or from the data. A dimension the task fixes gets no finding (padding the classes is no
fix: the loss and the labels are the task's).

## Example evidence
```text
Layer 'conv2d': filters not a multiple of 8
Conv2D 'conv2d': filters=30 -> 32
```

## Fix
```python
keras.layers.Conv2D(filters=32, ...)
model.fit(..., batch_size=32)
```

## References
- NVIDIA Deep Learning Performance guide, Matrix Multiplication: Tensor Core requirements on
  matrix dimensions (multiples of 8 for float16)
  <https://docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication/index.html>
- TensorFlow mixed precision guide: performance tips, dimensions and batch size in multiples of 8
  <https://www.tensorflow.org/guide/mixed_precision>
- NVIDIA, Train With Mixed Precision: Tensor Core shape constraints
  <https://docs.nvidia.com/deeplearning/performance/mixed-precision-training/index.html>
"""

from __future__ import annotations

import math

from mpwatch.formats import SIXTEEN_BIT
from mpwatch.judge.evidence.graph import WIDTH_DIMS, task_fixed
from mpwatch.judge.finding import Finding
from mpwatch.judge.rule import Rule, compute_dtype, inside_application, layer_constructor
from mpwatch.read.run import Run

# Tensor Core dims the user sets in the layer's constructor (input dims follow from the previous
# layer, or from the data: the previous layer's own finding covers them)
SETTABLE_DIMS = (
    "units",
    "filters",
    "output_dim",
    "key_dim",
    "heads_x_key_dim",
)

RULE = Rule(
    id="tensor-core-alignment",
    title="Dimensions that are not multiples of 8",
    severities=("info", "warning"),
    doc=__doc__,
    thresholds={"SETTABLE_DIMS": SETTABLE_DIMS},
)


def _round8(v: int) -> int:
    return max(8, int(math.ceil(v / 8.0)) * 8)


def check(run: Run) -> list[Finding]:
    """Findings of this rule on one run."""
    if compute_dtype(run) not in SIXTEEN_BIT:
        return []
    dev = run.info.get("device") or {}
    tc = bool(dev.get("tensor_cores"))
    sev = "warning" if tc else "info"
    where = "" if tc else " (no Tensor Cores on this device: matters when you move to a GPU)"
    found = []
    by_app: dict[str, list[tuple[str, str, dict]]] = {}
    lt = run.layers
    fixed = task_fixed(run)
    if len(lt) and "tc_dims" in lt and "name" in lt:
        for _, r in lt.iterrows():
            dims = r.get("tc_dims")
            aligned = r.get("tc_aligned")
            if not isinstance(dims, dict) or aligned is True or bool(r.get("is_output")):
                continue  # an output's units are the number of classes: not the user's choice
            own = r.get("compute_dtype")
            if isinstance(own, str) and own and own not in SIXTEEN_BIT:
                continue  # computes in float32 (its own dtype): no float16 Tensor Core kernel
            bad = {
                k: v
                for k, v in dims.items()
                if k in SETTABLE_DIMS
                and isinstance(v, (int, float))
                and int(v) % 8
                and not (k in WIDTH_DIMS and str(r["name"]) in fixed)  # the task's, not a choice
            }
            if not bad:
                continue
            name = str(r["name"])
            app = inside_application(run, name)
            if app is not None:  # the architecture's own widths: no argument of the user's
                by_app.setdefault(app, []).append((name, str(r.get("class") or "Layer"), bad))
                continue
            cls = str(r.get("class") or "Layer")
            changes = ", ".join(f"{k}={int(v)} -> {_round8(int(v))}" for k, v in bad.items())
            settable = {k: _round8(int(v)) for k, v in bad.items() if k in ("units", "filters")}
            fix = (
                f"{layer_constructor(run, cls)}"
                f"({', '.join(f'{k}={v}' for k, v in settable.items())}, ...)"
                if settable
                else f"# {cls} {name!r}: "
                + ", ".join(f"{k}={_round8(int(v))}" for k, v in bad.items())
            )
            found.append(
                RULE.finding(
                    sev,
                    f"Layer {name!r}: {', '.join(bad)} not a multiple of 8",
                    f"{cls} {name!r}: {changes}{where}",
                    fix=fix,
                    layer=name,
                    data={"dims": {k: int(v) for k, v in bad.items()}, "tensor_cores": tc},
                )
            )
    for app, layers in by_app.items():
        shown = "; ".join(
            f"{cls} {name!r}: " + ", ".join(f"{k}={int(v)}" for k, v in dims.items())
            for name, cls, dims in layers[:6]
        )
        more = f"; and {len(layers) - 6} more" if len(layers) > 6 else ""
        found.append(
            RULE.finding(
                "info",
                f"{len(layers)} layer{'s' * (len(layers) > 1)} of keras.applications.{app}: "
                "widths not multiples of 8 (the architecture's)",
                f"{shown}{more}; keras.applications.{app} sets these widths itself (no argument "
                f"changes them){where}",
                fix=f"# nothing to change in your code: keras.applications.{app}'s own widths",
                data={
                    "application": app,
                    "layers": {n: {k: int(v) for k, v in d.items()} for n, _, d in layers},
                    "tensor_cores": tc,
                },
            )
        )
    bs = run.batch_size  # run_info's (Keras 2), else the probe's first training batch (Keras 3)
    if isinstance(bs, (int, float)) and int(bs) % 8:
        found.append(
            RULE.finding(
                sev,
                f"Batch size {int(bs)} is not a multiple of 8",
                f"batch size {int(bs)} -> {_round8(int(bs))}{where}",
                fix=f"model.fit(..., batch_size={_round8(int(bs))})",
                data={"batch_size": int(bs), "tensor_cores": tc},
            )
        )
    return found
