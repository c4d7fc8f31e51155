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
(a final `Activation(..., dtype="float32")`) is fine.

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
named, e.g. `resnet50`) through the builder's `classifier_activation`:
```python
keras.layers.Dense(10, ..., activation="softmax", dtype="float32", name="predictions")
# or keep its matmul in 16 bits and apply softmax in float32:
x = keras.layers.Dense(10, ..., activation=None, name="predictions_logits")(x)
outputs = keras.layers.Activation("softmax", dtype="float32", name="predictions")(x)
# a keras.applications classifier:
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
from mpwatch.judge.finding import Finding
from mpwatch.judge.graph import output_fix
from mpwatch.judge.rule import Rule, application_of, finite, keep_float32_fix
from mpwatch.read.run import Run

#: layer-table classes of a (nested) model, as opposed to the layer that makes its output
MODEL_CLASSES = ("Sequential", "Functional", "Model")

RULE = Rule(
    id="output-16bit",
    title="Model output computed in 16 bits",
    severities=("warning", "error"),
    doc=__doc__,
)


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
        out_dt = str(row.get("output_dtype") or row.get("compute_dtype") or "")
        if out_dt not in SIXTEEN_BIT:
            # float32 output: fine (even if compute was 16-bit, e.g. a final Activation float32)
            continue
        bad = out_dt
        name = str(row["name"])
        cls = str(row.get("class") or "Layer")
        sev = "error" if bad == "float16" else "warning"
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
    return found
