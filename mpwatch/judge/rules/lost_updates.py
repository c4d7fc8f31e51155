"""Rule `lost-updates`: updates rounded away in 16-bit variables, so layers stagnate.

## What it finds
Layers whose variables are stored in float16 or bfloat16 and whose training steps leave them
unchanged: of the elements a step meant to move (nonzero gradient, step applied), the share whose
value stayed the same, from the ``updates`` records (measured in the train step every
``log_every`` steps: the variable's value before and after the optimizer's update).

## Why it matters
A 16-bit weight moves only when its update is at least half a unit in its last place:
``|w| * 2**-11`` in float16, ``|w| * 2**-8`` in bfloat16. A LayerNormalization scale of 1.0 in
bfloat16 ignores every update below 0.002, and Adam's step at learning rate 1e-3 is about 0.001:
that layer never trains. The loss still falls (other layers move), so nothing else shows it. A
mixed policy keeps the variables in float32 (the "master weights" of mixed-precision training)
and computes in 16 bits: an update is lost there only below ``|w| * 2**-24``.

When no 16-bit weight moved at all, the step itself was zero: Keras' optimizers compute in the
variable's dtype, and Adam's (and AdamW's) default ``beta_2=0.999`` is 1.0 in bfloat16, so its
bias correction ``sqrt(1 - beta_2**t)`` is 0 and so is every step: the model does not train.

## Threshold
A layer whose variables lost at least {LOST_WARN:.0%} of the updates meant for them over the
recorded steps: warning. No layer there but at least {LOST_INFO:.0%} lost model-wide: info.

## Example evidence
```text
Updates lost to rounding: 2 layers stagnate in bfloat16
transformer_block/layernorm1: 100% of 128 updates left the weights unchanged (gamma 100%, beta
0.0%); transformer_block/layernorm2: 96.9% of 128 (steps 4..12, 3 records)
```

## Fix
```python
keras.mixed_precision.set_global_policy("mixed_bfloat16")  # float32 variables, 16-bit math
```

## References
- Micikevicius et al. 2017, Mixed Precision Training: float32 master weights
  <https://arxiv.org/abs/1710.03740>
- Keras mixed precision API: a mixed policy's variables are float32
  <https://keras.io/api/mixed_precision/>
"""

from __future__ import annotations

import math

import pandas as pd

from mpwatch.judge.finding import Finding
from mpwatch.judge.rule import Rule, pct, policy
from mpwatch.read.run import Run

LOST_WARN = 0.5  # a layer losing half of its updates stagnates
LOST_INFO = 0.05  # model-wide share worth a note
BETA_2 = 0.999  # Keras' default for Adam and AdamW
_SIGNIFICAND = {"float16": 11, "bfloat16": 8}  # significant bits, the implicit one included

RULE = Rule(
    id="lost-updates",
    title="Updates lost to rounding in 16-bit variables",
    severities=("info", "warning"),
    doc=__doc__,
    thresholds={"LOST_WARN": LOST_WARN, "LOST_INFO": LOST_INFO},
)


def _layers(up: pd.DataFrame) -> pd.DataFrame:
    """Per layer: updates, unchanged, lost share, its dtypes and its variables' own shares."""
    rows = []
    for layer, part in up.groupby("layer", sort=False):
        updates, unchanged = float(part["updates"].sum()), float(part["unchanged"].sum())
        per_var = []
        for var, v in part.groupby("variable", sort=False):
            u, c = float(v["updates"].sum()), float(v["unchanged"].sum())
            per_var.append((str(var).rsplit("/", 1)[-1], c / u if u else math.nan))
        rows.append(
            {
                "layer": layer,
                "updates": updates,
                "unchanged": unchanged,
                "lost": unchanged / updates if updates else math.nan,
                "dtypes": sorted(set(part["dtype"])),
                "variables": per_var,
            }
        )
    out = pd.DataFrame(rows)
    return out.sort_values("lost", ascending=False, kind="stable") if len(out) else out


def _fix(run: Run, layers: list[str], dtype: str) -> str:
    """The run's global policy stores 16-bit variables: a mixed policy; else the layers' own."""
    mixed = f"mixed_{dtype}"
    if policy(run) in ("float16", "bfloat16"):
        return (
            f'keras.mixed_precision.set_global_policy("{mixed}")  # float32 variables, '
            f"{dtype} math (before building the model)"
        )
    return "\n".join(
        f'# {name}: build it with dtype="{mixed}" (float32 variables, {dtype} math)'
        for name in layers
    )


def rounds_to_one(x: float, dtype: str) -> bool:
    """Whether ``x`` just below 1 rounds to 1.0 in ``dtype`` (below 1 its spacing is
    ``2**-significand``: values within half of it round up).

    >>> rounds_to_one(0.999, "bfloat16"), rounds_to_one(0.999, "float16")
    (True, False)
    """
    return 1.0 - x <= 2.0 ** -(_SIGNIFICAND[dtype] + 1)


def _zero_step(run: Run, dtype: str) -> str:
    """Why every update was lost, where the run says: an Adam-family optimizer in bfloat16."""
    classes = {str(o.get("class")) for o in run.train_step.get("optimizers", [])}
    adam = sorted(classes & {"Adam", "AdamW"})
    if adam and rounds_to_one(BETA_2, dtype):
        return (
            f"; no weight moved at all: {adam[0]} computes in the variables' dtype; at its "
            f"default beta_2={BETA_2}, which is 1.0 in {dtype}, its bias correction "
            "sqrt(1 - beta_2**t) is 0 and so is every step (the model does not train)"
        )
    return (
        "; no weight moved at all: the optimizer's step, computed in the variables' dtype, is 0 "
        "or below every weight's last place"
    )


def check(run: Run) -> list[Finding]:
    """Findings of this rule on one run."""
    up = run.updates
    if up is None or not len(up) or "updates" not in up.columns:
        return []
    per_layer = _layers(up)
    total_u, total_c = float(up["updates"].sum()), float(up["unchanged"].sum())
    if not total_u:
        return []
    steps = sorted(int(s) for s in up["step"].unique())
    span = f"steps {steps[0]}..{steps[-1]}, {len(steps)} records"
    bad = per_layer[per_layer["lost"] >= LOST_WARN]
    dtype = "bfloat16" if any("bfloat16" in d for d in per_layer["dtypes"].sum()) else "float16"
    data = {
        "lost_fraction": total_c / total_u,
        "layers": {r["layer"]: r["lost"] for _, r in per_layer.iterrows()},
        "steps": steps,
    }

    def line(r: pd.Series) -> str:
        inner = ", ".join(f"{n} {pct(f)}" for n, f in r["variables"])
        return (
            f"{r['layer']}: {pct(r['lost'])} of {int(r['updates']):,} updates left the weights "
            f"unchanged ({inner})"
        )

    if len(bad):
        names = list(bad["layer"])
        shown = "; ".join(line(r) for _, r in bad.head(6).iterrows())
        more = f"; and {len(bad) - 6} more" if len(bad) > 6 else ""
        if total_c == total_u:
            more += _zero_step(run, dtype)
        return [
            RULE.finding(
                "warning",
                f"Updates lost to rounding: {len(bad)} layer{'s' * (len(bad) > 1)} stagnate in "
                f"{dtype}",
                f"{shown}{more} ({span}); model-wide {pct(total_c / total_u)} of the updates "
                "were lost",
                fix=_fix(run, names, dtype),
                layer=names[0],
                data=data,
            )
        ]
    if total_c / total_u >= LOST_INFO:
        return [
            RULE.finding(
                "info",
                f"{pct(total_c / total_u)} of the updates to {dtype} variables are lost to "
                "rounding",
                f"{'; '.join(line(r) for _, r in per_layer.head(3).iterrows())} ({span}); no "
                f"layer loses {pct(LOST_WARN)} or more",
                fix=_fix(run, list(per_layer["layer"].head(3)), dtype),
                data=data,
            )
        ]
    return []
