"""The probe's record: the ``probe`` payload built from its passes' statistics.

:func:`build` turns the host tables of one probe (per variable ``grads``, per layer output
``acts`` and ``act_grads``, the reference gradients' histogram, the losses; from
:mod:`mpwatch.record.probe.probe_tf` or :mod:`mpwatch.record.probe.probe_jax`, the same on both
backends) into the record's tables: per variable, per layer (gradients grouped by owning layer,
activations by the layer that output them) and model-wide, the first non-finite layer, the histogram
with the format's window at the scale, the sweep over power-of-two scales and the recommended scale
(math: :mod:`mpwatch.record.probe.underflow`; layout: ``contract.KIND_PROBE``), and whether the
probe measures the network the train step runs (:func:`loss_agrees`). :func:`scalars` gives the
record's scalars.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mpwatch import contract
from mpwatch.record.probe import underflow

VARIABLE_COLUMNS = contract.PROBE_VARIABLE_COLUMNS
LAYER_COLUMNS = contract.PROBE_LAYER_COLUMNS
SWEEP_COLUMNS = contract.PROBE_SWEEP_COLUMNS


def round_sig(x: Any, digits: int = 6) -> Any:
    """A float with ``digits`` significant digits (smaller records); ints and non-finite as is."""
    if isinstance(x, float) and math.isfinite(x) and x != 0.0:
        return float(f"{x:.{digits}g}")
    return x


#: the probe agrees with the train step when its loss (the pass in the model's own policies)
#: is within this relative tolerance of the train step's loss on the same batch and weights
LOSS_RTOL = 1e-2
#: ... or within this absolute tolerance (losses near 0)
LOSS_ATOL = 1e-4


def loss_agrees(probe_loss: float, train_loss: float) -> tuple[bool, str | None]:
    """(whether the probe's loss matches the train step's loss, and why not). Both non-finite
    the same way (a diverged model) counts as agreement: the probe sees the same network."""
    a, b = probe_loss, train_loss
    if not (math.isfinite(a) and math.isfinite(b)):
        same = (math.isnan(a) and math.isnan(b)) or a == b
        return same, None if same else f"probe loss {a} but train-step loss {b}"
    if abs(a - b) <= LOSS_ATOL + LOSS_RTOL * max(abs(a), abs(b)):
        return True, None
    return False, (
        f"probe loss {a:.6g} but the train step's loss on the same batch and weights is "
        f"{b:.6g} (tolerance {LOSS_RTOL:g} relative): the probe does not measure the network "
        "the train step runs, so no finding rests on it"
    )


def custom_train_step(model: Any) -> bool:
    """Whether the model's class overrides Keras' train_step (of the backend's trainer)."""
    from mpwatch.record.runtime import backend

    try:
        if backend.name() == backend.JAX:
            from keras.src.backend.jax.trainer import JAXTrainer as Trainer
        else:
            from keras.src.backend.tensorflow.trainer import TensorFlowTrainer as Trainer
    except ImportError:  # pragma: no cover
        return False
    return getattr(type(model), "train_step", None) is not Trainer.train_step


def build(probe: Any, out: dict[str, np.ndarray], scale: float) -> dict[str, Any]:
    """The ``probe`` record's payload of one probe (``probe``: the
    :class:`~mpwatch.record.probe.probe.Probe` that ran it) from its host tables ``out`` at
    ``scale``."""
    has_ref = probe.has_ref
    grads = out["grads"]
    names = [getattr(v, "path", None) or v.name for v in probe.model.trainable_variables]
    var_rows = [
        [
            name,
            layer,
            s["size"],
            s["ref_nonzero"] if has_ref else None,
            s["underflow_count"] if has_ref else None,
            round_sig(s["underflow_fraction"]) if has_ref else None,
            round_sig(s["grad_rel_error"]) if has_ref else None,
            round_sig(s["max_abs_ref"]) if has_ref else None,
        ]
        for name, layer, s in zip(names, probe._var_layer, underflow.summarize_each(grads))
    ]
    # per layer: gradients grouped by owning layer, activations by the tap's layer index
    order = list(probe.layer_names)
    var_index: dict[str, list[int]] = {}
    for i, layer in enumerate(probe._var_layer):
        var_index.setdefault(layer, []).append(i)
    known = set(order)
    order += [layer for layer in var_index if layer not in known]
    acts = out["acts"]
    act_layer = getattr(probe, "_act_layer_index", [])
    act_by_layer: dict[str, np.ndarray] = {}
    for i, row in enumerate(acts):
        name = probe.layer_names[act_layer[i]]
        act_by_layer.setdefault(name, []).append(row)
    ag = out.get("act_grads")
    ag_by_layer: dict[str, list] = {}
    if ag is not None:
        for i, row in enumerate(ag):
            ag_by_layer.setdefault(probe.layer_names[act_layer[i]], []).append(row)
    layer_rows = []
    first_nonfinite = None
    max_act_all = 0.0
    for name in order:
        rows = grads[var_index.get(name, [])]
        g = underflow.summarize_grads(rows)
        a = np.asarray(act_by_layer.get(name, np.zeros((0, 6))))
        if len(a):
            out_err = underflow.rel_error(
                a[:, underflow.A_ERR_SQ].sum(), a[:, underflow.A_REF_SQ].sum()
            )
            max_act = float(a[:, underflow.A_MAX_MIXED].max())
            act_nonfinite = int(a[:, underflow.A_NONFINITE].sum())
            max_act_all = max(max_act_all, max_act)
        else:
            out_err, max_act, act_nonfinite = None, None, 0
        agr = np.asarray(ag_by_layer.get(name, np.zeros((0, 4))))
        ag_frac = (
            underflow.fraction(
                agr[:, underflow.AG_UNDERFLOW].sum(), agr[:, underflow.AG_REF_NONZERO].sum()
            )
            if len(agr)
            else None
        )
        nonfinite = act_nonfinite + g["nonfinite"]
        if act_nonfinite and first_nonfinite is None:
            first_nonfinite = name
        layer_rows.append(
            [
                name,
                g["ref_nonzero"] if has_ref and len(rows) else None,
                g["underflow_count"] if has_ref and len(rows) else None,
                round_sig(g["underflow_fraction"]) if has_ref and len(rows) else None,
                round_sig(g["grad_rel_error"]) if has_ref and len(rows) else None,
                round_sig(out_err) if has_ref and out_err is not None else None,
                round_sig(max_act) if max_act is not None else None,
                round_sig(underflow.headroom_bits(max_act, probe.fmt))
                if max_act is not None
                else None,
                round_sig(ag_frac) if ag_frac is not None else None,
                nonfinite,
            ]
        )
    if first_nonfinite is None:
        # no activation went non-finite (or none was measured): the loss itself, else the
        # first layer in backward order (where backprop starts) with a non-finite gradient
        if not np.isfinite(out["loss"]):
            first_nonfinite = "loss"
        for layer, row in zip(probe._var_layer[::-1], grads[::-1]):
            if first_nonfinite is not None:
                break
            if row[underflow.G_NONFINITE] > 0:
                first_nonfinite = layer
    m = underflow.summarize_grads(grads)
    model = {
        "ref_nonzero": m["ref_nonzero"] if has_ref else None,
        "underflow_count": m["underflow_count"] if has_ref else None,
        "underflow_fraction": m["underflow_fraction"] if has_ref else None,
        "grad_rel_error": m["grad_rel_error"] if has_ref else None,
        "max_abs_activation": max_act_all if len(acts) else None,
        "first_nonfinite_layer": first_nonfinite,
        "size": m["size"],
        "nonfinite": m["nonfinite"],
        "loss": float(out["loss"]),
        "ref_loss": float(out["ref_loss"]) if has_ref else None,
        "train_loss": float(out["train_loss"]),
        "activation_headroom_bits": (
            underflow.headroom_bits(max_act_all, probe.fmt) if len(acts) else None
        ),
    }
    if not has_ref:
        model["zero_fraction"] = underflow.fraction(float(out["zeros"]), m["size"])
    hist = underflow.histogram(out["hist"], scale if probe.mode != "bfloat16" else None, probe.fmt)
    hist["zeros"] = int(out["zeros"])
    hist["source"] = "reference" if has_ref else "mixed_unscaled"
    sweep_rows: list[list[float]] = []
    recommended = None
    if probe.mode != "bfloat16":
        sweep_rows = underflow.sweep(out["hist"])
        max_all = m["max_abs_ref"]
        if ag is not None and len(ag):
            max_all = max(max_all, float(ag[:, underflow.AG_MAX_REF].max()))
        recommended = underflow.recommend_scale(max_all, margin_bits=probe.margin_bits)
        model["max_abs_ref_grad"] = max_all
        model["margin_bits"] = probe.margin_bits
    reliable, why = loss_agrees(float(out["own_loss"]), float(out["train_loss"]))
    if reliable and custom_train_step(probe.model):
        reliable = None
        why = (
            f"{type(probe.model).__name__} overrides train_step: the probe computes the "
            "compiled loss, which may not be what the train step minimises"
        )
    return {
        "mode": probe.mode,
        "reliable": reliable,
        "unreliable_reason": why,
        "random_layers_off": [ly.name for ly in probe.random_off],
        "loss_scale": scale if probe.mode != "bfloat16" else None,
        "reference": probe.reference,
        "reference_note": probe.note,
        "model_kind": probe.kind,
        "variables": contract.table(VARIABLE_COLUMNS, var_rows),
        "layers": contract.table(LAYER_COLUMNS, layer_rows),
        "model": model,
        "histogram": hist,
        "sweep": contract.table(SWEEP_COLUMNS, sweep_rows),
        "recommended_scale": recommended,
    }


def scalars(payload: dict[str, Any]) -> dict[str, float]:
    """The probe's scalars (only those that exist in this mode)."""
    m = payload["model"]
    out = {}
    if m.get("underflow_fraction") is not None:
        out[contract.PROBE_UNDERFLOW_FRACTION] = m["underflow_fraction"]
    if m.get("grad_rel_error") is not None:
        out[contract.PROBE_GRAD_REL_ERROR] = m["grad_rel_error"]
    if payload.get("recommended_scale") is not None:
        out[contract.PROBE_RECOMMENDED_SCALE] = payload["recommended_scale"]
    if m.get("activation_headroom_bits") is not None:
        out[contract.PROBE_ACTIVATION_HEADROOM_BITS] = m["activation_headroom_bits"]
    return out
