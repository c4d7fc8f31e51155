"""One candidate policy of a pre-flight, recorded as a run: the model seen under the policy.

:func:`record_candidate` switches the model's own layers to the candidate policy for as long as it
records (:class:`mpwatch.record.probe.twin.PolicyView`: the same layers and variables, nothing
copied; the layers the model pinned to another policy keep it) and writes, into the candidate's
own run folder, what a fit's first step would record:

- ``run_info``: the candidate policy, and the loss scale Keras would start with under it (a
  ``LossScaleOptimizer`` at ``2**15`` under ``mixed_float16`` where the model's optimizer is not
  one already; its own ``initial_scale`` where it is);
- ``layers`` and ``memory``: each layer's dtypes as one forward pass in inference mode computes
  them under the candidate (output dtypes included), and the training memory by dtype;
- ``train_step``: the train step's contract as it can be known before a step (who defines
  ``train_step``, every optimizer);
- ``probe`` at step 1: the probe (:class:`mpwatch.record.probe.probe.Probe`) on the batch at the
  scale Keras would start with: forward and backward against the float32 reference, the layers
  that overflow and the smallest float32 set that the probe's fix checks found to fix them, the
  scale sweep (each power of two's predicted underflow and overflow, and the scale that fits),
  float8 readiness; under ``mixed_float16``, where the sweep's scale is another, ``probe`` at
  step 2 at that scale (the diagnosis reads the latest probe: the layers that overflow at a scale
  that fits the gradients, and the float32 set checked there).

With ``float32_layers`` and ``scale`` it records the candidate *with a change applied*: those
layers (and every layer under them) switched to float32 inside the candidate's view, the probe at
that scale. The pre-flight records its recommendation so and judges that run: the change is
measured on the batch, not assumed.

Example:
    >>> import keras, numpy as np  # doctest: +SKIP
    >>> model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])  # doctest: +SKIP
    >>> model.compile("adam", "mse")  # doctest: +SKIP
    >>> batch = (np.ones((16, 8), "float32"), np.ones((16, 4), "float32"))  # doctest: +SKIP
    >>> rec = record_candidate(model, batch, "mixed_float16", "pre/f16")  # doctest: +SKIP
    >>> rec.probed, rec.scale  # doctest: +SKIP
    (True, 32768.0)
"""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass, field
from typing import Any

from mpwatch import contract
from mpwatch.formats import KERAS_GROWTH_INTERVAL, KERAS_INITIAL_SCALE
from mpwatch.judge.rules.loss_scale import SCALE_STUCK_LOW
from mpwatch.launch import CANDIDATES
from mpwatch.record.callbacks.layer_dtypes import (
    OutputDtypeTracer,
    layers_payload,
    sixteen_bit_outputs,
)
from mpwatch.record.callbacks.train_step import train_step_facts
from mpwatch.record.model import memory
from mpwatch.record.probe.probe import Probe, batch_size_of, split_data
from mpwatch.record.probe.twin import MIXED_POLICIES, PolicyView
from mpwatch.record.runtime.run_info import no_loss_scale_reason, run_info
from mpwatch.record.runtime.writer import RunWriter
from mpwatch.record.tap.tap_common import loss_scale_optimizer

logger = logging.getLogger("mpwatch")

__all__ = ["CANDIDATES", "CandidateRecord", "candidate_view", "record_candidate"]


@dataclass
class CandidateRecord:
    """What :func:`record_candidate` wrote for one policy.

    Attributes:
        policy: the candidate policy.
        run_dir: the run folder it wrote.
        scale: the probe's loss scale (Keras' start, or the change's; 1 under bfloat16).
        float32_layers: the layers kept in float32 (a change applied), else empty.
        probed: whether the probe ran (else ``error`` says why).
        fitting_scale: the scale the first probe's sweep says fits, probed at step 2 where it
            is not the first probe's (float16, no ``scale`` given), else None.
        scale_given: a ``scale`` was given (a change's loss scale): the only one probed.
        error: why the probe could not run, or None.

    Example:
        >>> CandidateRecord("mixed_bfloat16", "logs/pre/mixed_bfloat16").scale
        1.0
    """

    policy: str
    run_dir: str
    scale: float = 1.0
    float32_layers: list[str] = field(default_factory=list)
    probed: bool = False
    fitting_scale: float | None = None
    error: str | None = None
    scale_given: bool = False


def own_policy(model: Any) -> str:
    """The policy the model was built under (its own ``dtype_policy``)."""
    return str(getattr(getattr(model, "dtype_policy", None), "name", None) or "float32")


def candidate_view(model: Any, policy: str) -> PolicyView | None:
    """The view that shows ``model`` under ``policy``: its layers of the model's own policy
    switched (a float32 model: every float32 layer; a mixed model: its mixed layers, those pinned
    to float32 stay), or None where the model already is under ``policy``."""
    own = own_policy(model)
    if own == policy:
        return None
    sources = ("float32",) if own == "float32" else tuple(p for p in MIXED_POLICIES if p == own)
    return PolicyView(model, policy, sources=sources or (own,))


def _loss_scale(model: Any, policy: str) -> tuple[dict[str, Any], str, float]:
    """(run_info's loss-scale facts, the optimizer's name, the first probe's scale) as Keras
    would compile ``model`` under ``policy``: under ``mixed_float16`` it wraps a plain optimizer
    in a LossScaleOptimizer at ``2**15``; another policy scales nothing."""
    opt = getattr(model, "optimizer", None)
    lso = loss_scale_optimizer(opt)
    inner = type(lso.inner_optimizer if lso is not None else opt).__name__
    if policy == "mixed_float16":
        initial = float(getattr(lso, "initial_scale", KERAS_INITIAL_SCALE) or KERAS_INITIAL_SCALE)
        growth = int(getattr(lso, "dynamic_growth_steps", KERAS_GROWTH_INTERVAL))
        facts = {"kind": "dynamic", "reason": None, "initial": initial, "growth_interval": growth}
        return facts, f"LossScaleOptimizer({inner})", initial
    facts = {"kind": "none", "reason": no_loss_scale_reason(model), "initial": None,
             "growth_interval": None}  # fmt: skip
    return facts, inner, 1.0


def _train_step(model: Any, policy: str, scale: float) -> dict[str, Any]:
    """The ``train_step`` record as Keras would compile the model under ``policy``: the compiled
    optimizer wrapped under ``mixed_float16`` (no optimizer has stepped)."""
    facts = train_step_facts(model)
    for opt in facts["optimizers"]:
        if opt["compiled"] and policy == "mixed_float16" and not opt["loss_scaled"]:
            opt["class"] = f"LossScaleOptimizer({opt['class']})"
            opt["loss_scaled"] = True
            opt["loss_scale"] = opt["loss_scale_start"] = scale
    return facts


def _forward_facts(model: Any, x: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(the ``layers`` payload, the ``memory`` payload or None) from one forward pass in
    inference mode under the policy now in force (each leaf layer's output dtype and shape)."""
    tracer = OutputDtypeTracer(model)
    try:
        model(x, training=False)
    finally:
        tracer.undo()
    payload = layers_payload(model, tracer.dtypes, tracer.widths)
    mem = None
    try:
        outputs, batch = memory.layer_outputs(tracer.shapes)
        mem = memory.memory_payload(model, outputs, batch, optimizer=_built_optimizer(model))
    except Exception as e:  # noqa: BLE001  (a fact that could not be counted: no record)
        logger.debug("mpwatch: pre-flight: no memory record: %r", e)
    return payload, mem


def _built_optimizer(model: Any) -> Any:
    """The model's optimizer where it is built, else a built copy (its slots, as the first step
    will make them; the copy is dropped after counting), or None."""
    opt = getattr(model, "optimizer", None)
    inner = getattr(opt, "inner_optimizer", opt)
    if inner is None or getattr(inner, "built", False):
        return opt
    copy = type(inner).from_config(inner.get_config())
    copy.build(model.trainable_variables)
    return copy


def record_candidate(
    model: Any,
    data: Any,
    policy: str,
    run_dir: str,
    loss_fn: Any = None,
    float32_layers: list[str] | tuple[str, ...] = (),
    scale: float | None = None,
) -> CandidateRecord:
    """Record ``policy``'s run for ``model`` on ``data``'s batch into ``run_dir`` (see the module
    doc), with ``float32_layers`` kept in float32 and the probe at ``scale`` when given. The
    model's layers are back under their own policies when it returns (also on error); its
    weights, optimizer and state are not changed (the probe restores BatchNormalization's
    statistics and the loss trackers)."""
    if policy not in CANDIDATES:
        raise ValueError(f"mpwatch: a pre-flight policy is one of {CANDIDATES}, not {policy!r}")
    x, y, sw = split_data(data)
    rec = CandidateRecord(policy, run_dir, float32_layers=list(float32_layers))
    own = own_policy(model)
    view = candidate_view(model, policy)
    writer = RunWriter(run_dir)
    try:
        with contextlib.ExitStack() as stack:
            if view is not None:
                stack.enter_context(view)
            if float32_layers:  # (a view's layers are those under its sources when it is made)
                stack.enter_context(PolicyView(model, "float32", only=set(float32_layers)))
            facts, opt_name, start = _loss_scale(model, policy)
            rec.scale_given = scale is not None and policy == "mixed_float16"
            rec.scale = float(scale) if rec.scale_given else start
            if facts["kind"] == "dynamic":
                facts["initial"] = rec.scale
            info = run_info(
                model, batch_size=batch_size_of(x), log_every=1, loss_scale=facts,
                optimizer=opt_name,
            )  # fmt: skip
            info["preflight"] = {"of": own, "float32_layers": list(float32_layers),
                                 "scale": rec.scale}  # fmt: skip
            writer.record(contract.KIND_RUN_INFO, 0, info)
            writer.record(contract.KIND_TRAIN_STEP, 0, _train_step(model, policy, rec.scale))
            try:
                layers, mem = _forward_facts(model, x)
            except Exception as e:  # noqa: BLE001  (a model without a forward pass of its own)
                _failed(rec, "the model's forward pass failed", e)
                return rec
            writer.record(contract.KIND_LAYERS, 0, layers)
            if mem is not None:
                writer.record(contract.KIND_MEMORY, 0, mem)
            _probe(model, (x, y, sw), policy, writer, rec, loss_fn)
    finally:
        writer.close()
    return rec


def _probe(
    model: Any, batch: tuple, policy: str, writer: RunWriter, rec: CandidateRecord,
    loss_fn: Any,
) -> None:  # fmt: skip
    """The candidate's probes, under its view (a probe that cannot run: ``error``): at step 1
    at ``rec.scale``; under float16 without a given scale, at step 2 at the scale the sweep says
    fits (what Keras' dynamic scale comes down to). The fix checks run at the last probe only:
    at Keras' start a change can look useless only because the scale is too high for the batch
    (DenseNet121 on raw pixels: its scaled gradients overflow at 2^15 with any layer in float32),
    which the skips predicted from step 1 already say. Where that scale protects nothing (at
    or below ``SCALE_STUCK_LOW``), the checks run again at step 3, :data:`USUAL_DESCENT_BITS`
    below the start: the cause of so long a descent (a raw regression target), named."""
    mode = "float16" if policy == "mixed_float16" else "bfloat16"
    probe = Probe(model, loss_fn=loss_fn, mode=mode)
    again = mode == "float16" and not rec.scale_given
    probe.fix_checks = not again
    try:
        payload = probe.run(batch, scale=rec.scale)
    except Exception as e:  # noqa: BLE001  (said in the report: the probe could not run)
        _failed(rec, "the probe could not run", e)
        return
    # the 16-bit outputs tried in float32, as the fit's monitor tries them (probe_monitor)
    trained = _training_pass(probe, batch, rec.scale, sixteen_bit_outputs(model)) if again else None
    if trained is not None:
        payload["training_mode"] = trained
    Probe.write(writer, 1, payload)
    rec.probed = True
    if not again:
        return
    fits = payload.get("recommended_scale")
    at = float(fits) if _number(fits) else rec.scale
    lower = None
    if trained is not None and not trained["finite"]:  # where the train step's masks fit
        lower = _training_scale(probe, batch, min(at, rec.scale))
        at = lower["scale"] if lower is not None else at
    if at == rec.scale and not _wants_checks(payload):
        return
    rec.fitting_scale = at if at != rec.scale else None
    probe.fix_checks = True
    second = probe.run(batch, scale=at)
    if lower is not None:
        second["training_mode"] = lower
    Probe.write(writer, 2, second)
    checks_at = rec.scale / 2.0**USUAL_DESCENT_BITS
    if at <= SCALE_STUCK_LOW < checks_at:  # why the scale must fall so far: the fixes checked
        Probe.write(writer, 3, probe.run(batch, scale=checks_at))  # where a sound model fits


#: halvings of Keras' start scale a model with inputs and targets near unit scale needs at most
#: before its gradients fit (a forecaster on a standardised series: 5, 2^15 -> 2^10; on the raw
#: series near 1000 the scale falls below 1). Where the scale the sweep says fits is at or below
#: the loss-scale rule's ``SCALE_STUCK_LOW`` (a scale that protects nothing), the fix checks run
#: again this far below the start, where a change that brings the pass in range (the target or
#: the inputs standardised, a layer in float32) shows it: the cause, named as a fit names it.
USUAL_DESCENT_BITS = 5


#: halvings below a scale the pre-flight tries for the train step's own pass (Dropout on)
TRAINING_HALVINGS = 12
#: random draws of the train step's own pass at a scale (each other masks)
TRAINING_DRAWS = 4


def _training_pass(
    probe: Any, batch: tuple, scale: float, candidates: list[str] | tuple[str, ...] = (),
    start: int = 0,
) -> dict[str, Any] | None:  # fmt: skip
    """The pass as Keras' train step runs it, Dropout and the other random layers on
    (:func:`mpwatch.record.probe.fix_check.check_training_mode`), :data:`TRAINING_DRAWS` draws
    at ``scale`` (the random layers' seed states advanced between them, restored after), where
    the model has random layers; else None. ``finite``: every draw was; ``draws`` and
    ``nonfinite_draws`` beside. The probe's own pass can stay finite where the train step's
    masks overflow (a ViT's first steps). Each draw that is not finite is tried again with each
    of ``candidates`` in float32 (the model's 16-bit outputs), the same masks: ``fixed`` where
    one layer made most such draws finite (``fixed_draws`` of ``nonfinite_draws``: a ViT's
    float16 softmax, 4 of 4 draws not finite at 2^15, 3 of them finite with it in float32).
    ``start``: the masks drawn from the ``start``-th on (each scale of :func:`_training_scale`
    its own: a fit draws new masks at every step it skips)."""
    if not probe.random_off:
        return None
    from mpwatch.record.probe.fix_check import check_training_mode

    x, y, sw = batch
    seeds = [g for layer in probe.random_off for g in getattr(layer, "_seed_generators", [])]
    from keras import ops

    saved = [(g, ops.convert_to_numpy(g.state).copy()) for g in seeds]
    got, bad, fixers = None, 0, []
    try:
        for _ in range(start):
            for g in seeds:
                g.next()
        for _ in range(TRAINING_DRAWS):
            one = check_training_mode(probe, x, y, sw, float(scale), list(candidates))
            if one is None:
                return None
            bad += not one["finite"]
            if not one["finite"]:
                fixers.append((one["fixed"], tuple(one["float32_layers"])))
            got = got if got is not None and not got["finite"] else one
            for g in seeds:
                g.next()  # other masks for the next draw
    except Exception as e:  # noqa: BLE001  (the probe's record stands without it)
        probe._warn_once("could not run the training-mode pass (Dropout on)", e)
        return None
    finally:
        for g, value in saved:
            g.state.assign(value)
    tried = [f for f in fixers if f[0] is not None]
    if tried:  # fixed: by one layer, the same in each draw, in most draws that were not finite
        same = len(tried) == len(fixers) and len({f[1] for f in tried}) == 1
        made = sum(bool(f[0]) for f in tried) if same else 0
        got = {**got, "fixed": same and 2 * made > len(fixers), "fixed_draws": made,
               "float32_layers": list(tried[0][1])}  # fmt: skip
    return {**got, "finite": bad == 0, "draws": TRAINING_DRAWS, "nonfinite_draws": bad}


def _training_scale(probe: Any, batch: tuple, scale: float) -> dict[str, Any] | None:
    """The train step's pass (Dropout on, :func:`_training_pass`) at ``scale`` and each halving
    below it until every draw is finite: that one, or None (none of :data:`TRAINING_HALVINGS`)."""
    for k in range(TRAINING_HALVINGS + 1):  # (other masks at each scale, as a fit's steps)
        got = _training_pass(probe, batch, scale / 2.0**k, start=(k + 1) * TRAINING_DRAWS)
        if got is None:
            return None
        if got["finite"]:
            return got
    return None


def _wants_checks(payload: dict[str, Any]) -> bool:
    """Whether a probe would have checked fixes (a non-finite layer, or activations near the
    maximum): then the probe runs again with them."""
    from mpwatch.record.probe.probe import fix_check_headroom

    model = payload.get("model") or {}
    head = model.get("activation_headroom_bits")
    near = isinstance(head, (int, float)) and head < fix_check_headroom()
    return bool(model.get("first_nonfinite_layer") or near)


def _failed(rec: CandidateRecord, what: str, error: Exception) -> None:
    """``rec.error`` in one line (the traceback at debug level)."""
    from mpwatch.record.callbacks.base import one_line

    rec.error = f"{what} under {rec.policy}: {one_line(error)}"
    logger.debug("mpwatch: pre-flight: %s", rec.error, exc_info=error)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0
