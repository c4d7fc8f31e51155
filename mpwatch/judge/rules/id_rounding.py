"""Rule `id-rounding`: integer ids reach a layer as 16-bit floats and are rounded.

## What it finds
A float model input whose values in the probe batch are all integers (token or class ids) that a
layer casts to a 16-bit float on entry (Keras autocasts a float input to the layer's compute
dtype), from the probe's inputs table: how many ids that cast changed, and the largest id.

## Why it matters
float16 holds every integer exactly only up to {FLOAT16_EXACT:g} (bfloat16: {BFLOAT16_EXACT:g}):
above that, ids are rounded to a neighbour (2049 becomes 2048, 19999 becomes 20000, which may not
even be in the vocabulary). The embedding then looks up the wrong rows, silently: training runs,
and the model learns from shuffled tokens. A ``keras.Input`` without ``dtype`` is float32, so a
text model whose first layer is a user's embedding layer (keras.io's "Text classification with
Transformer") is hit under ``mixed_float16``; Keras' own ``Embedding`` does not autocast.

## Threshold
Any id changed by the cast: error. No id changed but the largest id is above
{WARN_FRACTION:g} of the format's exact range: warning (a larger id in another batch will be
rounded).

## Example evidence
```text
Token ids are rounded to float16 before token_and_position_embedding
input 'input_layer' (float32, integer-valued, largest 19998) is cast to float16 by
token_and_position_embedding: 1,689 of 3,200 ids in the probe batch changed (float16 holds
integers exactly only up to 2048)
```

## Fix
```python
inputs = keras.Input(shape=(maxlen,), dtype="int32")  # ids stay integers
```

## References
- Keras mixed precision API: layers cast floating-point inputs to their compute dtype
  <https://keras.io/api/mixed_precision/>
- TensorFlow mixed precision guide: float16's range and precision
  <https://www.tensorflow.org/guide/mixed_precision>
"""

from __future__ import annotations

import pandas as pd

from mpwatch.judge.declare import Declared
from mpwatch.judge.finding import Finding
from mpwatch.judge.rule import Rule, fmt
from mpwatch.read.run import Run

FLOAT16_EXACT = 2.0**11  # every integer up to 2048 is exact in float16 (11 significant bits)
BFLOAT16_EXACT = 2.0**8  # and up to 256 in bfloat16 (8 significant bits)
WARN_FRACTION = 0.5  # warn when the largest id is above half the exact range

_EXACT = {"float16": FLOAT16_EXACT, "bfloat16": BFLOAT16_EXACT}

RULE = Rule(
    id="id-rounding",
    title="Integer ids rounded by a 16-bit cast",
    severities=("warning", "error"),
    doc=__doc__,
    thresholds={
        "FLOAT16_EXACT": FLOAT16_EXACT,
        "BFLOAT16_EXACT": BFLOAT16_EXACT,
        "WARN_FRACTION": WARN_FRACTION,
    },
)


def _rows(run: Run) -> tuple[int, list[dict]] | None:
    probe = run.latest_probe()
    if probe is None or probe.inputs is None or not len(probe.inputs):
        return None
    return probe.step, probe.inputs.to_dict("records")


DECLARED = Declared(layer_cause=2)  # a layer's cause


def check(run: Run) -> list[Finding]:
    """Findings of this rule on one run."""
    got = _rows(run)
    if got is None:
        return []
    step, rows = got
    found = []
    for r in rows:
        target = r.get("cast_to")
        if not r.get("integer_valued") or target not in _EXACT or not r.get("consumers"):
            continue
        exact = _EXACT[target]
        changed = int(r.get("changed") or 0)
        largest = r.get("max_abs")
        consumers = list(r["consumers"])
        who = consumers[0] + (f" (and {len(consumers) - 1} more)" if len(consumers) > 1 else "")
        name, dtype = r.get("input"), r.get("dtype")
        facts = (
            f"input {name!r} ({dtype}, integer-valued, largest {fmt(largest)}) is cast to "
            f"{target} by {', '.join(consumers)}"
        )
        exactness = f"{target} holds integers exactly only up to {exact:g}"
        data = {
            "input": name,
            "consumers": consumers,
            "cast_to": target,
            "changed": changed,
            "size": r.get("size"),
            "max_abs": largest,
            "probe_step": step,
        }
        fix = f'keras.Input(shape=..., dtype="int32")  # input {name!r}: ids stay integers'
        if changed > 0:
            found.append(
                RULE.finding(
                    "error",
                    f"Integer ids are rounded to {target} before {who}",
                    f"{facts}: {changed:,} of {int(r.get('size') or 0):,} values in the probe "
                    f"batch (step {step}) changed ({exactness})",
                    fix=fix,
                    layer=consumers[0],
                    data=data,
                )
            )
        elif largest is not None and not pd.isna(largest) and largest > WARN_FRACTION * exact:
            found.append(
                RULE.finding(
                    "warning",
                    f"Integer ids reach {who} as {target}",
                    f"{facts}: none changed in the probe batch (step {step}), but ids above "
                    f"{exact:g} will be rounded ({exactness})",
                    fix=fix,
                    layer=consumers[0],
                    data=data,
                )
            )
    return found
