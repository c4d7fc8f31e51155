"""TensorFlow statistics of many tensors a bounded piece at a time, in a graph of few operations.

The probe's tables (:mod:`mpwatch.record.probe.underflow`: a row per gradient or layer output, sums
in float64) and the tap's gradient counts (:func:`mpwatch.record.tap.stats.counts_table`) reduce
every
gradient of a step. Two costs bound how:

- **Temporaries.** TensorFlow runs each operation of a graph to completion (no fusion), so every
  elementwise step of a statistic is a temporary the size of its operand. Over every gradient at
  once, cast to float64 and concatenated, they were several copies of all the weights (a wide
  MLP's fit with a probe every 3 steps peaked at 2.3x a plain fit's).
- **Operations.** A graph costs memory for as long as it is kept, whether it runs or not: about
  20 KiB an operation on TensorFlow 2.21 (the traced graph, its optimized copies, its kernels).
  Reductions repeated per tensor, per slice or per loop body (each ``tf.while_loop`` body is a
  function TensorFlow instantiates on its own) were 5,176 operations for the counts of
  ResNet50's 214 gradients: 105 MiB more resident memory at every step of the fit (now 1,360
  operations, 35 MiB, measured by tracing the counts alone).

So each table is computed over *pieces* of :data:`CHUNK` elements (fewer where all its tensors
together hold fewer: the next power of two), one after the other
(each waits on the previous one's rows), by **one** function that every piece calls (kept a
function, not inlined: its operations exist once however many pieces there are):

- every tensor is cut into *items*: the whole tensor when it holds at most :data:`CHUNK`
  elements, else its slices of :data:`CHUNK` elements (the last one shorter);
- items are packed in order into pieces of at most :data:`CHUNK` elements and
  :data:`MAX_ITEMS` items, concatenated and padded with zeros to the piece's length;
- the function takes a piece's columns and the ends of its items, computes each element's item
  (``-1`` for the padding, which segment reductions drop) and returns a row per item;
- the items' rows are combined into each tensor's row by sum or max (``kinds``).

A piece's temporaries are a few float64 copies of :data:`CHUNK` elements (4 MiB each), and the
graph grows by a few operations per item and per piece. The statistics are the same: every
column is a count, a sum or a maximum, which add or combine across items (float64 sums of
another grouping: equal to within rounding). A tensor without a static size is an item of its
own, reduced by an inline copy of the row function.

Example:
    >>> import tensorflow as tf  # doctest: +SKIP
    >>> def positives(cols, seg, k, sizes):
    ...     count, _, _ = segment_tools(seg, k)
    ...     return tf.stack([count(cols[0] > 0)], axis=1)
    >>> table([[tf.range(-3.0, 2e6)]], positives, ("sum",)).numpy()  # doctest: +SKIP
    array([[1999999.]])
"""

from __future__ import annotations

import weakref
from typing import Any

#: the elements of one piece (float64 temporaries of 4 MiB)
CHUNK = 1 << 19
#: the most items (tensors or slices of tensors) one piece holds
MAX_ITEMS = 64


_FLAT_SHAPE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # graph -> its [-1]


def flat(t: Any) -> Any:
    """A tensor (or ``tf.IndexedSlices``, made dense) as a 1-D tensor of its own dtype (a view).
    In a graph, every call shares one constant shape ``[-1]``: a graph's operations cost memory
    (see the module doc), and the probe flattens every gradient and layer output twice."""
    import tensorflow as tf

    if isinstance(t, tf.IndexedSlices):
        t = tf.convert_to_tensor(t)
    t = tf.convert_to_tensor(t)
    if tf.executing_eagerly():
        return tf.reshape(t, [-1])
    graph = tf.compat.v1.get_default_graph()
    shape = _FLAT_SHAPE.get(graph)
    if shape is None:
        with tf.control_dependencies(None):  # no control input from where it is first made
            shape = _FLAT_SHAPE[graph] = tf.constant([-1], tf.int32)
    return tf.reshape(t, shape)


def segment_tools(seg: Any, k: int) -> tuple[Any, Any, Any]:
    """(count(mask), sum(x), max(x)) per segment of the int32 ids ``seg`` (``-1``: dropped),
    ``[k]`` float64; an empty segment's max is 0 (the statistics' maxima are of magnitudes)."""
    import tensorflow as tf

    def count(mask: Any) -> Any:
        return tf.math.unsorted_segment_sum(tf.cast(mask, tf.float64), seg, k)

    def total(x: Any) -> Any:
        return tf.math.unsorted_segment_sum(x, seg, k)

    def largest(x: Any) -> Any:
        return tf.maximum(tf.math.unsorted_segment_max(x, seg, k), tf.constant(0, x.dtype))

    return count, total, largest


Item = tuple[int, int, int]  # (tensor, begin, length)


def _items(columns: list[list[Any]]) -> tuple[list[Item], list[int]]:
    """((tensor, begin, length) per item, tensors without a static size)."""
    items: list[Item] = []
    dynamic: list[int] = []
    for i, t in enumerate(columns[0]):
        size = t.shape.num_elements()
        if size is None:
            dynamic.append(i)
            continue
        items.extend((i, b, min(CHUNK, size - b)) for b in range(0, size, CHUNK))
        if size == 0:
            items.append((i, 0, 0))
    return items, dynamic


def _pack(items: list[Item], length: int) -> list[list[Item]]:
    """The items in order, in pieces of at most ``length`` elements and MAX_ITEMS items."""
    pieces: list[list[Any]] = []
    held = length + 1
    for item in items:
        if held + item[2] > length or len(pieces[-1]) >= MAX_ITEMS:
            pieces.append([])
            held = 0
        pieces[-1].append(item)
        held += item[2]
    return pieces


def _piece_function(rows: Any, dtypes: list[Any], length: int) -> Any:
    """The one function every piece calls: ``(columns [length]..., ends [MAX_ITEMS] int32) ->
    [MAX_ITEMS, kinds]`` float64 rows (an item's elements: from the previous end to its own;
    unused items end where the last one does, and are empty)."""
    import tensorflow as tf

    spec = [tf.TensorSpec([length], d) for d in dtypes] + [tf.TensorSpec([MAX_ITEMS], tf.int32)]

    def one(*args: Any) -> Any:
        cols, ends = [tf.cast(c, tf.float64) for c in args[:-1]], args[-1]
        position = tf.range(length, dtype=tf.int32)
        seg = tf.searchsorted(ends, position, side="right", out_type=tf.int32)
        seg = tf.where(position < ends[-1], seg, -1)  # the padding: dropped
        sizes = tf.cast(ends - tf.concat([[0], ends[:-1]], 0), tf.float64)
        return rows(cols, seg, MAX_ITEMS, sizes)

    return tf.function(
        one, input_signature=spec, autograph=False, experimental_attributes={"_noinline": True}
    )


def _runtime_zero(column: list[Any]) -> Any:
    """An int32 0 that only the data gives (no element is both NaN and finite). The pieces'
    ends are offset by it: a constant argument would let TensorFlow specialize the function for
    each call and fold each piece's element-to-item map into a constant of :data:`CHUNK`
    elements, made when the piece first runs and kept with the graph (ResNet50's gradient
    counts: 260 MiB more at the first step that counts)."""
    import tensorflow as tf

    for t in column:
        if t.shape.num_elements() != 0:
            head = t[:1]
            never = tf.logical_and(tf.math.is_nan(head), tf.math.is_finite(head))
            return tf.reduce_sum(tf.cast(never, tf.int32))
    return tf.constant(0, tf.int32)


def _dtype(column: list[Any]) -> Any:
    """The dtype a column's pieces are concatenated in: float64 if any tensor is, else float32
    (float16 and bfloat16 widen to it exactly)."""
    import tensorflow as tf

    return tf.float64 if any(t.dtype == tf.float64 for t in column) else tf.float32


def _concat(column: list[Any], piece: list[tuple[int, int, int]], dtype: Any, length: int) -> Any:
    """A piece's items of one column, in ``dtype``, concatenated and padded with zeros to
    ``length`` elements."""
    import tensorflow as tf

    parts = [
        tf.cast(
            column[i]
            if (b, length) == (0, column[i].shape.num_elements())
            else tf.slice(column[i], [b], [length]),
            dtype,
        )
        for i, b, length in piece
    ]
    whole = tf.concat(parts, 0) if len(parts) > 1 else parts[0]
    held = sum(length for _, _, length in piece)
    return tf.pad(whole, [[0, length - held]]) if held < length else whole


def table(columns: list[list[Any]], rows: Any, kinds: tuple[str, ...]) -> Any:
    """float64 ``[n, len(kinds)]``: a row per tensor of ``columns[0]`` (``columns`` are parallel
    lists of 1-D tensors, each row's of one size). ``rows(cols, seg, k, sizes)`` computes ``k``
    rows from one float64 1-D tensor per column, each element's row id in ``seg`` (int32, -1:
    none) and the rows' sizes (float64 ``[k]``), by segment reductions (:func:`segment_tools`);
    ``kinds`` says how each column combines across a tensor's items, ``"sum"`` or ``"max"``."""
    import numpy as np
    import tensorflow as tf

    n = len(columns[0])
    if n == 0:
        return tf.zeros([0, len(kinds)], tf.float64)
    items, dynamic = _items(columns)
    dtypes = [_dtype(col) for col in columns]
    # pieces of CHUNK elements, or fewer where every tensor together holds fewer (a small model's
    # statistics are not padded to a large piece): a power of two, so few sizes are traced
    length = min(CHUNK, 1 << max(0, sum(n for _, _, n in items) - 1).bit_length())
    fn = _piece_function(rows, dtypes, length) if items else None
    got: list[Any] = []
    owners: list[int] = []
    zero = _runtime_zero(columns[0])
    for piece in _pack(items, length):
        # the piece's copies made when the previous piece is done, not all of them at once
        with tf.control_dependencies(got[-1:]):
            cols = [_concat(col, piece, dtype, length) for col, dtype in zip(columns, dtypes)]
            ends = np.cumsum([length for _, _, length in piece], dtype=np.int32)
            ends = np.concatenate([ends, np.full(MAX_ITEMS - len(piece), ends[-1], np.int32)])
            out = fn(*cols, tf.constant(ends) + zero)
        got.append(out)  # all MAX_ITEMS rows: the unused ones' owner is -1 (dropped below)
        owners.extend([i for i, _, _ in piece] + [-1] * (MAX_ITEMS - len(piece)))
    for i in dynamic:  # an item of its own, the row function inline
        with tf.control_dependencies(got[-1:]):
            cols = [tf.cast(col[i], tf.float64) for col in columns]
            size = tf.cast(tf.size(cols[0]), tf.float64)
            got.append(rows(cols, tf.zeros(tf.shape(cols[0]), tf.int32), 1, tf.reshape(size, [1])))
        owners.append(i)
    every = tf.concat(got, 0) if len(got) > 1 else got[0]
    ids = tf.constant(owners, tf.int32)
    summed = tf.math.unsorted_segment_sum(every, ids, n)
    maxed = tf.math.unsorted_segment_max(every, ids, n)
    return tf.where(tf.constant([k == "max" for k in kinds]), maxed, summed)
