"""Rule `train-step`: the train step breaks mixed precision's contract.

## What it finds
One error for each way the train step itself breaks mixed precision, whatever the model:
- **the loss is not scaled**: the gradients the loss-scale optimizer receives (``grad_variables``)
  are about the float32 reference gradients (the probe's ``ref_max_abs``) instead of the
  reference times the scale S: a custom ``train_step`` that never calls
  ``optimizer.scale_loss``. Where no probe runs (a model whose train step runs sub-models, as
  keras.io's VAE), the train step's own trace says it: mpwatch watches the LossScaleOptimizer's
  ``scale_loss`` while Keras traces the step, and it was never called. The optimizer still
  divides by S, and what that does depends on the optimizer's family (the Keras class it is or
  derives from): SGD's every update is 1/S of the right one and training stalls (an error); an
  adaptive optimizer (Adam, AdamW, Nadam, Adamax, RMSprop) divides the factor out again except
  against its epsilon, so its updates shrink where a gradient is below S x epsilon (RMSprop:
  S x sqrt(epsilon)), a floor the scale raises as it doubles (unscaled gradients never overflow
  to stop it); one that normalizes its update (Lion, Lamb, Adafactor, Muon) divides it out
  whole; for these two the float16 backward pass still runs without the factor that keeps
  small gradients from flushing to zero (a warning). Any other optimizer (Adagrad, whose
  accumulator starts at a floor of its own, Ftrl, Adadelta) gets every gradient 1/S of its
  size (an error). (Scaled twice: about S² times the reference, the gradients overflow.)
- **an optimizer steps without loss scaling** under a float16 compute dtype: a GAN's
  ``d_optimizer``/``g_optimizer``, or a model compiled with ``auto_scale_loss=False``; float16
  gradients underflow and nothing skips an overflowing step. When the compiled optimizer never
  stepped while others did, its loss scale (the one mpwatch records) says nothing.
- **16-bit variables**: the pure ``"float16"`` policy (or a layer's ``dtype="float16"``) keeps
  weights and optimizer state in float16: updates below 2^-11 of a weight round away, Adam's
  second moment underflows, and Keras adds no loss scaling (with the updates the steps really
  lost, where measured: the ``lost-updates`` rule's finding folds into this one). bfloat16
  variables, where measured, are left to ``lost-updates`` alone (what the steps really did).

## Why it matters
Every other measure of mixed precision (underflow, overflow, the loss scale's health) assumes
this contract; when it is broken they measure the wrong thing. A broken contract is the cause,
and the findings that rest on it become its evidence.

## Threshold
Unscaled loss: the median, over variables and probes, of log2(received max |g| / reference
max |g|) - log2 S below -log2 S / 2, comparing only gradient records taken at a scale of at least
2^{MIN_SCALE_LOG2} (received and reference gradients come from other batches, Dropout on in one and
off in the other: a few doublings apart); scaled twice: above ({TWICE_FACTOR:g} - 1) x log2 S.
Without comparisons (no probe): the train step's trace called ``scale_loss`` 0 times, at a scale of
at least 2 (a loss multiplied by ``optimizer.dynamic_scale`` by hand, not through ``scale_loss``,
would be taken for unscaled there; with a probe the gradients decide). An optimizer "steps" when its
iterations advanced during the run. Errors, except bfloat16 variables and an unscaled loss under an
adaptive optimizer (warnings).

## Example evidence
```text
the optimizer received gradients 2^0.3 times the float32 reference (median of 4 variables, 12
comparisons), where a scaled loss gives 2^15 (32768) (the loss scale): the loss was not multiplied
by the scale, and LossScaleOptimizer divides by it: every update is 2^-15 of the right one
```

## Fix
```python
# in your train_step (TensorFlow):
with tf.GradientTape() as tape:
    y_pred = self(x, training=True)
    loss = self.compute_loss(y=y, y_pred=y_pred)
    scaled_loss = self.optimizer.scale_loss(loss)
gradients = tape.gradient(scaled_loss, self.trainable_variables)
self.optimizer.apply(gradients, self.trainable_variables)  # unscales, skips non-finite steps
# a model without a forward pass of its own (a VQ-VAE or VAE trainer whose train step runs its
# sub-models): its own forward pass and loss, as they are, scaled the same way
```

## References
- Keras LossScaleOptimizer: `scale_loss` multiplies the loss, `apply` divides the gradients by
  the scale and skips non-finite steps <https://keras.io/api/optimizers/loss_scale_optimizer/>
- Keras mixed precision API: `mixed_float16` keeps variables in float32; the pure `float16`
  policy does not <https://keras.io/api/mixed_precision/>
- Micikevicius et al. 2017, Mixed Precision Training: a float32 master copy of the weights and
  loss scaling are both needed <https://arxiv.org/abs/1710.03740>
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from mpwatch import contract, words
from mpwatch.formats import SIXTEEN_BIT
from mpwatch.judge.declare import Cause, Declared
from mpwatch.judge.finding import Finding
from mpwatch.judge.rule import Rule, compute_dtype, fmt, names_list, pct
from mpwatch.read.run import Run

# below 2**8 a loss scaled once, never or twice are too close to tell apart: received and
# reference gradients come from other batches (Dropout on in training, off in the probe: up to
# about 2**2 apart), so the verdict needs log2 S / 2 >= 4 bits of margin either way
MIN_SCALE_LOG2 = 8
TWICE_FACTOR = 1.5  # above 1.5 x log2 S: the loss was scaled twice
MIN_COMPARISONS = 3  # variables x probes compared before judging

RULE = Rule(
    id="train-step",
    title="The train step breaks mixed precision's contract",
    severities=("warning", "error"),
    doc=__doc__,
    thresholds={"MIN_SCALE_LOG2": MIN_SCALE_LOG2, "TWICE_FACTOR": TWICE_FACTOR},
)

#: rules whose findings rest on the train step's contract: when it is broken they become evidence
#: of this rule's finding (its ``DECLARED`` cause, :mod:`mpwatch.judge.folds`)
RESTS_ON_CONTRACT = (
    "gradient-underflow", "loss-scale", "skipped-steps", "gradient-error", "lost-updates"
)  # fmt: skip


#: the train step's contract broken (an unscaled loss, an optimizer stepping without loss
#: scaling, 16-bit variables): what rests on the contract measured a train step that does not
#: exist (and an activation-overflow found only in the gradients, at a scale never used)
DECLARED = Declared(
    causes=(
        Cause(
            "train step contract",
            when=lambda f: f.severity == "error" or f.data.get("cause") == "loss_not_scaled",
            rests=lambda f: f.rule in RESTS_ON_CONTRACT
            or (f.rule == "activation-overflow" and not f.data.get("forward", True)),
            worst=True,
        ),
    )
)


def check(run: Run) -> list[Finding]:
    """Findings of this rule on one run."""
    out: list[Finding] = []
    variables = _variables_16bit(run)
    if variables is not None:
        out.append(variables)
    optimizers = _unscaled_optimizers(run, already=variables is not None)
    if optimizers is not None:
        out.append(optimizers)
    loss = _loss_not_scaled(run)
    if loss is not None:
        out.append(loss)
    return out


# --- 16-bit variables ----------------------------------------------------------------------------
def _variables_16bit(run: Run) -> Finding | None:
    measured = len(run.updates) > 0 and "updates" in run.updates.columns
    var_dtype = str(run.info.get("variable_dtype") or "")
    lt = run.layers
    layers: list[str] = []
    if len(lt) and {"variable_dtype", "name"} <= set(lt.columns):
        params = lt["trainable_params"] if "trainable_params" in lt else lt.get("params")
        has = params.fillna(0).astype(float) > 0 if params is not None else True
        m = lt["variable_dtype"].astype(str).isin(SIXTEEN_BIT) & has
        layers = [str(n) for n in lt.loc[m, "name"]]
    if var_dtype not in SIXTEEN_BIT and not layers:
        return None
    dtype = (
        var_dtype
        if var_dtype in SIXTEEN_BIT
        else str(lt.loc[lt["name"].astype(str) == layers[0], "variable_dtype"].iloc[0])
    )
    if measured and dtype != "float16":
        return None  # measured: the lost-updates rule judges what the steps really did
    policy = str(run.info.get("policy") or "")
    whole = var_dtype in SIXTEEN_BIT
    mixed = f"mixed_{dtype}"
    where = (
        f"the policy {policy!r} keeps every variable in {dtype}"
        if whole
        else f"{len(layers)} layer(s) keep their variables in {dtype}: {names_list(layers)}"
    )
    scaled = any(o.get("loss_scaled") for o in run.train_step.get("optimizers", []))
    if not run.train_step:
        scaled = str((run.info.get("loss_scale") or {}).get("kind")) == "dynamic"
    ulp = 11 if dtype == "float16" else 8
    evidence = (
        f"{where}: an update smaller than 2^-{ulp} of a weight rounds away, and the optimizer's "
        f"state (Adam's second moment g²) is {dtype} too"
        + ("" if scaled or dtype != "float16" else "; no optimizer scales the loss")
        + _loss_trend(run)
        + (_measured_losses(run) if measured else "")
    )
    if whole:
        fix = (
            f'keras.mixed_precision.set_global_policy("{mixed}")  # {dtype} math, float32 '
            "variables" + (", loss scaling" if dtype == "float16" else "")
        )
    else:
        fix = (
            "\n".join(f'keras.layers.<Layer>(..., dtype="{mixed}", name="{n}")' for n in layers[:3])
            + f"  # {dtype} math, float32 variables"
        )
    return RULE.finding(
        "error" if dtype == "float16" else "warning",
        f"Variables in {dtype}: the weights cannot take small updates"
        + (f" (use {mixed})" if whole else ""),
        evidence,
        fix=fix,
        action={"policy": mixed} if whole else {},
        data={"cause": "variables_16bit", "dtype": dtype, "layers": layers, "policy": policy},
    )


def _measured_losses(run: Run) -> str:
    """The updates the steps really lost (the ``updates`` records), model-wide."""
    up = run.updates
    total = float(up["updates"].sum())
    if not total:
        return ""
    steps = sorted(int(s) for s in up["step"].unique())
    return (
        f"; measured: {pct(float(up['unchanged'].sum()) / total)} of the updates meant for "
        f"them left the weights unchanged (steps {steps[0]}..{steps[-1]})"
    )


def _loss_trend(run: Run) -> str:
    loss = run.scalar(contract.TRAIN_LOSS).dropna()
    if len(loss) < 2:
        return ""
    first, last = float(loss.iloc[0]), float(loss.iloc[-1])
    if not math.isfinite(last) or last > first:
        return f"; the training loss went from {fmt(first)} to {fmt(last)}"
    return ""


# --- optimizers that step without loss scaling ---------------------------------------------------
def _stepped(o: dict[str, Any]) -> bool:
    try:
        return int(o.get("iterations") or 0) > int(o.get("iterations_start") or 0)
    except (TypeError, ValueError):
        return False


def _unscaled_optimizers(run: Run, already: bool) -> Finding | None:
    if compute_dtype(run) != "float16":
        return None
    opts = run.train_step.get("optimizers") or []
    unscaled = [o for o in opts if _stepped(o) and not o.get("loss_scaled")]
    if not unscaled or (already and all(o.get("compiled") for o in unscaled)):
        return None  # the pure float16 policy's optimizer: that finding names the cause
    idle = [o for o in opts if o.get("compiled") and not _stepped(o) and o.get("loss_scaled")]
    names = [str(o.get("name")) for o in unscaled]
    owner = run.train_step.get("train_step_owner")
    evidence = (
        "; ".join(
            f"{o.get('name')!r} ({o.get('class')}) stepped "
            f"{int(o.get('iterations', 0)) - int(o.get('iterations_start', 0))} times without a "
            "loss scale"
            for o in unscaled
        )
        + ": under float16 math its gradients underflow (nothing scales them up) and an "
        "overflowing step is applied, not skipped"
    )
    if idle:
        evidence += (
            f"; the compiled optimizer {idle[0].get('class')} never stepped: the loss scale "
            "mpwatch records is its, and says nothing about this training"
        )
    lines = []
    for n in names:
        attr = "self.optimizer" if n == "optimizer" else f"self.{n}"
        lines.append(f"{attr} = keras.optimizers.LossScaleOptimizer({attr})")
    lines.append("# and in train_step, for each loss and its optimizer:")
    n0 = "self.optimizer" if names[0] == "optimizer" else f"self.{names[0]}"
    lines.append(f"grads = tape.gradient({n0}.scale_loss(loss), variables)")
    lines.append(f"{n0}.apply(grads, variables)  # unscales; skips non-finite steps")
    where = f" in {owner.rsplit('.', 1)[-1]}.train_step" if owner else ""
    return RULE.finding(
        "error",
        f"{names_list(names)} step{'s' if len(names) == 1 else ''} without loss scaling{where}",
        evidence,
        fix="\n".join(lines),
        data={
            "cause": "optimizer_not_loss_scaled",
            "optimizers": names,
            "idle_compiled": bool(idle),
        },  # fmt: skip
    )


# --- the loss is not scaled ----------------------------------------------------------------------
def _ratios(run: Run) -> tuple[list[float], float | None]:
    """For each variable and probe with a gradient record near it taken at a scale of at least
    2^MIN_SCALE_LOG2: log2(received max |g| / reference max |g|) minus log2 of that record's
    scale (about 0 when the loss was scaled once, -log2 S when not at all, +log2 S when twice),
    and the median scale of the records compared."""
    pv, gv = run.probe_variables, run.grad_variables
    if not len(pv) or "ref_max_abs" not in pv or not len(gv) or "max_abs" not in gv:
        return [], None
    gsteps = np.array(sorted(set(int(s) for s in gv["step"])))
    out: list[float] = []
    scales: list[float] = []
    for pstep, prows in pv.groupby("step"):
        near = int(gsteps[np.abs(gsteps - int(pstep)).argmin()])
        grows = gv[gv["step"] == near]
        got = dict(zip(grows["variable"].astype(str), grows["max_abs"]))
        scale = float(grows["loss_scale"].iloc[0]) if "loss_scale" in grows else 1.0
        if not scale >= 2.0**MIN_SCALE_LOG2:
            continue  # too small a scale to tell once from never or twice
        for var, ref in zip(prows["variable"].astype(str), prows["ref_max_abs"]):
            r, g = _pos(ref), _pos(got.get(var))
            if r is not None and g is not None:
                out.append(math.log2(g / r) - math.log2(scale))
                scales.append(scale)
    return out, (float(np.median(scales)) if scales else None)


def _where(run: Run) -> str:
    """``"VAE.train_step"`` for a user's train step, else ``"the train step"``."""
    owner = run.train_step.get("train_step_owner")
    return f"{owner.rsplit('.', 1)[-1]}.train_step" if owner else "the train step"


def _pos(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) and v > 0 else None


def _loss_not_scaled(run: Run) -> Finding | None:
    opts = run.train_step.get("optimizers") or []
    compiled = next((o for o in opts if o.get("compiled")), None)
    if compiled is not None and not (compiled.get("loss_scaled") and _stepped(compiled)):
        return _never_called_scale_loss(run)  # a GAN's own loss-scale optimizers
    if compiled is None and str((run.info.get("loss_scale") or {}).get("kind")) != "dynamic":
        return None
    excess, scale = _ratios(run)
    if scale is None or len(excess) < MIN_COMPARISONS:
        return _never_called_scale_loss(run)
    k = math.log2(scale)
    got = float(np.median(excess)) + k  # log2(received / reference) at the median scale
    n_vars = int(pd.Series(run.probe_variables["variable"]).nunique())
    measured = (
        f"the optimizer received gradients 2^{got:.1f} times the float32 reference (median of "
        f"{n_vars} variables, {len(excess)} comparisons), where a scaled loss gives "
        f"{words.loss_scale(scale)} (the loss scale)"
    )
    owner = run.train_step.get("train_step_owner")
    where = _where(run)
    backend = str(run.info.get("backend") or "tensorflow")
    if got < k / 2:
        severity, title, consequence = _unscaled_consequence(run, compiled, scale, where)
        evidence = (
            f"{measured}: the loss was not multiplied by the scale, and LossScaleOptimizer "
            f"divides by it: {consequence}" + _loss_trend(run)
        )
        return RULE.finding(
            severity,
            title,
            evidence,
            fix=_scale_loss_fix(backend, None, run.train_step.get("has_call")),
            data={
                "cause": "loss_not_scaled",
                "log2_ratio": got,
                "loss_scale": scale,
                "comparisons": len(excess),
                "train_step_owner": owner,
            },  # fmt: skip
        )
    if got > TWICE_FACTOR * k:  # the margin is k / 2 >= 4 bits (MIN_SCALE_LOG2)
        return RULE.finding(
            "error",
            f"{where} scales the loss twice",
            f"{measured}: the loss was multiplied by the scale twice (scale_loss called on a "
            "loss Keras already scales, or by hand as well)",
            fix="# call optimizer.scale_loss(loss) once, on the loss you differentiate",
            data={
                "cause": "loss_scaled_twice",
                "log2_ratio": got,
                "loss_scale": scale,
                "comparisons": len(excess),
                "train_step_owner": owner,
            },  # fmt: skip
        )
    return None


#: optimizers (Keras families) whose update divides the gradient by a running magnitude of it
#: plus epsilon: a constant factor on every gradient cancels except against that floor (Adam's
#: sqrt(v) + epsilon; RMSprop's sqrt(v + epsilon))
FLOOR_EPSILON = frozenset({"Adam", "AdamW", "Nadam", "Adamax", "RMSprop"})
#: optimizers that normalize the update itself (a sign, a trust ratio, an orthogonalization, a
#: relative step): a constant factor on every gradient cancels
NORMALIZING = frozenset({"Lion", "Lamb", "Adafactor", "Muon"})


def _family(o: dict[str, Any] | None) -> str:
    """The Keras optimizer class the record's (inner) optimizer is or derives from."""
    o = o or {}
    if o.get("family"):
        return str(o["family"])
    cls = str(o.get("class") or "")
    return cls[len("LossScaleOptimizer(") : -1] if cls.startswith("LossScaleOptimizer(") else cls


def _unscaled_consequence(
    run: Run, o: dict[str, Any] | None, scale: float, where: str
) -> tuple[str, str, str]:
    """(severity, title, what the division by the scale does to the updates) for an unscaled
    loss, by optimizer family: SGD's updates are 1/S of the right ones; an adaptive optimizer
    (Adam) divides the factor out again, except against its epsilon, which the scale (never
    stopped by an overflow of unscaled gradients) grows past; any other optimizer gets every
    gradient 1/S of its size (an error)."""
    family = _family(o)
    n = words.number(scale)
    if family == "SGD":
        return (
            "error",
            f"{where} does not scale the loss: every update is 1/{n} of the right one",
            f"every update is 2^-{math.log2(scale):g} of the right one",
        )
    if family not in FLOOR_EPSILON | NORMALIZING:
        return (
            "error",
            f"{where} does not scale the loss: {family} gets every gradient 1/{n} of its size",
            f"{family} gets every gradient 2^-{math.log2(scale):g} of its size",
        )
    eps = _pos((o or {}).get("epsilon")) if family in FLOOR_EPSILON else None
    floor = None
    if eps:
        floor = scale * (math.sqrt(eps) if family == "RMSprop" else eps)
        rule = "S x sqrt(epsilon)" if family == "RMSprop" else "S x epsilon"
    growth = (run.info.get("loss_scale") or {}).get("growth_interval")
    every = f" every {growth} steps" if growth else ""
    shrink = (
        f": each element's update shrinks where its gradient is below about {rule} = "
        f"{fmt(floor)} (S = {n}, epsilon {fmt(eps)}), a floor the scale raises as it doubles"
        f"{every} (unscaled gradients never overflow to stop it)"
        if floor
        else ""
    )
    return (
        "warning",
        f"{where} does not scale the loss: its float16 gradients have no loss scale"
        + (f", and {family}'s updates shrink as the scale grows" if floor else ""),
        f"{family} normalizes its updates by the gradients' own size, which cancels the "
        f"division{' except against its epsilon' if floor else ''}{shrink}; the backward pass "
        "runs in float16 without the factor that keeps small gradients from flushing to zero",
    )


def _never_called_scale_loss(run: Run) -> Finding | None:
    """Without a float32 reference (no probe: a model whose train step runs sub-models, as a VAE
    or a GAN), the train step's own trace: a LossScaleOptimizer stepped, and the train step never
    called its ``scale_loss`` (the tap watched it while Keras traced the step)."""
    opts = [
        o
        for o in run.train_step.get("optimizers") or []
        if o.get("loss_scaled") and _stepped(o) and o.get("scale_loss_calls") == 0
        and (_pos(o.get("loss_scale")) or 0.0) >= 2.0  # a scale of 1 changes nothing
    ]  # fmt: skip
    if not opts:
        return None
    # the most severe consequence first (SGD's, any optimizer that is not adaptive)
    opts.sort(key=lambda o: _family(o) in FLOOR_EPSILON | NORMALIZING)
    first, scale = opts[0], float(opts[0]["loss_scale"])
    owner = run.train_step.get("train_step_owner")
    where = _where(run)
    severity, title, consequence = _unscaled_consequence(run, first, scale, where)
    names = ", ".join(f"{o.get('name')}.scale_loss ({o.get('class')})" for o in opts)
    evidence = (
        f"{where} never called {names} while Keras traced it (mpwatch watched them): the loss "
        f"it differentiates is not multiplied by the scale ({words.loss_scale(scale)}), and "
        f"LossScaleOptimizer divides the gradients by it: {consequence}"
        + _received(run) + _loss_trend(run)
    )  # fmt: skip
    return RULE.finding(
        severity,
        title,
        evidence,
        fix=_scale_loss_fix(
            str(run.info.get("backend") or "tensorflow"), opts, run.train_step.get("has_call")
        ),
        data={
            "cause": "loss_not_scaled",
            "scale_loss_calls": 0,
            "loss_scale": scale,
            "optimizers": [o.get("name") for o in opts],
            "optimizer": first.get("class"),
            "family": _family(first),
            "train_step_owner": owner,
        },  # fmt: skip
    )


def _received(run: Run) -> str:
    """The largest gradients the optimizer received (the last record), as evidence of their
    size: a scaled loss gives them S times the unscaled ones."""
    gv = run.grad_variables
    if not len(gv) or "max_abs" not in gv:
        return ""
    last = gv[gv["step"] == gv["step"].max()]
    m = pd.to_numeric(last["max_abs"], errors="coerce").dropna()
    if not len(m):
        return ""
    return (
        f"; the largest gradient the optimizer received, by variable (step "
        f"{int(last['step'].iloc[0])}): {fmt(float(m.min()))} to {fmt(float(m.max()))}, median "
        f"{fmt(float(m.median()))}"
    )


def _scale_loss_fix(
    backend: str, opts: list[dict[str, Any]] | None = None, has_call: Any = True
) -> str:
    """The train step's fix: its loss multiplied by the loss scale before the gradients are
    taken. Keras' own pattern (``self(x)``, ``compute_loss``) for a model with a forward pass of
    its own; for one without (a VQ-VAE or VAE trainer whose train step runs its sub-models: no
    ``self(x)`` to call), the step's own forward pass and loss, kept as they are."""
    named = [str(o.get("name")) for o in opts or [] if not o.get("compiled")]
    if named:  # a GAN's own optimizers: each loss scaled by the optimizer that applies it
        lines = []
        if any(o.get("compiled") for o in opts or []):
            lines.append(
                "loss = self.optimizer.scale_loss(loss)  # inside its GradientTape, before "
                "tape.gradient(loss, ...); self.optimizer.apply unscales"
            )
        for n in named:
            stem = n[: -len("optimizer")].rstrip("_") if n.endswith("optimizer") else n
            loss = f"{stem or n}_loss"
            lines.append(
                f"{loss} = self.{n}.scale_loss({loss})  # inside its GradientTape, before "
                f"tape.gradient({loss}, ...); self.{n}.apply unscales"
            )
        return "\n".join(lines)
    if backend == "jax":
        return (
            "# in the loss function your train_step differentiates (JAX), as Keras' own\n"
            "# JAXTrainer.compute_loss_and_updates does:\n"
            "mapping = list(zip(self.optimizer.variables, optimizer_variables))\n"
            "with keras.StatelessScope(state_mapping=mapping):\n"
            "    loss = self.optimizer.scale_loss(loss)\n"
            "# then stateless_apply the gradients of that loss (it unscales them)"
        )
    if has_call is False:  # its own forward pass and loss, and the variables it differentiates
        return (
            "with tf.GradientTape() as tape:\n"
            "    loss = ...  # your train step's forward pass and loss, as they are\n"
            "    scaled_loss = self.optimizer.scale_loss(loss)  # multiply by the loss scale\n"
            "grads = tape.gradient(scaled_loss, variables)  # the variables you differentiate\n"
            "self.optimizer.apply(grads, variables)  # divides by it again"
        )
    return (
        "with tf.GradientTape() as tape:\n"
        "    y_pred = self(x, training=True)\n"
        "    loss = self.compute_loss(y=y, y_pred=y_pred)\n"
        "    scaled_loss = self.optimizer.scale_loss(loss)  # multiply by the loss scale\n"
        "gradients = tape.gradient(scaled_loss, self.trainable_variables)\n"
        "self.optimizer.apply(gradients, self.trainable_variables)  # divides by it again"
    )
