"""In-graph tensor statistics: counts that tell how a tensor sits in float16's range.

Everything here builds TensorFlow ops (usable inside ``tf.function``, XLA and ``tf.distribute``
replica functions) and returns small tensors; turning counts into shares happens on the host with
:func:`shares`, once per logging interval.

For a tensor ``x`` (a scaled gradient ``g*S``) :func:`tensor_counts` returns, as float32 ``[5]``:

- ``zero``: elements exactly 0,
- ``subnormal``: elements with ``0 < |x| < 2**-14`` (float16's subnormal range: what underflows or
  loses precision in float16),
- ``nonfinite``: elements inf or nan,
- ``max_abs``: the largest ``|x|`` over the finite elements (0 for an empty tensor),
- ``size``: number of elements.

Example:
    >>> import tensorflow as tf  # doctest: +SKIP
    >>> tensor_counts(tf.constant([0.0, 1e-6, 3.0, float("inf")])).numpy()  # doctest: +SKIP
    array([1., 1., 1., 3., 4.], dtype=float32)
"""

from __future__ import annotations

import math
from typing import Any

from mpwatch.formats import FLOAT16

ZERO, SUBNORMAL, NONFINITE, MAX_ABS, SIZE = range(5)
NUM_COUNTS = 5


def tensor_counts(x: Any, normal_min: float = FLOAT16.smallest_normal) -> Any:
    """Counts of one tensor (dense or ``tf.IndexedSlices``: then over its stored values)."""
    import tensorflow as tf

    if isinstance(x, tf.IndexedSlices):
        x = x.values
    x = tf.convert_to_tensor(x)
    if not x.dtype.is_floating:
        x = tf.cast(x, tf.float32)
    a = tf.reshape(tf.abs(x), [-1])
    finite = tf.math.is_finite(a)
    zero = tf.reduce_sum(tf.cast(tf.equal(a, 0), tf.float32))
    sub = tf.reduce_sum(
        tf.cast(tf.logical_and(a > 0, a < tf.cast(normal_min, a.dtype)), tf.float32)
    )
    nonfinite = tf.reduce_sum(tf.cast(tf.logical_not(finite), tf.float32))
    max_abs = tf.reduce_max(tf.concat([tf.zeros([1], a.dtype), tf.where(finite, a, 0)], 0))
    size = tf.cast(tf.size(a), tf.float32)
    return tf.stack([zero, sub, nonfinite, tf.cast(max_abs, tf.float32), size])


def counts_table(tensors: list[Any], normal_min: float = FLOAT16.smallest_normal) -> Any:
    """``[len(tensors), 5]`` float32: :func:`tensor_counts` of each tensor (None gives zeros)."""
    import tensorflow as tf

    rows = [
        tf.zeros([NUM_COUNTS], tf.float32) if t is None else tensor_counts(t, normal_min)
        for t in tensors
    ]
    return tf.stack(rows)


def shares(counts: Any) -> dict[str, float]:
    """Host side: one row (or the column sums of a table) of counts as the recorded statistics.

    Accepts a ``[5]`` row or a ``[n, 5]`` table (summed over rows, max over ``max_abs``). Returns
    zero_fraction, subnormal_fraction, nonfinite_count, max_abs, headroom_bits, size.
    """
    import numpy as np

    c = np.asarray(counts, dtype=np.float64)
    if c.ndim == 2:
        total = c.sum(axis=0)
        total[MAX_ABS] = c[:, MAX_ABS].max() if len(c) else 0.0
        c = total
    size = c[SIZE]
    max_abs = float(c[MAX_ABS])
    return {
        "zero_fraction": float(c[ZERO] / size) if size else math.nan,
        "subnormal_fraction": float(c[SUBNORMAL] / size) if size else math.nan,
        "nonfinite_count": float(c[NONFINITE]),
        "max_abs": max_abs,
        "headroom_bits": _headroom(max_abs),
        "size": int(size),
    }


def _headroom(max_abs: float) -> float:
    if max_abs <= 0:
        return math.inf
    return math.log2(FLOAT16.max / max_abs)
