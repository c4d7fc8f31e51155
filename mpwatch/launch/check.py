"""``mpwatch.preflight``: will mixed precision work for this model and data, before the fit?

For each candidate policy, on one batch, with the model as built and compiled
(:mod:`mpwatch.launch.candidate` records it, :mod:`mpwatch.launch.verdict` judges it):

1. the model is seen under the candidate (its layers switched, the same weights) and probed at
   the scale Keras would start with, and at the scale the probe's sweep says fits: forward and
   backward overflow and underflow against the float32 reference, the layers that overflow and
   the smallest float32 set the probe's fix checks found, the inputs or target to normalize,
   float8 readiness, memory by dtype, Tensor Core alignment; the run is diagnosed by the same
   rules as a fit's;
2. the change its problems call for (one :class:`~mpwatch.judge.fixes.fix.Fix`: the policy, the
   layers to keep in float32, the loss scale) is applied the same way and the candidate recorded
   and diagnosed again: the change is checked on the batch;
3. the verdict: ready, ready with the change, not ready, not measured.

The recommendation is the first candidate, in the order given, that is ready (with its change);
none: stay in float32. Its findings are a finding list for :func:`mpwatch.apply_recommendations`.

**Cost**, said before it runs (a log line) and in the report: per candidate, two or three probes
(each a forward and backward pass in the candidate and in float32 on the batch, with the memory
bound of a fit's probe) and a forward pass; nothing is trained, and the model's weights,
optimizer and layer policies are as they were afterwards. Step time is not measured: that needs
the device the fit will use (``unchecked`` says so).

Example:
    >>> import keras, numpy as np, mpwatch  # doctest: +SKIP
    >>> model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])  # doctest: +SKIP
    >>> model.compile("adam", "mse")  # doctest: +SKIP
    >>> report = mpwatch.preflight(model, (np.ones((32, 8)), np.ones((32, 4))))  # doctest: +SKIP
    >>> print(report.render("text"))  # doctest: +SKIP
    >>> fixed = mpwatch.apply_recommendations(model, report.findings)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from mpwatch.judge import diagnose_run
from mpwatch.judge.finding import Finding
from mpwatch.launch import CANDIDATES
from mpwatch.launch.candidate import record_candidate
from mpwatch.launch.verdict import (
    READY,
    READY_WITH_CHANGE,
    Verdict,
    change_words,
    judge_candidate,
)
from mpwatch.read import load_run
from mpwatch.record.probe.probe import first_batch, split_data

logger = logging.getLogger("mpwatch")

__all__ = ["Preflight", "preflight"]

#: the suffix of a candidate's run recorded with its change applied (then -2, -3: a change grown)
CHECKED_SUFFIX = "-with-change"
#: times a candidate is recorded again with its change grown by what the last run asked for
MAX_ROUNDS = 3


@dataclass
class Preflight:
    """What :func:`preflight` found.

    Attributes:
        candidates: each candidate policy's :class:`~mpwatch.launch.verdict.Verdict`, in the
            order tried.
        recommended: the policy to train under (``"float32"`` where no candidate is ready).
        log_dir: where the candidates' runs are (``mpwatch diagnose`` and the tab read them).
        batch_size: the batch probed.
        seconds: what the pre-flight took, by candidate.
        unchecked: what the pre-flight does not check.

    Example:
        >>> report = preflight(model, (x, y))  # doctest: +SKIP
        >>> report.recommended, report.fix.float32_layers  # doctest: +SKIP
        ('mixed_float16', ('predictions',))
    """

    candidates: list[Verdict]
    recommended: str
    log_dir: str
    batch_size: int | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    unchecked: list[str] = field(default_factory=list)

    @property
    def chosen(self) -> Verdict | None:
        """The recommended candidate's verdict (None: float32)."""
        return next((c for c in self.candidates if c.policy == self.recommended), None)

    @property
    def fix(self) -> Any:
        """The recommendation as one :class:`~mpwatch.judge.fixes.fix.Fix` (the policy, the
        layers to keep in float32, the loss scale)."""
        from mpwatch.judge.fixes.fix import Fix

        chosen = self.chosen
        return chosen.fix if chosen is not None else Fix(policy="float32")

    @property
    def findings(self) -> list[Finding]:
        """The recommendation as findings, for :func:`mpwatch.apply_recommendations`: the
        candidate's policy, its problems and what grew the change, whose policy, layers and loss
        scale are exactly :attr:`fix` (an info finding's advice, as a 2-class float16 softmax's,
        is not part of it: the printed change would not say it); none where float32 is."""
        chosen = self.chosen
        if chosen is None:
            return []
        policy = [f for f in chosen.findings if f.rule == "preflight-policy"]
        return [*policy, *chosen.problems, *chosen.added]

    def render(self, fmt: str = "text") -> str:
        """The report as ``text``, ``markdown``, ``json`` or ``html``."""
        from mpwatch.launch.report import render

        return render(self, fmt)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict."""
        from mpwatch.judge.fixes.fix import Fix

        return {
            "recommended": self.recommended,
            "fix": self.fix.action() if isinstance(self.fix, Fix) else {},
            "log_dir": self.log_dir,
            "batch_size": self.batch_size,
            "seconds": dict(self.seconds),
            "unchecked": list(self.unchecked),
            "candidates": [c.to_dict() for c in self.candidates],
        }


def _check_arguments(model: Any, policies: tuple[str, ...], loss_fn: Any) -> None:
    import keras

    if not isinstance(model, keras.Model):
        raise TypeError(f"mpwatch.preflight: model must be a keras.Model, not {type(model)!r}")
    from mpwatch.record.callbacks.train_step import has_forward_pass

    if not has_forward_pass(model):
        raise ValueError(
            f"mpwatch.preflight: {type(model).__name__} has no forward pass of its own (its "
            "train_step runs sub-models, as a GAN's): pre-fly each sub-model that trains, "
            "compiled with its loss"
        )
    if not model.built:
        raise ValueError(
            "mpwatch.preflight: the model is not built: call it on a batch or build it "
            "(model.build(input_shape)) first"
        )
    if loss_fn is None and not getattr(model, "compiled", False):
        raise ValueError(
            "mpwatch.preflight: the model is not compiled and no loss_fn= was given: compile it "
            "as the fit will (model.compile(optimizer, loss)) or pass loss_fn=loss(y_true, y_pred)"
        )
    bad = [p for p in policies if p not in CANDIDATES]
    if bad or not policies:
        raise ValueError(
            f"mpwatch.preflight: policies must be some of {CANDIDATES}, not {list(policies)}"
        )


def preflight(
    model: Any,
    data: Any,
    policies: Iterable[str] = CANDIDATES,
    log_dir: str | os.PathLike[str] | None = None,
    loss_fn: Any = None,
) -> Preflight:
    """Try each of ``policies`` on ``model`` with one batch of ``data`` (``(x, y)``,
    ``(x, y, sample_weight)`` or a ``tf.data.Dataset``: its first batch) and return the
    :class:`Preflight` report (see the module doc). ``log_dir``: where the candidates' runs are
    written (default: a new temporary folder); ``loss_fn``: ``loss(y_true, y_pred)`` for a model
    compiled without a loss."""
    policies = tuple(dict.fromkeys(policies))
    _check_arguments(model, policies, loss_fn)
    x, y, sw = split_data(first_batch(data))
    batch = (x, y, sw)
    from mpwatch.record.probe.probe import batch_size_of

    size = batch_size_of(x)
    out = os.fspath(log_dir) if log_dir is not None else tempfile.mkdtemp(prefix="mpwatch-pre-")
    logger.info(
        "mpwatch: pre-flight of %s on a batch of %s: per policy 2-3 probes (a forward and "
        "backward pass in the policy and in float32 each) and one forward pass; nothing trains",
        ", ".join(policies), size,
    )  # fmt: skip
    verdicts, seconds = [], {}
    with own_retracing_quiet():
        for policy in policies:
            t0 = time.perf_counter()
            verdicts.append(_candidate(model, batch, policy, out, loss_fn))
            seconds[policy] = time.perf_counter() - t0
    ready = sorted(
        (v for v in verdicts if v.verdict in (READY, READY_WITH_CHANGE) and _device_fits(v)),
        key=_rank,
    )
    return Preflight(
        candidates=verdicts,
        recommended=ready[0].policy if ready else "float32",
        log_dir=out,
        batch_size=size,
        seconds=seconds,
        unchecked=_unchecked(model),
    )


#: mpwatch's own functions TensorFlow names in its retracing warning (``<function NAME at``)
OWN_TRACED = ("probe_function.<locals>.", "_capture_tf.<locals>.")


class _OwnRetracing(logging.Filter):
    """Drops TensorFlow's "N out of the last M calls to <function ...> triggered tf.function
    retracing" where the function is mpwatch's own (:data:`OWN_TRACED`): the pre-flight makes a
    probe per candidate and per change, each traced once, which TensorFlow's detector takes for
    a ``tf.function`` made in a loop of the user's code. Any other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not ("triggered tf.function retracing" in msg and any(n in msg for n in OWN_TRACED))


@contextlib.contextmanager
def own_retracing_quiet() -> Iterator[None]:
    """TensorFlow's retracing warnings about mpwatch's own functions left out while it runs
    (:class:`_OwnRetracing`, on the ``tensorflow`` logger; removed afterwards)."""
    tf_logger, quiet = logging.getLogger("tensorflow"), _OwnRetracing()
    tf_logger.addFilter(quiet)
    try:
        yield
    finally:
        tf_logger.removeFilter(quiet)


def _rank(v: Verdict) -> int:
    """Ready first, then ready with a change of policies only, then with code to write (the
    order of ``policies`` within each: ``sorted`` is stable)."""
    if v.verdict == READY:
        return 0
    return 2 if v.code_changes else 1


def _device_fits(v: Verdict) -> bool:
    """False for bfloat16 on a GPU without bfloat16 Tensor Cores (compute capability below 8.0),
    where it runs slower than float32; the candidate's ``reason`` says so."""
    if "bfloat16" not in v.policy:
        return True
    from mpwatch.read import load_run

    device = load_run(v.run, warn=False).info.get("device") or {}
    cc = str(device.get("compute_capability") or "")
    try:
        old = device.get("type") == "GPU" and float(cc) < 8.0
    except ValueError:
        old = False
    if old:
        v.reason += (
            f"; not recommended on this GPU (compute capability {cc}: no bfloat16 Tensor Cores)"
        )
    return not old


def _candidate(model: Any, batch: tuple, policy: str, out: str, loss_fn: Any) -> Verdict:
    """Record, diagnose and judge one candidate (:func:`_judged`), noting a custom train_step
    the pre-flight cannot check."""
    from mpwatch.record.callbacks.train_step import train_step_owner

    v = _judged(model, batch, policy, out, loss_fn)
    owner = train_step_owner(model)
    if owner and v.verdict in (READY, READY_WITH_CHANGE):
        v.reason += f"; unchecked: whether the custom train_step ({owner}) scales the loss"
    return v


def _judged(model: Any, batch: tuple, policy: str, out: str, loss_fn: Any) -> Verdict:
    """Record, diagnose and judge one candidate; where its problems call for a change, record it
    again with the change applied, and again with what that run still asks for added (a float16
    softmax's overflowing backward pass hid that keeping 'logsumexp_pool' float32 works), until
    nothing new is asked or :data:`MAX_ROUNDS`."""
    run_dir = os.path.join(out, policy)
    rec = record_candidate(model, batch, policy, run_dir, loss_fn=loss_fn)
    run = load_run(run_dir, warn=False)
    first = judge_candidate(policy, run, diagnose_run(run), error=rec.error)
    if not rec.probed or not first.changes_model:
        return first
    fix, added, checked = first.fix, [], None
    for i in range(MAX_ROUNDS):
        checked_dir = os.path.join(out, policy + CHECKED_SUFFIX + (f"-{i + 1}" if i else ""))
        record_candidate(
            model, batch, policy, checked_dir, loss_fn=loss_fn,
            float32_layers=fix.float32_layers, scale=fix.loss_scale,
        )  # fmt: skip
        checked_run = load_run(checked_dir, warn=False)
        checked = judge_candidate(policy, checked_run, diagnose_run(checked_run))
        more = [n for n in checked.fix.float32_layers if n not in fix.float32_layers]
        scale = fix.loss_scale or checked.fix.loss_scale
        if not more and scale == fix.loss_scale:
            break
        added += [f for f in checked.problems if f.action]
        fix = replace(fix, float32_layers=(*fix.float32_layers, *more), loss_scale=scale)
    v = judge_candidate(policy, run, first.findings, checked=checked)
    v.fix, v.added = fix, added
    if v.verdict == READY_WITH_CHANGE:
        v.reason = change_words(v, checked)
    return v


def _unchecked(model: Any) -> list[str]:
    """What this pre-flight leaves unchecked, in words."""
    from mpwatch.record.callbacks.train_step import train_step_owner

    out = [
        "step time: whether mixed precision is faster is measured only by training on the "
        "device the fit will use (a few steps under each policy; mpwatch diagnose compares a "
        "mixed run with a float32 run in one logdir)",
        "other batches: one batch was probed; larger values later in training can still "
        "overflow (the fit's monitor probes again)",
    ]
    owner = train_step_owner(model)
    if owner:
        out.append(
            f"the custom train_step ({owner}): whether it calls optimizer.scale_loss is seen "
            "only when Keras traces it, at the fit's first step (MixedPrecisionMonitor checks it)"
        )
    return out
