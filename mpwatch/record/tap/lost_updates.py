"""Updates lost to rounding: how many of a step's updates left a 16-bit variable unchanged.

A variable stored in float16 or bfloat16 (a ``float16``/``bfloat16`` policy, or a layer whose
variable dtype is 16-bit) moves only when an update is at least half a unit in the last place of
its value: ``|w| * 2**-11`` in float16, ``|w| * 2**-8`` in bfloat16. Smaller updates are rounded
away and the weight stagnates while the loss says it trains. The taps measure it in the train
step, every ``grad_every`` steps, per trainable variable that is 16-bit:

- ``updates``: elements whose gradient is nonzero and finite on a step the optimizer applied (the
  elements the optimizer meant to move: SGD's update is ``-lr*g``, Adam's carries ``g`` into its
  first moment), 0 on a skipped step;
- ``unchanged``: of those, the elements whose value after the step equals the value before.

Both are float32 counts (exact up to 2**24 elements per variable). A float32 variable is not
measured (its row is NaN): float32 loses an update only below ``|w| * 2**-24``, and measuring it
would keep a copy of every float32 weight for the step. The taps add these two columns to their
per-variable gradient-counts table (:data:`UPDATES`, :data:`UNCHANGED`).

Example:
    >>> import numpy as np
    >>> lost_shares(np.array([[100.0, 25.0], [np.nan, np.nan]]))
    [0.25, nan]
"""

from __future__ import annotations

import math
from typing import Any

from mpwatch import formats
from mpwatch.record.tap.stats import NUM_COUNTS

UPDATES, UNCHANGED = NUM_COUNTS, NUM_COUNTS + 1  # columns after the gradient counts
NUM_UPDATE_COUNTS = 2


def is_16bit(variable: Any) -> bool:
    """Whether a Keras variable (or array) is stored in a 16-bit float."""
    return formats.is_16bit(getattr(variable, "dtype", None))


def tf_snapshot(variables: list[Any], which: list[int], do: Any) -> list[Any]:
    """The values of ``variables[i]`` for ``i`` in ``which`` before the update, on a step where
    ``do`` (else empty tensors: nothing is copied)."""
    import tensorflow as tf

    def copies() -> list[Any]:
        return [tf.identity(_value(variables[i])) for i in which]

    def empties() -> list[Any]:
        return [tf.zeros([0] * len(variables[i].shape), variables[i].dtype) for i in which]

    if not which:
        return []
    return list(tf.cond(do, copies, empties))


def _value(v: Any) -> Any:
    value = getattr(v, "value", v)
    return value.read_value() if hasattr(value, "read_value") else value


def tf_update_counts(
    grads: list[Any], old: list[Any], variables: list[Any], which: list[int], applied: Any,
    do: Any,
) -> Any:  # fmt: skip
    """``[len(grads), 2]`` float32 (TensorFlow, in the traced step, after the update):
    :data:`UPDATES` and :data:`UNCHANGED` of each variable in ``which`` (``old``: its
    :func:`tf_snapshot`), NaN for the others; zeros when ``do`` is false. ``applied``: float32
    1 when the optimizer applied the step, 0 when it skipped it."""
    import tensorflow as tf

    n = len(grads)
    nan = tf.fill([NUM_UPDATE_COUNTS], float("nan"))

    def counts() -> Any:
        rows = [nan] * n
        for k, i in enumerate(which):
            g = grads[i]
            if isinstance(g, tf.IndexedSlices):
                g = tf.convert_to_tensor(g)
            if g is None:
                rows[i] = tf.zeros([NUM_UPDATE_COUNTS])
                continue
            moved = tf.logical_and(tf.not_equal(g, 0), tf.math.is_finite(g))
            same = tf.logical_and(moved, tf.equal(_value(variables[i]), old[k]))
            rows[i] = applied * tf.stack(
                [
                    tf.reduce_sum(tf.cast(moved, tf.float32)),
                    tf.reduce_sum(tf.cast(same, tf.float32)),
                ]
            )
        return tf.stack(rows) if rows else tf.zeros([0, NUM_UPDATE_COUNTS])

    return tf.cond(do, counts, lambda: tf.zeros([n, NUM_UPDATE_COUNTS]))


def jax_update_counts(
    grads: list[Any], old: list[Any], new: list[Any], which: list[int], applied: Any
) -> Any:
    """:func:`tf_update_counts` on Keras' JAX backend (inside ``jax.jit``, under the tap's
    ``lax.cond``): ``old``/``new`` the values before and after the step of the trainable
    variables ``which`` (the 16-bit ones; NaN rows for the others); one reduction per measured
    variable (sharded variables reduce where their shards live)."""
    import jax.numpy as jnp

    nan = jnp.full((NUM_UPDATE_COUNTS,), jnp.nan, jnp.float32)
    rows = [nan] * len(grads)
    for i, a, b in zip(which, old, new):
        g = grads[i]
        if g is None:
            rows[i] = jnp.zeros((NUM_UPDATE_COUNTS,), jnp.float32)
            continue
        moved = (g != 0) & jnp.isfinite(g)
        same = moved & (a == b)
        rows[i] = applied * jnp.stack(
            [jnp.sum(moved, dtype=jnp.float32), jnp.sum(same, dtype=jnp.float32)]
        )
    if not rows:
        return jnp.zeros((0, NUM_UPDATE_COUNTS), jnp.float32)
    return jnp.stack(rows)


def lost_shares(update_counts: Any) -> list[float]:
    """Host side: ``unchanged / updates`` of each row of a ``[n, 2]`` table (NaN where the
    variable is not measured or nothing was meant to move)."""
    import numpy as np

    out = []
    for updates, unchanged in np.asarray(update_counts, np.float64).reshape(-1, 2):
        out.append(float(unchanged / updates) if updates > 0 else math.nan)
    return out
