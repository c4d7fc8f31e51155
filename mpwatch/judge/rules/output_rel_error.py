"""Rule `output-rel-error`: a layer's 16-bit output differs from its float32 reference.

## What it finds
In the latest float16 or bfloat16 probe: the layers that make a 16-bit output error, rather than
pass one on. A layer is such a cause when its output, computed in 16 bits, differs from the same
layer's output in the float32 reference by more than the format's threshold and by more than
{GROWTH:g}x the largest error of its real inputs: the layers feeding it in Keras' graph (the
layer table's `inputs`; a model input brings none; a layer without a measured output brings what
its own inputs bring). A `Multiply` of a squeeze-excite gate with a branch that already differs
only inherits that branch's error: no finding. Records without the graph (written before issue
24, subclassed models) compare with the layer before it in forward order. An error carries
forward: the layers fed by a cause that stay over the threshold (without growing it {GROWTH:g}x
again) are its evidence, not findings. An error that builds up slowly over many
layers (a deep network's rounding, crossing the threshold somewhere) has no such layer and no
finding. Layers that compute in float32 already (their policy, or inside: see `float32-inside`)
are never advised to; nor is a 16-bit model output (`output-16bit` names it). When the probe's
forward pass went non-finite, the first such layer and every layer after it are left to
`activation-overflow` (their errors are its consequences).

A layer far off float32 (at least {SCANNED_ERROR:g}) is run op by op once a fit on its own
16-bit input (``record/probe/op_overflow.py``): where an op inside it overflows (a user's RMSNorm's
``square(x)`` past |x| = 256, whose ``rsqrt(inf)`` turns into 0: a finite output, every value
lost), the finding names that op and its source line, and is an error.

## Why it matters
A layer whose 16-bit output differs from its float32 reference by more than a few units of
rounding loses information the next layers cannot recover; keep it float32. The layers after it
inherit the error and need nothing: one finding per cause.

## Threshold
Latest probe's output relative error above float16: {REL_ERROR_WARN[float16]:g}, bfloat16:
{REL_ERROR_WARN[bfloat16]:g} (float16 rounds at 2^-11, bfloat16 at 2^-8), and above {GROWTH:g}x
the largest error its inputs bring (without the graph: the previous measured layer's): warning,
one per cause, the layers that carry its error on as evidence. (Measured on keras.applications'
MobileNetV2 under mixed_float16: 35 layers between 1% and 1.7%, each at most 1.5x the one before
it: no cause.) Error where an op inside the layer overflows float16 (run op by op).

## Example evidence
```text
Output of layer 'dense' differs from float32 by 2.00%: keep it float32
probe at step 10 (float16): output relative error 0.02 against the float32 reference (threshold
0.01); its inputs bring at most 0.0004 ('conv2d'); the error carries on into 'dense_1',
'dense_2' (up to 2.50%)
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

from typing import Any

from mpwatch import contract
from mpwatch.formats import SCANNED_ERROR
from mpwatch.judge.declare import Cause, Declared
from mpwatch.judge.evidence.graph import inputs_of
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
from mpwatch.judge.rules import activation_overflow, output_16bit
from mpwatch.read.run import Run

#: output relative error above which a layer's 16-bit output is flagged, by probe mode
REL_ERROR_WARN = {"float16": 1e-2, "bfloat16": 5e-2, "preflight": 1e-2}

GROWTH = 2.0  # a cause: more than GROWTH x the error of the layer before it

RULE = Rule(
    id="output-rel-error",
    title="Layer output differs from float32",
    severities=("warning", "error"),
    doc=__doc__,
    thresholds={"REL_ERROR_WARN": REL_ERROR_WARN, "GROWTH": GROWTH,
                "SCANNED_ERROR": SCANNED_ERROR},  # fmt: skip
)


def _brought(
    name: str,
    errs: dict[str, float | None],
    graph: dict[str, list[str] | None],
    memo: dict[str, tuple[float, str | None] | None],
) -> tuple[float, str | None] | None:
    """The error layer ``name``'s output brings to the layers it feeds, and the measured layer it
    comes from: its own when measured; a layer of the table without a measured output brings
    what its inputs bring; a name the table lacks is a model input (0.0, None). None: unknown (a
    layer without recorded inputs)."""
    if name in memo:
        return memo[name]
    memo[name] = None  # a cycle (a shared layer) brings nothing known
    e = errs.get(name)
    if e is not None:
        got: tuple[float, str | None] | None = (e, name)
    elif name not in graph:
        got = (0.0, None)
    else:
        got = _max_of(graph[name], errs, graph, memo)
    memo[name] = got
    return got


def _max_of(
    names: list[str] | None,
    errs: dict[str, float | None],
    graph: dict[str, list[str] | None],
    memo: dict[str, tuple[float, str | None] | None],
) -> tuple[float, str | None] | None:
    """The largest error the layers ``names`` bring (None when one of them is unknown)."""
    if names is None:
        return None
    best: tuple[float, str | None] = (0.0, None)
    for n in names:
        got = _brought(n, errs, graph, memo)
        if got is None:
            return None
        if got[0] > best[0] or best[1] is None and got[1] is not None and got[0] == best[0]:
            best = got
    return best


def _causes(
    order: list[str], errs: dict[str, float | None], thr: float, graph: dict[str, list[str] | None]
) -> list[tuple[list[str], dict[str, Any]]]:
    """Each cause (a layer over ``thr`` and over GROWTH x the largest error its inputs bring, see
    :func:`_brought`; a layer without recorded inputs: the previous measured layer's) with the
    layers it feeds that stay over ``thr`` without growing it GROWTH x again, and what its
    inputs brought (``input_error``, ``source``, ``inputs``: None without the graph)."""
    out: list[tuple[list[str], dict[str, Any]]] = []
    chain: dict[str, list[str]] = {}
    memo: dict[str, tuple[float, str | None] | None] = {}
    prev: tuple[float, str | None] = (0.0, None)
    for name in order:
        e = errs.get(name)
        if e is None:
            continue  # not measured: passes through
        feeders = graph.get(name)
        got = _max_of(feeders, errs, graph, memo)
        if got is None:  # no graph for this layer: the layer before it
            feeders, got = None, prev
        in_err, src = got
        if e > thr and e > GROWTH * in_err:
            chain[name] = [name]
            out.append((chain[name], {"input_error": in_err, "source": src, "inputs": feeders}))
        elif e > thr and src in chain:
            chain[name] = chain[src]
            chain[name].append(name)
        prev = (e, name)
    return out


#: an op inside a layer that overflows (run op by op) is the cause of activation-overflow's
#: consequences; a layer's cause too
DECLARED = Declared(
    causes=(
        Cause(
            "forward overflow",
            when=lambda f: f.severity == "error" and bool(f.data.get("op_overflow")),
            rests=lambda f: f.rule in activation_overflow.OVERFLOW_CONSEQUENCES,
        ),
    ),
    layer_cause=3,
)


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
    graph = {n: inputs_of(run, n) for n in ({*order} | set(_table_names(run)))}
    ops = op_overflows(run)
    found = []
    for block, came in _causes(order, errs, thr, graph):
        name = block[0]
        if computes_float32(run, name) or name in outputs16:
            continue  # a float32 layer's error is not float16's; a 16-bit output: output-16bit
        err = errs[name] or 0.0
        rest = [n for n in block if n != name]
        row = layer_row(run, name) or {}
        evidence = (
            f"probe at step {step} ({mode}): output relative error {fmt(err)} against the "
            f"float32 reference (threshold {thr:g}); " + _came_from(came)
        )
        if rest:
            evidence += (
                f"; the error carries on into {names_list(rest, 4)} (up to "
                f"{pct(max(errs[n] or 0.0 for n in rest))})"
            )
        severity = "warning"
        title = f"Output of layer {name!r} differs from float32 by {pct(err)}: keep it float32"
        op = ops.get(name)
        if op is not None:
            severity, title = "error", _op_title(name, row.get("class"), op, err)
            evidence += "; " + _op_evidence(op)
        found.append(
            RULE.finding(
                severity,
                title,
                evidence,
                fix=keep_float32_fix(name, row.get("class"), run),
                layer=name,
                action={"dtype": "float32"},
                data={
                    "step": step,
                    "output_rel_error": err,
                    "threshold": thr,
                    "downstream": rest,
                    "input_error": came["input_error"],
                    "inputs": came["inputs"],
                    "op_overflow": op,
                },  # fmt: skip
            )
        )
    return found


def op_overflows(run: Run) -> dict[str, dict[str, Any]]:
    """Layer -> the op that overflows inside it (the probes' ``op_overflows``: each layer is run
    op by op once a fit; the latest said of a layer)."""
    out: dict[str, dict[str, Any]] = {}
    for _, payload in run.records.get(contract.KIND_PROBE) or []:
        for rec in payload.get("op_overflows") or []:
            out[str(rec.get("layer"))] = dict(rec)
    return out


def _op_title(name: str, cls: Any, op: dict[str, Any], err: float) -> str:
    what = f"{name!r} ({cls})" if cls else repr(name)
    return (
        f"Inside layer {what}, {op.get('op')} overflows float16: its output is {pct(err)} off "
        "float32's; keep it float32"
    )


def _op_evidence(op: dict[str, Any]) -> str:
    """What running the layer op by op showed."""
    where = f" ({op['source']})" if op.get("source") else ""
    peak = op.get("input_max_abs")
    text = (
        f"run op by op on its own input from the probe's batch: {op.get('op')}{where} is the "
        f"first op whose output is not finite while its inputs are"
        + (f" (its input reaches {fmt(peak)})" if peak is not None else "")
    )
    if op.get("layer_output_finite"):
        text += (
            "; what follows it makes the layer's output finite again (an inf turned into 0 or a "
            "constant): no overflow shows at the layer's output, only this error"
        )
    return text


def _table_names(run: Run) -> list[str]:
    lt = run.layers
    return [str(n) for n in lt["name"]] if len(lt) and "name" in lt else []


def _came_from(came: dict[str, Any]) -> str:
    """What a cause's inputs brought, for its evidence."""
    err, src, feeders = came["input_error"], came["source"], came["inputs"]
    if feeders is None:
        return (
            "it is the first layer measured" if src is None else f"the layer before it: {fmt(err)}"
        )
    if src is None:
        return f"its inputs ({names_list(feeders)}) bring none (the model's inputs)"
    return f"its inputs bring at most {fmt(err)} ({src!r})"
