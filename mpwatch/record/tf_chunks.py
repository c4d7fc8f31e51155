"""The TensorFlow probe's statistics a bounded piece at a time.

The probe's tables (:mod:`mpwatch.record.underflow`: a row per gradient or layer output, sums in
float64) were once computed over every tensor of a pass cast to float64 and concatenated: for a
wide MLP (3 x Dense 4096, 144 MiB of float32 weights) that was several float64 copies of all the
gradients at once, and the fit's peak memory with a probe every 3 steps was 2.3x a plain fit's.
TensorFlow runs each operation of a graph to completion (no fusion), so every elementwise step
of a statistic is a temporary the size of its operand: the way to bound them is to bound the
operands. Here each table is computed over *pieces* of at most :data:`CHUNK` elements, one piece
after the other:

- small tensors, grouped until a group holds :data:`CHUNK` elements, each group by the
  segment reductions of the row function (a few operations whatever the number of tensors);
- each tensor of more elements, a slice of :data:`CHUNK` elements at a time in a
  ``tf.while_loop``, its rows' columns combined by sum or max.

The pieces run in sequence (each one's inputs wait on the previous piece's result), so the
temporaries of one piece exist at a time: a few float64 copies of :data:`CHUNK` elements, 4 MiB
each. The statistics are the same: every column is a count, a sum or a maximum, which add or
combine across pieces (float64 sums of another grouping: equal to within rounding).

Example:
    >>> import tensorflow as tf  # doctest: +SKIP
    >>> count = lambda xs: tf.stack([[tf.reduce_sum(tf.cast(x > 0, tf.float64))] for x in xs])
    >>> table([[tf.range(-3.0, 2e6)]], count, ("sum",)).numpy()  # doctest: +SKIP
    array([[1999998.]])
"""

from __future__ import annotations

from typing import Any

#: the most elements one piece holds (float64 temporaries of 4 MiB)
CHUNK = 1 << 19


def flat(t: Any) -> Any:
    """A tensor (or ``tf.IndexedSlices``, made dense) as a 1-D tensor of its own dtype (a view)."""
    import tensorflow as tf

    if isinstance(t, tf.IndexedSlices):
        t = tf.convert_to_tensor(t)
    return tf.reshape(tf.convert_to_tensor(t), [-1])


def _f64(t: Any) -> Any:
    import tensorflow as tf

    return tf.cast(t, tf.float64)


def _size(t: Any) -> int | None:
    return t.shape.num_elements()


def table(columns: list[list[Any]], rows: Any, kinds: tuple[str, ...]) -> Any:
    """float64 ``[n, len(kinds)]``: a row per tensor of ``columns[0]`` (``columns`` are parallel
    lists of 1-D tensors, each row's of one size). ``rows(*lists)`` computes the rows of pieces
    (float64 1-D tensors, a list per column) by segment reductions; ``kinds`` says how each
    column combines across a tensor's slices, ``"sum"`` or ``"max"``."""
    import tensorflow as tf

    n = len(columns[0])
    if n == 0:
        return tf.zeros([0, len(kinds)], tf.float64)
    parts: list[tuple[list[int], Any]] = []
    last: list[Any] = []
    group: list[int] = []
    held = 0

    def run_group() -> None:
        nonlocal group, held
        if group:
            with tf.control_dependencies(last[-1:]):
                got = rows(*[[_f64(col[i]) for i in group] for col in columns])
            parts.append((group, got))
            last.append(got)
        group, held = [], 0

    for i in range(n):
        size = _size(columns[0][i])
        if size is not None and size > CHUNK:
            run_group()
            with tf.control_dependencies(last[-1:]):
                got = _sliced([col[i] for col in columns], size, rows, kinds)
            parts.append(([i], got))
            last.append(got)
            continue
        if size is not None and held + size > CHUNK:
            run_group()
        group.append(i)
        held += size or 0
    run_group()
    order = [i for idx, _ in parts for i in idx]
    out = tf.concat([got for _, got in parts], 0) if len(parts) > 1 else parts[0][1]
    if order == list(range(n)):
        return out
    import numpy as np

    return tf.gather(out, tf.constant(np.argsort(order), tf.int32))


def _sliced(flats: list[Any], size: int, rows: Any, kinds: tuple[str, ...]) -> Any:
    """``[1, len(kinds)]``: one tensor's row, :data:`CHUNK` elements a step of a loop, then the
    rest (fewer than :data:`CHUNK`). Every slice has a static size (XLA, which compiles Keras'
    train step, takes no dynamic shape), only its start moves."""
    import tensorflow as tf

    is_max = tf.constant([k == "max" for k in kinds])
    steps = size // CHUNK

    def combine(acc: Any, row: Any) -> Any:
        return tf.where(is_max, tf.maximum(acc, row), acc + row)

    def body(i: Any, acc: Any) -> tuple[Any, Any]:
        piece = [[_f64(tf.slice(f, [i * CHUNK], [CHUNK]))] for f in flats]
        return i + 1, combine(acc, rows(*piece)[0])

    init = (tf.constant(0, tf.int32), tf.zeros([len(kinds)], tf.float64))
    _, acc = tf.while_loop(
        lambda i, _: i < steps, body, init, maximum_iterations=steps, parallel_iterations=1
    )
    if size > steps * CHUNK:
        with tf.control_dependencies([acc]):
            rest = [[_f64(f[steps * CHUNK :])] for f in flats]
            acc = combine(acc, rows(*rest)[0])
    return tf.expand_dims(acc, 0)
