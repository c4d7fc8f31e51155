"""Rule `output-16bit`: the model's output is computed in float16 or bfloat16.

## What it finds
The model's output layers (the rows marked `is_output` in the layer table, else the last layer;
for a nested model, the layer inside it that makes the output rather than the model itself) whose
output dtype (or, when none is recorded, compute dtype) is float16 or bfloat16.

## Why it matters
A softmax or sigmoid in float16 saturates and rounds: probabilities of 0 or 1, log(0) in the
loss, a loss that stops improving. The TensorFlow guide keeps the model's last layer (or a final
Activation) in float32; it costs nothing measurable.

## Threshold
Any output layer whose output (or compute) dtype is 16-bit: error for float16, warning for
bfloat16 (bfloat16 has float32's range but rounds at 2^-8). A float32 output after 16-bit compute
(a final `Activation(..., dtype="float32")`) is fine. Info where the latest float16 probe
measured no harm: the whole 16-bit model's loss within {LOSS_EFFECT_INFO:.1%} of float32's and
no step skipped for an overflow of the model's own; never in a pre-flight (no step has run, and
the first weights do not show the saturation a trained softmax reaches: keras.applications'
MobileNetV3Small, finite on its first batch, skipped 5 of its first 20 steps under
mixed_float16 and 1 with its softmax in float32); never where a probe found the pass as the
train step runs it (Dropout on) not finite and finite with the output in float32 (a ViT's
float16 softmax: the fit skips its first steps for it, and none with the output in float32;
the pre-flight runs that pass on its first probe).

An output layer with no weights and no activation of its own (a custom layer that adds the
loss and passes its input on, as keras.io's `CTCLayer`; a `Reshape`) gives what the layers
before it computed: where a softmax or sigmoid reaches it through such layers (at most
{PASS_HOPS} of them) in 16 bits, that activation is the output's, and the finding names it,
whatever the output layer's own dtype (a float32 pass-through takes the probabilities already
rounded, and hands their gradient back in 16 bits: keras.io's captcha OCR under mixed_float16
still skipped steps with only its `CTCLayer` in float32, and stopped with `dense2` too). The
fix keeps every layer from that activation to the output in float32: a 16-bit layer after a
float32 one casts its input back.

## Example evidence
```text
Model output 'predictions' (Dense) is computed in float16: keep it float32
layer 'predictions': policy mixed_float16, compute dtype float16, output dtype float16; it is the
model's output
```

## Fix
Written as the model's code is, from the layer's recorded class, units and activation: Keras'
own classes as `keras.layers.<Class>`, your own classes by their name. A Dense or convolution
output with an activation can also keep its matmul in 16 bits and apply *its own* activation
(sigmoid for a sigmoid output) as a float32 `Activation` named as the output was; a linear
(regression, logits) output is the layer itself in float32, with no activation added. The
classifier of a `keras.applications` model (its `predictions` layer inside a model the builder
named, e.g. `resnet50`), whose constructor you do not write: set in place on the built model
(what `apply_recommendations` does), or through the builder's `classifier_activation`:
```python
keras.layers.Dense(10, ..., activation="softmax", dtype="float32", name="predictions")
# or keep its matmul in 16 bits and apply softmax in float32:
x = keras.layers.Dense(10, ..., activation=None, name="predictions_logits")(x)
outputs = keras.layers.Activation("softmax", dtype="float32", name="predictions")(x)
# a keras.applications classifier:
model = keras.applications.ResNet50(...)  # as you build it, then before compile:
model.get_layer("predictions").dtype_policy = "float32"  # its matmul and softmax in float32
# or keep its matmul in 16 bits and apply softmax in float32:
model = keras.applications.ResNet50(..., classifier_activation=None)
outputs = keras.layers.Activation("softmax", dtype="float32")(model.output)
model = keras.Model(model.input, outputs)
# or, without editing the model code:
model = mpwatch.apply_recommendations(model, findings).model
```

## References
- TensorFlow mixed precision guide: the model's output (the final softmax) is kept in float32
  for numeric stability
  <https://www.tensorflow.org/guide/mixed_precision>
- Keras mixed precision API: a layer's `dtype` argument overrides the global policy
  <https://keras.io/api/mixed_precision/>
"""

from __future__ import annotations

from mpwatch.formats import SIXTEEN_BIT
from mpwatch.judge.declare import Declared
from mpwatch.judge.evidence.graph import APPLY_TAIL, output_fix
from mpwatch.judge.finding import Finding
from mpwatch.judge.rule import Rule, application_of, finite, keep_float32_fix, layer_row
from mpwatch.read.run import Run

#: layer-table classes of a (nested) model, as opposed to the layer that makes its output
MODEL_CLASSES = ("Sequential", "Functional", "Model")

#: activations that saturate in 16 bits (probabilities of exactly 0 or 1)
SATURATING = ("softmax", "sigmoid")
#: weightless, activation-free layers looked through from an output to the activation it passes on
PASS_HOPS = 4

#: a 16-bit output whose whole model's probe loss is within this share of the float32
#: reference's (and no skip of the model's own) has no measurable effect: info
LOSS_EFFECT_INFO = 0.001

RULE = Rule(
    id="output-16bit",
    title="Model output computed in 16 bits",
    severities=("info", "warning", "error"),
    doc=__doc__,
    thresholds={"PASS_HOPS": PASS_HOPS, "LOSS_EFFECT_INFO": LOSS_EFFECT_INFO},
)


def fix_check(run: Run, f: Finding) -> None:
    """The probe's fix checks on this advice: as for any layer kept in float32 (the set grown
    where the output alone did not make the pass finite but a few more layers did), except that
    the advice is never withdrawn: where the output in float32 did not make the overflowing pass
    finite, that is said, and the output stays float32 for what this rule is about, its own
    range and precision (a forecaster's float16 output holds values near 1000 only to steps of
    0.5, whatever brings its backward pass in range: the target standardised)."""
    from mpwatch.judge.evidence.fix_checks import (
        checked_layers,
        latest_checks,
        settle_layers,
        stopped,
    )

    got = checked_layers(run, f.layer)
    if got is not None and got[0] is None:
        f.evidence += (
            f"; {got[1]}: the output in float32 is advised for its own range and precision, "
            "not for that overflow"
        )
        f.data = {**f.data, "checked_layers": None}
        return
    latest = latest_checks(run)
    settle_layers(run, f, stopped(latest[2]) if latest else None)


#: a layer's cause, the first of them (several findings about one layer: this one heads them)
DECLARED = Declared(layer_cause=0, fix_check=fix_check)


def check(run: Run) -> list[Finding]:
    """Findings of this rule on one run."""
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
        out_dt = _dtype(row)
        sources, chain = passed_on(run, row)
        if sources:
            found.append(_passed_on_finding(run, row, out_dt, sources, chain))
            continue
        if out_dt not in SIXTEEN_BIT:
            # float32 output: fine (even if compute was 16-bit, e.g. a final Activation float32)
            continue
        bad = out_dt
        name = str(row["name"])
        cls = str(row.get("class") or "Layer")
        sev = "error" if bad == "float16" else "warning"
        trained = _training_overflow(run, name)
        effect = _measured_effect(run) if trained is None else None
        if effect is not None:
            sev = "info"
        app = application_of(run, name)
        if app is not None:
            fix = keep_float32_fix(name, cls, run)
            where = f"; it is the classifier of keras.applications.{app}, the model's output"
        else:
            fix = output_fix(run, row)
            where = "; it is the model's output"
        act, width = row.get("activation"), finite(row.get("output_width"))
        if isinstance(act, str):
            where += f" ({act}" + (f", width {int(width)}" if width is not None else "") + ")"
        if act == "softmax" and width == 1:
            where += "; a softmax over one unit is always 1.0: a 1-unit output wants a sigmoid"
        if trained is not None:
            step, tm = trained
            draws = tm.get("draws")
            how = (
                f" in {tm['nonfinite_draws']} of {draws} draws of its masks, and finite in "
                f"{tm.get('fixed_draws')} of them with {name!r} in float32"
                if draws else f", and finite with {name!r} in float32"
            )  # fmt: skip
            where += (
                f"; measured: the probe of step {step} found the pass as the train step runs it "
                f"(Dropout on) not finite at loss scale {float(tm['scale']):g}{how}"
            )
        if effect is not None:
            where += (
                f"; measured: the probe of step {effect[0]} found the whole 16-bit model's loss "
                f"within {effect[1]:.2%} of float32's, and no step skipped for the model's own "
                "overflow: no measurable harm yet (info)"
            )
        found.append(
            RULE.finding(
                sev,
                f"Model output {name!r} ({cls}) is computed in {bad}: keep it float32",
                f"layer {name!r}: policy {row.get('policy')}, compute dtype "
                f"{row.get('compute_dtype')}, output dtype {row.get('output_dtype')}{where}",
                fix=fix,
                layer=name,
                action={"dtype": "float32", "output": True},
                data={
                    "output_dtype": row.get("output_dtype"),
                    "class": cls,
                    "application": app,
                    "activation": act if isinstance(act, str) else None,
                },  # fmt: skip
            )
        )
    return no_forward_pass(run, found)


def _measured_effect(run: Run) -> tuple[int, float] | None:
    """(probe step, relative loss change) where the latest reliable float16 probe measured the
    whole 16-bit model's loss within :data:`LOSS_EFFECT_INFO` of its float32 reference's, its
    pass finite, and no step skipped for an overflow of the model's own (a failed doubling, an
    overflow a probe saw, one no bad batch explains); else None (harm measured, or not
    measured: the float16 output's documented hazard keeps its severity)."""
    import math

    from mpwatch.judge.evidence import skip_causes as sc

    if (run.info or {}).get("preflight"):  # no step has run: a softmax saturates as it trains
        return None
    probe = run.latest_probe(modes=("float16",))
    if probe is None or probe.model.get("first_nonfinite_layer"):
        return None
    loss, ref = finite(probe.model.get("loss")), finite(probe.model.get("ref_loss"))
    if loss is None or ref is None or not math.isfinite(loss) or ref == 0:
        return None
    change = abs(loss - ref) / abs(ref)
    if change > LOSS_EFFECT_INFO:
        return None
    groups = sc.by_cause(sc.skip_causes(run))
    if groups["growth"] or groups["model_overflow"] or groups["unexplained"]:
        return None
    return probe.step, change


def _training_overflow(run: Run, name: str) -> tuple[int, dict] | None:
    """(probe step, its ``training_mode`` record) of the last probe whose pass as the train step
    runs it (Dropout on) overflowed and was finite with output ``name`` in float32 (a fit's
    probe after skips, a pre-flight's first probe): the harm measured, whatever the loss."""
    from mpwatch.judge.evidence.skip_causes import training_mode_fixes

    hits = [(st, tm) for st, tm in training_mode_fixes(run) if tm["float32_layers"][0] == name]
    return hits[-1] if hits else None


def _dtype(row: dict) -> str:
    return str(row.get("output_dtype") or row.get("compute_dtype") or "")


def _weightless(row: dict) -> bool:
    """No weights and no activation of its own: what it gives, the layers before it made."""
    params, act = finite(row.get("params")), row.get("activation")
    return params == 0 and (not isinstance(act, str) or act == "linear")


def passed_on(run: Run, row: dict) -> tuple[list[dict], list[str]]:
    """(the 16-bit softmax or sigmoid layers whose output the output layer ``row`` passes on,
    the weightless layers between them and it, nearest the activation first): looked through
    at most :data:`PASS_HOPS` weightless, activation-free layers; none where ``row`` has weights
    or an activation of its own, or the record has no graph columns."""
    if not _weightless(dict(row)):
        return [], []
    sources: list[dict] = []
    chain: list[str] = []
    frontier: list[tuple[dict, list[str]]] = [(dict(row), [])]
    for _ in range(PASS_HOPS + 1):
        nxt: list[tuple[dict, list[str]]] = []
        for r, path in frontier:
            got = r.get("inputs")
            for name in got if isinstance(got, (list, tuple)) else []:
                src = layer_row(run, str(name))
                if src is None or any(s["name"] == src["name"] for s in sources):
                    continue
                if src.get("activation") in SATURATING and _dtype(src) in SIXTEEN_BIT:
                    sources.append(src)
                    chain += [n for n in reversed(path) if n not in chain]
                elif _weightless(src) and len(path) < PASS_HOPS:
                    nxt.append((src, [*path, str(src["name"])]))
        frontier = nxt
    return sources, chain


def _passed_on_finding(
    run: Run, row: dict, out_dt: str, sources: list[dict], chain: list[str]
) -> Finding:
    """The output layer passes on a 16-bit softmax or sigmoid: the activation's layer, the
    layers after it and the output, all float32."""
    name, cls = str(row["name"]), str(row.get("class") or "Layer")
    bits = [_dtype(s) for s in sources] + ([out_dt] if out_dt in SIXTEEN_BIT else [])
    bad = "float16" if "float16" in bits else "bfloat16"
    acts = sorted({str(s["activation"]) for s in sources})
    what = f"the {' and '.join(acts)} of " + ", ".join(repr(str(s["name"])) for s in sources)
    if out_dt in SIXTEEN_BIT:
        title = (
            f"Model output {name!r} ({cls}) passes on {what}, computed in {bad}: keep them float32"
        )
    else:
        title = f"Model output {name!r} ({cls}) takes {what}, computed in {bad}: keep it float32"
    srcs = "; ".join(
        f"{s['name']!r} ({s.get('class')}, {s['activation']}"
        + (f", width {int(finite(s.get('output_width')))}" if finite(s.get("output_width")) else "")
        + f", output dtype {_dtype(s)})"
        for s in sources
    )
    between = f", through {', '.join(repr(n) for n in chain)}" if chain else ""
    evidence = (
        f"layer {name!r}: policy {row.get('policy')}, compute dtype {row.get('compute_dtype')}, "
        f"output dtype {row.get('output_dtype')}; it is the model's output, with no weights and no "
        f"activation of its own: it gives what {srcs} computed{between}; a float32 {name!r} alone "
        f"takes the probabilities already rounded to {bad} and hands their gradient back in {bad}"
    )
    keep = [*(str(s["name"]) for s in sources), *chain]
    lines = [f"# every layer from the {' and '.join(acts)} to the output in float32 (a 16-bit "
             "layer after a float32 one casts it back):"]  # fmt: skip
    lines += [output_fix(run, s).splitlines()[0] for s in sources]
    for n in [*chain, name]:
        r = layer_row(run, n) or {"name": n}
        if (
            n == name
            and out_dt not in SIXTEEN_BIT
            and str(r.get("compute_dtype")) not in SIXTEEN_BIT
        ):
            continue  # already float32
        lines += output_fix(run, r, tail=False).splitlines()
    lines += APPLY_TAIL
    return RULE.finding(
        "error" if bad == "float16" else "warning",
        title,
        evidence,
        fix="\n".join(lines),
        layer=name,
        action={"dtype": "float32", "output": True, "float32_layers": keep},
        data={
            "output_dtype": row.get("output_dtype"),
            "class": cls,
            "application": None,
            "activation": acts[0] if len(acts) == 1 else None,
            "passed_on": [str(s["name"]) for s in sources],
            "through": chain,
        },
    )


def no_forward_pass(run: Run, findings: list[Finding]) -> list[Finding]:
    """A model without a forward pass of its own (a GAN whose ``train_step`` runs sub-models:
    the ``train_step`` record's ``has_call`` False) has no output of its own: a finding about a
    sub-model's output becomes info, saying so (which output reaches a loss in float16 is that
    train step's business). A model holding several models (a Distiller's teacher and student):
    each output said with the sub-model it is the output of."""
    lt = run.layers
    paths = dict(zip(lt["name"].astype(str), lt["path"].astype(str))) if "path" in lt else {}
    owners = {f.layer: paths.get(str(f.layer), "").split("/")[-2:-1] for f in findings}
    if run.train_step.get("has_call") is not False:
        if len({tuple(o) for o in owners.values() if o}) > 1:
            for f in findings:
                if owners[f.layer]:
                    f.evidence = f.evidence.replace(
                        "it is the model's output",
                        f"it is the output of sub-model {owners[f.layer][0]!r}",
                    )
        return findings
    for f in findings:
        f.severity = "info"
        f.title = f"Sub-model output {f.layer!r} is computed in float16"
        # the printed code, applied as printed (by name: not "the model's output")
        f.action = {k: v for k, v in f.action.items() if k != "output"}
        if owners[f.layer]:
            f.evidence = f.evidence.replace(
                "it is the model's output", f"it is the output of sub-model {owners[f.layer][0]!r}"
            )
        f.evidence += (
            "; the model has no forward pass of its own (its train_step runs sub-models): "
            "whether this output reaches a loss in float16 depends on that train_step"
        )
        f.data = {**f.data, "no_forward_pass": True}
    return findings
