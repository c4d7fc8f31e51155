"""What the optimizer did with a batch, read from its own decision inside the train step.

A batch is a step. The optimizer either **skipped** it (a ``LossScaleOptimizer`` found its scaled
gradients not finite: ``check_finite``, the very test its ``apply`` branches on, on the same
gradients), **accumulated** it (Keras' ``gradient_accumulation_steps=n``: a finite batch whose
gradients are added to the accumulators, the weights untouched until every n-th), or **applied**
an update. Both taps (TensorFlow's, JAX's) write ``skipped`` per batch from here, and the lost
updates' counts take ``applied``.

Keras' public ``optimizer.iterations`` is no step count: under gradient accumulation it is the
raw counter divided by n, so three batches in four looked skipped (``Adam(
gradient_accumulation_steps=4)``: 8 real skips were recorded as 194, with "181 failed
doublings"). Without a ``LossScaleOptimizer`` nothing is skipped by the loss scale; a batch is
then skipped where the optimizer's raw counter (``_iterations``: it advances on every batch the
optimizer takes, applied or accumulated) did not advance.

Example:
    >>> import keras  # doctest: +SKIP
    >>> opt = keras.optimizers.Adam(gradient_accumulation_steps=4)  # doctest: +SKIP
    >>> raw_counter(opt) is opt._iterations  # doctest: +SKIP
    True
"""

from __future__ import annotations

from typing import Any


def inner(optimizer: Any) -> Any:
    """The optimizer that updates the weights (a LossScaleOptimizer's inner one)."""
    while getattr(optimizer, "inner_optimizer", None) is not None:
        optimizer = optimizer.inner_optimizer
    return optimizer


def raw_counter(optimizer: Any) -> Any:
    """The variable the updating optimizer advances on every batch it takes (applied or
    accumulated; not on a skip): its ``_iterations``, else its public ``iterations``."""
    opt = inner(optimizer)
    raw = getattr(opt, "_iterations", None)
    return raw if raw is not None else opt.iterations


def accumulation_steps(optimizer: Any) -> int:
    """Keras' ``gradient_accumulation_steps`` of the updating optimizer (1: none)."""
    return int(getattr(inner(optimizer), "gradient_accumulation_steps", None) or 1)


def finite(lso: Any, grads: Any) -> Any:
    """The LossScaleOptimizer's own decision on these gradients (a traced boolean), or None
    without one."""
    if lso is None:
        return None
    return lso.check_finite(list(grads))


def outcome(finite_grads: Any, raw_before: Any, raw_after: Any, steps: int) -> tuple[Any, Any]:
    """(skipped, applied) of one batch as float32 scalars of the traced step: skipped where the
    loss scale's decision said not finite (else where the raw counter did not advance); applied
    where not skipped and, under accumulation of ``steps`` batches, on the batch that updates
    (Keras' own test: ``(raw + 1) % steps == 0`` on the counter before the batch)."""
    from keras import ops

    if finite_grads is not None:
        skipped = 1.0 - ops.cast(finite_grads, "float32")
    else:
        skipped = ops.cast(ops.equal(raw_after, raw_before), "float32")
    if steps > 1:
        update = ops.equal(ops.mod(ops.cast(raw_before, "int32") + 1, steps), 0)
        return skipped, (1.0 - skipped) * ops.cast(update, "float32")
    return skipped, 1.0 - skipped
