"""Rule `input-range`: the inputs' range, not a layer, makes the model overflow float16.

## What it finds
A probe whose pass went non-finite (activations or scaled gradients) or came within 2^3 of
float16's maximum re-ran it on the same batch and weights under each candidate fix
(``fix_checks``): keeping the blamed layers in float32, and normalizing the inputs. When
normalizing the inputs brings the pass in range (finite, 16-bit activations at least 2^3 below
the maximum) and keeping layers in float32 does not (or only by keeping {MANY_LAYERS} or more of
them: the model in float32), the cause is the inputs' range: raw features (amounts, counts,
pixel values in 0..255) feed float16 layers whose outputs and gradients grow with them. A model
that normalizes its inputs itself (its inputs go first through a `Rescaling` that scales them
down, a `Normalization` or another normalization layer: keras.applications'
`include_preprocessing`) is never told to: the range its layers compute in does not depend on
the inputs' scale, and the probe does not try it (standardized pixels would reach the model's
own rescaling as a nearly constant image: finite, and no fix).

A `Normalization` layer computing in float16 whose mean or variance float16 cannot hold (the
layers record's `cast_constants`: Keras casts them to the layer's dtype once, when it is
adapted, built or loaded; a variance past 65504 is inf) gives 0, NaN or inf for those features:
the model trains on without them, at any loss scale and with no overflow to see (the project's
unnormalized amounts, standard deviation 17000, through a float16 `Normalization`: 4 of 8
features 0, loss 0.693, chance). That is an error of its own, on that layer, probe or not.

## Why it matters
Keeping the first layer in float32 moves the overflow to the next one; diagnosed again, the next
layer is blamed. The loss scale falls to where nothing is protected, and steps are skipped. A
normalized input fixes them all at once and costs nothing in float16 speed.

## Threshold
From the latest probe with fix checks: normalizing the inputs in range, and no candidate of fewer
than {MANY_LAYERS} float32 layers in range. Error when the pass as it is was not finite, warning
when it only came near the maximum.

## Example evidence
```text
checked on step 8's batch at loss scale 2^8 (256): as it is, the scaled gradients are not finite;
keeping 'hidden3' float32: still not finite (the scaled gradients); keeping 'hidden3', 'hidden1',
'hidden2' float32: finite, in range; normalizing the inputs: finite, in range, 16-bit activations
peak at 1.76 (35040 as it is); input 'input_layer' reaches 59687
```

## Fix
```python
norm = keras.layers.Normalization(dtype="float32")  # float32: see below
norm.adapt(x_train)               # the training features, once
x = norm(inputs)                  # first thing the model does with them
```
In float32: under mixed_float16 Keras casts an adapted `Normalization`'s mean and variance to
float16 once, and a feature whose variance is past 65504 (a standard deviation past 256: the
raw amounts that made the model overflow) gets a variance of inf: the layer gives 0 for it, and
the model trains on without that feature (the project's own unnormalized model, fixed with a
float16 `Normalization`: loss 0.693, chance, after one epoch; in float32: 0.514).

## References
- TensorFlow mixed precision guide: values past float16's range overflow to inf
  <https://www.tensorflow.org/guide/mixed_precision>
- NVIDIA, Train With Mixed Precision: keep activations and gradients within float16's range
  <https://docs.nvidia.com/deeplearning/performance/mixed-precision-training/index.html>
"""

from __future__ import annotations

from mpwatch import contract
from mpwatch.formats import FLOAT16
from mpwatch.judge.declare import Cause, Declared
from mpwatch.judge.evidence.fix_checks import checked_on, latest_checks, works
from mpwatch.judge.evidence.graph import APPLY_TAIL, NORMALIZE_FIX
from mpwatch.judge.finding import Finding
from mpwatch.judge.rule import Rule, fmt
from mpwatch.read.run import Run

MANY_LAYERS = 3  # keeping this many layers float32 is the model in float32, not a fix

RULE = Rule(
    id="input-range",
    title="The inputs' range makes the model overflow float16",
    severities=("warning", "error"),
    doc=__doc__,
    thresholds={"MANY_LAYERS": MANY_LAYERS},
)

#: what an input-range finding takes in as its consequences (same run)
CONSEQUENCES = (
    "activation-overflow",
    "skipped-steps",
    "loss-scale",
    "gradient-underflow",
    "gradient-error",
)


#: the inputs' range that makes the model overflow: its consequences rest on it; its
#: cast-constants finding keeps a float16 Normalization float32 (a layer's cause)
DECLARED = Declared(
    causes=(Cause("input range", rests=lambda f: f.rule in CONSEQUENCES),), layer_cause=5
)


def check(run: Run) -> list[Finding]:
    """Findings of this rule on one run."""
    return _lost_features(run) + _range(run)


def _lost_features(run: Run) -> list[Finding]:
    """A 16-bit ``Normalization`` whose cast mean or variance lost features (layers record)."""
    recs = run.records.get(contract.KIND_LAYERS) or []
    lost = (recs[-1][1].get("cast_constants") or {}) if recs else {}
    found = []
    for name, info in lost.items():
        dtype, n, k = info.get("dtype"), info.get("features"), info.get("lost")
        found.append(
            RULE.finding(
                "error",
                f"Normalization {name!r} computes in {dtype}: {k} of {n} features come out 0, "
                f"NaN or inf",
                f"layer {name!r} computes in {dtype}, and Keras cast its mean and variance to "
                f"{dtype} once (when it was adapted or built): for {k} of its {n} features "
                f"they are not finite (a variance past {FLOAT16.max:g}: a standard deviation "
                "past 256) or a variance fell to 0, so it gives x / inf = 0, NaN or inf for "
                "them whatever the loss scale: the model trains without those features",
                fix=(
                    f'keras.layers.Normalization(..., dtype="float32", name="{name}")  # where '
                    "it is created, before adapt()\n"
                    "# or, on the built model: the policy, then its mean and variance again\n"
                    f'model.get_layer("{name}").dtype_policy = "float32"\n'
                    f'model.get_layer("{name}").finalize_state()\n' + "\n".join(APPLY_TAIL)
                ),
                layer=name,
                action={"dtype": "float32"},
                data={"cause": "cast_constants", "dtype": dtype, "features": n, "lost": k},
            )
        )
    return found


def _range(run: Run) -> list[Finding]:
    """The probe's checks: normalizing the inputs fixes the pass, keeping layers float32 not."""
    got = latest_checks(run)
    if got is None:
        return []
    step, scale, checks = got
    norm = next((c for c in checks if c.get("fix") == "normalize_inputs"), None)
    if norm is None or not works(norm):
        return []
    layer_fixes = [
        c for c in checks
        if c.get("fix") == "float32_layers" and works(c)
        and len(c.get("layers") or []) < MANY_LAYERS
    ]  # fmt: skip
    if layer_fixes:
        return []  # a layer kept in float32 fixes it: activation-overflow's finding, checked
    inputs = run.probe_inputs
    peaks = []
    if len(inputs) and {"input", "max_abs", "step"} <= set(inputs.columns):
        at = inputs[inputs["step"] == step]
        peaks = [(str(r["input"]), r["max_abs"]) for _, r in at.iterrows()]
    evidence = checked_on(step, scale, checks)
    if peaks:
        evidence += "; " + ", ".join(f"input {n!r} reaches {fmt(v)}" for n, v in peaks)
    base = next((c for c in checks if c.get("fix") == "none"), {})
    overflow = not base.get("finite", False)
    what = (
        "makes the model overflow float16"
        if overflow
        else "brings the model within 2^3 of float16's maximum"
    )
    return [
        RULE.finding(
            "error" if overflow else "warning",
            f"Normalize the inputs: their range {what} (checked on step {step}'s batch)",
            evidence,
            fix=NORMALIZE_FIX,
            data={
                "cause": "input_range",
                "step": step,
                "fix_checks": checks,
                "input_max_abs": dict(peaks),
            },  # fmt: skip
        )
    ]
