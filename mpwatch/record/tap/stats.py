"""In-graph tensor statistics: counts that tell how a tensor sits in float16's range.

The statistics are built for the backend the train step runs on: TensorFlow ops (usable inside
``tf.function``, XLA and ``tf.distribute`` replica functions: :func:`tensor_counts`,
:func:`counts_table`) or JAX ones inside ``jax.jit`` (:func:`jax_counts_table` and its
variants). Each returns small tensors; turning counts into shares happens on the host with
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
    """``[len(tensors), 5]`` float64: :func:`tensor_counts` of each tensor (None gives zeros).

    A piece of ``tf_chunks.CHUNK`` elements at a time (:func:`mpwatch.record.tap.tf_chunks.table`:
    the tensors, or slices of the large ones, concatenated, every piece counted by one function
    of segment reductions, the pieces in sequence): a few operations per tensor, whether the
    step counts or not. Counted in float64 (exact for float16 and float32 values). All the
    gradients at once, concatenated, were a copy of them and their magnitudes beside training at
    every count step (the wide MLP's fit peak 1.07x a plain fit's at the defaults).
    """
    import tensorflow as tf

    from mpwatch.record.tap import tf_chunks

    flats = [tf.zeros([0], tf.float32) if t is None else tf_chunks.flat(t) for t in tensors]
    flats = [f if f.dtype.is_floating else tf.cast(f, tf.float32) for f in flats]

    def rows(cols: list[Any], seg: Any, k: int, sizes: Any) -> Any:
        return _segment_counts(cols, seg, k, sizes, normal_min)

    return tf_chunks.table([flats], rows, ("sum", "sum", "sum", "max", "sum"))


def _segment_counts(cols: list[Any], seg: Any, k: int, sizes: Any, normal_min: float) -> Any:
    """``[k, 5]`` float64 counts of the segments ``seg`` of one float64 tensor (a piece of
    :func:`mpwatch.record.tap.tf_chunks.table`)."""
    import tensorflow as tf

    from mpwatch.record.tap.tf_chunks import segment_tools

    count, _, largest = segment_tools(seg, k)
    a = tf.abs(cols[0])
    finite = tf.math.is_finite(a)
    zero = count(tf.equal(a, 0))
    sub = count(tf.logical_and(a > 0, a < tf.cast(normal_min, a.dtype)))
    nonfinite = count(tf.logical_not(finite))
    max_abs = largest(tf.where(finite, a, tf.constant(0, a.dtype)))
    return tf.stack([zero, sub, nonfinite, max_abs, sizes], axis=1)


#: a tensor of at least this many elements is reduced on its own in :func:`jax_counts_table` (one
#: variadic reduction: its four statistics in one pass, no copy), not copied into the block
#: matrix. The matrix of every gradient made XLA's temporary memory of the tapped train step
#: larger than the plain step's (InceptionV3 on JAX, 21.8M weights: 468 -> 524 MB, and 16 MB
#: more of it touched at every step, the counts steps or not); its 190 gradients' counts took
#: 176-199 ms, 4.4 ms with the 73 of them above this size reduced on their own (2 CPU cores;
#: counted in int32, which XLA vectorizes: float32 sums of the same masks took 34 ms). Small
#: tensors (biases, norms) stay in the matrix, which keeps the program small for models of
#: hundreds of them.
DIRECT_MIN = 65_536


def jax_counts_table(
    tensors: list[Any],
    runtime_zero: Any = 0,
    normal_min: float = FLOAT16.smallest_normal,
    direct_min: int | None = DIRECT_MIN,
) -> Any:
    """:func:`counts_table` on Keras' JAX backend (inside ``jax.jit``): ``[len(tensors), 5]``
    float32. Tensors of at least ``direct_min`` elements are reduced one by one
    (:data:`DIRECT_MIN`; None: none); the others are laid out as rows
    (:class:`.jax_blocks.BlockLayout`: each row reduced, then the rows of each tensor; None gives
    zeros). The layout comes from the tensors' static sizes, so nothing here has a dynamic shape.
    ``runtime_zero``: an int32 0 known only at run time (e.g. ``min(counter, 0)``); it keeps XLA
    from constant-folding the row ids at compile time."""
    import jax.numpy as jnp
    import numpy as np

    k = len(tensors)
    if k == 0:
        return jnp.zeros((0, NUM_COUNTS), jnp.float32)
    big = [
        i
        for i, t in enumerate(tensors)
        if t is not None and direct_min is not None and int(np.prod(np.shape(t))) >= direct_min
    ]
    direct = set(big)
    small = [i for i in range(k) if i not in direct]
    parts = []
    if small:
        parts.append(_block_counts([tensors[i] for i in small], runtime_zero, normal_min))
    if big:
        parts.append(jnp.stack([_direct_counts(tensors[i], normal_min) for i in big]))
    table = jnp.concatenate(parts) if len(parts) > 1 else parts[0]
    if not big or not small:
        return table
    order = np.argsort(np.asarray(small + big))  # back to the tensors' order (static)
    return jnp.take(table, jnp.asarray(order, jnp.int32), axis=0)


def _direct_counts(t: Any, normal_min: float) -> Any:
    """``[5]`` float32 counts of one tensor, sharded or not (:func:`jax_counts_table_each`):
    zeros, subnormals and non-finite elements counted (in int32: exact past float32's 2^24) and
    the largest finite magnitude taken in one variadic reduction over every axis (one pass over
    ``t``, no temporary: four separate reductions of ``|t|`` kept it as a copy)."""
    import jax.numpy as jnp
    from jax import lax

    a = jnp.abs(jnp.asarray(t).astype(jnp.float32))  # not flattened: a sharded tensor reduces
    finite = jnp.isfinite(a)  # where its shards are, with no re-layout
    operands = (
        (a == 0).astype(jnp.int32),
        ((a > 0) & (a < normal_min)).astype(jnp.int32),
        (~finite).astype(jnp.int32),
        jnp.where(finite, a, 0.0),
    )

    def combine(x: Any, y: Any) -> Any:
        return x[0] + y[0], x[1] + y[1], x[2] + y[2], jnp.maximum(x[3], y[3])

    inits = tuple(jnp.zeros((), o.dtype) for o in operands)
    zero, sub, nonfinite, max_abs = lax.reduce(operands, inits, combine, tuple(range(a.ndim)))
    counts = [c.astype(jnp.float32) for c in (zero, sub, nonfinite)]
    return jnp.stack([*counts, max_abs, jnp.asarray(a.size, jnp.float32)])


def _block_counts(tensors: list[Any], runtime_zero: Any, normal_min: float) -> Any:
    """:func:`jax_counts_table` of tensors laid out as rows of one matrix."""
    import jax.numpy as jnp

    from mpwatch.record.tap.jax_blocks import BlockLayout

    flats = [jnp.zeros((0,), jnp.float32) if t is None else t for t in tensors]
    rows = BlockLayout.of(flats, runtime_zero)
    a = jnp.abs(rows.matrix(flats))
    finite = jnp.isfinite(a)

    def count(mask: Any) -> Any:
        return rows.count(mask).astype(jnp.float32)

    zero = count(a == 0) - jnp.asarray(rows.pads, jnp.float32)  # the padding is zeros
    sub = count((a > 0) & (a < normal_min))
    nonfinite = count(~finite)
    max_abs = rows.max(jnp.where(finite, a, 0.0))
    return jnp.stack([zero, sub, nonfinite, max_abs, jnp.asarray(rows.sizes, jnp.float32)], axis=1)


def jax_counts_table_each(tensors: list[Any], normal_min: float = FLOAT16.smallest_normal) -> Any:
    """:func:`jax_counts_table` with one reduction per tensor and count instead of segment
    reductions over the tensors concatenated: for tensors sharded over a device mesh (a
    ``keras.distribution``), where each device reduces its shard and XLA combines the partial
    results (scalars). Concatenating sharded tensors of different layouts and scattering them by
    segment would re-lay them out (a gather), and XLA's partitioned scatter over the padded
    concatenation counted padding as zeros (one extra zero in a kernel sharded 2x2, measured)."""
    import jax.numpy as jnp

    rows = [
        jnp.zeros((NUM_COUNTS,), jnp.float32) if t is None else _direct_counts(t, normal_min)
        for t in tensors
    ]
    if not rows:
        return jnp.zeros((0, NUM_COUNTS), jnp.float32)
    return jnp.stack(rows)


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
