"""The probe on Keras' TensorFlow backend: its two passes and their statistics, in one
``tf.function`` traced once per probe batch shape (JAX's: :mod:`mpwatch.record.probe.probe_jax`).

- **A pass** (:func:`forward_backward`): the model in training mode (BatchNormalization on the
  batch's statistics) as the current policies are, under a ``tf.GradientTape``: the loss
  (``Probe._loss``: the train step's), its gradients at the loss scale w.r.t. the trainable
  variables and, for Functional and Sequential models (the probe's tap model), w.r.t. every layer
  output. :class:`~mpwatch.record.probe.probe.Probe` runs it twice, in the model's own policies and
  under the :class:`~mpwatch.record.probe.twin.PolicyView` (``Probe._passes``), and the model's own
  call once for the train step's loss (:func:`train_step_loss`).
- **The function** (:func:`probe_function`): both passes and the statistics
  (:mod:`mpwatch.record.probe.underflow`'s tables) in one traced function, which reads every state
  variable the passes write (BatchNormalization's moving statistics, seed states, loss trackers)
  first and writes it back last: the probe never changes the model.
"""

from __future__ import annotations

from typing import Any

from mpwatch.record.probe import underflow
from mpwatch.record.probe.twin import backend_value, state_variables


def _pack(probe: Any, flat: list[Any]) -> Any:
    """The model's outputs, flat from the tap model, in the model's own output structure."""
    if len(flat) == 1:
        return flat[0]
    import keras

    fm = getattr(probe.model, "_functional", None) or probe.model
    struct = getattr(fm, "_outputs_struct", None)
    return keras.tree.pack_sequence_as(struct, flat) if struct is not None else flat


def forward_backward(probe: Any, x: Any, y: Any, sw: Any, scale: Any) -> dict:
    """One training-mode pass (BatchNormalization on the batch's statistics) of the model as
    the current policies are: loss, gradients w.r.t. the variables and the layer outputs."""
    import tensorflow as tf

    m = probe.model
    with tf.GradientTape() as tape:
        if probe.tap is not None:
            outs = probe.tap(x, training=True)
            n_out = len(m.outputs)
            y_pred, acts = _pack(probe, outs[:n_out]), outs[n_out:]
        else:
            y_pred, acts = m(x, training=True), []
        loss = probe._loss(x, y, y_pred, sw)
        scaled = loss * tf.cast(scale, tf.float32)
    variables = m.trainable_variables
    float_acts = [a for a in acts if a.dtype.is_floating]
    grads = tape.gradient(scaled, list(variables) + float_acts)
    n = len(variables)
    return {
        "loss": loss,
        "grads": grads[:n],
        "acts": acts,
        "act_grads": _spread(acts, float_acts, grads[n:]),
    }


def train_step_loss(probe: Any, x: Any, y: Any, sw: Any) -> Any:
    """The loss Keras' train step computes on this batch with these weights: the model's own
    call in training mode, in its own policies (random layers off, as in the probe); run where
    :attr:`Probe.check_loss` says the probe's pass is not that call."""
    return probe._loss(x, y, probe.model(x, training=True), sw)


def _spread(acts: list, float_acts: list, grads: list) -> list:
    """The gradients of the float outputs, placed at their outputs (None at the others)."""
    it = iter(grads)
    return [next(it) if a.dtype.is_floating else None for a in acts]


def probe_function(probe: Any) -> Any:
    """The probe's computation on TensorFlow: ``fn(x, y, sw, scale)`` returns the statistics'
    tables (tensors) of both passes; the model's state is as it was before."""
    import tensorflow as tf

    model = probe.model

    def fn(x: Any, y: Any, sw: Any, scale: Any) -> dict:
        # the passes run the model's own code, which updates state the user sees:
        # BatchNormalization's moving statistics and seed states (training mode), and the
        # loss trackers (Keras' compute_loss updates a Mean per output of a multi-output
        # model, which History reports as "<output>_loss"; a user's compute_loss may update
        # its own). Read all of it first, write it back last (ordered by TensorFlow's
        # automatic control dependencies on each variable): the probe never changes the model
        state = state_variables(model)
        saved = [tf.identity(backend_value(v)) for v in state]
        out = _stats(probe, x, y, sw, scale)
        for v, s in zip(state, saved):
            backend_value(v).assign(s)
        # (trackers the first trace creates, building the compiled loss before any train
        # step, are in `state` too: TensorFlow traces a function that creates variables again)
        return out

    # autograph off, as in Keras' own train function: mpwatch's ops and Keras' layers have no
    # Python control flow on tensors, and converting every function the trace calls cost
    # most of the probe's first call (3 of 4 s on keras.io's Transformer, on 2 CPU cores)
    return tf.function(fn, reduce_retracing=True, autograph=False)


def _stats(probe: Any, x: Any, y: Any, sw: Any, scale: Any) -> dict:
    """Both passes and their statistics' tables (traced inside :func:`probe_function`)."""
    import tensorflow as tf

    low, ref, train_loss = probe._passes(x, y, sw, scale)
    out = {}
    has_ref = probe.mode == "preflight" or ref is not None
    if low is None:  # pre-flight without a mixed pass: cast the reference through float16
        low = {
            "loss": ref["loss"],
            "grads": [
                None if g is None else underflow.cast_through(g, "float16", scale)
                for g in ref["grads"]
            ],
            "acts": [underflow.cast_through(a, "float16") for a in ref["acts"]],
            "act_grads": [
                None if g is None else underflow.cast_through(g, "float16", scale)
                for g in ref["act_grads"]
            ],
        }
    out["loss"] = low["loss"]
    out["ref_loss"] = ref["loss"] if has_ref else low["loss"]
    own = ref if probe.mode == "preflight" else low  # the pass in the model's own policies
    out["train_loss"] = own["loss"] if train_loss is None else train_loss
    out["own_loss"] = own["loss"]
    if has_ref:
        ref_grads = ref["grads"]
    else:  # no reference: stats of the mixed gradients against themselves (unscaled)
        ref_grads = [None if g is None else tf.cast(g, tf.float32) / scale for g in low["grads"]]
    out["grads"] = underflow.grad_table(low["grads"], ref_grads, scale)
    out["hist"], out["zeros"] = underflow.histogram_and_zeros(ref_grads)
    out["acts"] = underflow.activation_table(low["acts"], ref["acts"] if has_ref else None)
    if has_ref:
        out["act_grads"] = underflow.act_grad_table(low["act_grads"], ref["act_grads"])
    return out
