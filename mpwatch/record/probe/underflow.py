"""The probe's math: true gradient underflow against a float32 reference, and what other scales
would do.

Definitions (``docs/design.md``, "Probe"). Let ``S`` be the loss scale, ``g_ref`` a gradient of the
float32 twin and ``gS`` the mixed-precision gradient as Keras' train step gets it (``tape.gradient``
of ``loss * S``: float32 values cast back from float16, zeros where float16 underflowed).

- **underflow fraction**: among elements with ``g_ref != 0``, the share with ``gS == 0``. Genuine
  zeros (dead ReLUs, unused embedding rows) are zero in the reference too and never counted.
  Aggregated per layer and model-wide by summing counts (element-weighted), never by averaging
  fractions.
- **gradient relative error**: ``||gS / S - g_ref||_2 / ||g_ref||_2`` (sums of squares in float64,
  so tiny gradients do not underflow in the squares). Infinite when ``gS`` holds inf/nan.
- **log2 histogram**: counts of ``floor(log2 |g_ref|)`` over the reference's nonzero elements, in
  integer bins, exact also at powers of two. The float16 window ``[2**-24, 65504]`` shifted by
  ``-log2 S`` (what ``g_ref`` must be for ``g_ref * S`` to be representable) goes with it.
- **sweep**, for each power-of-two scale ``2**k``: the *predicted* underflow fraction, the share of
  nonzero reference elements with ``|g_ref| * 2**k < 2**-24`` (below float16's smallest subnormal:
  flushed to zero or rounded to the smallest subnormal), and the predicted overflow fraction, the
  share with ``|g_ref| * 2**k >= 2**16`` (past 65504: inf). Both are exact sums of histogram bins,
  because the thresholds are powers of two and the bins are integer powers of two. Against
  float16's own rounding of ``g_ref * 2**k`` (round to nearest even: values up to ``2**-25``
  become 0, values from 65520 become inf) each is within one doubling:
  ``under(k + 1) <= zero share(k) <= under(k)`` and ``over(k) <= inf share(k) <= over(k + 1)``
  (tests/record/test_underflow.py checks both with numpy's float16). The judge compares scales
  on these predictions only (``mpwatch/judge/evidence/scale_evidence.py``).
- **recommended scale**: the largest ``2**k`` in the sweep whose scaled maximum (of the weight
  gradients and, where measured, the activation gradients) stays at least ``margin_bits`` doublings
  below 65504: ``max|g_ref| * 2**k <= 65504 / 2**margin_bits``. Predicted underflow never rises with
  ``S``, so this is the scale with the least underflow that keeps the margin. The default margin,
  :data:`DEFAULT_MARGIN_BITS` = 4 (a factor 16), leaves room for gradients larger than on the probe
  batch (other batches, later in training) before Keras' dynamic scaling must skip a step.

The ``*_table`` functions and :func:`log2_bins` build TensorFlow ops (usable inside
``tf.function``) and return small float64 tables; everything else is plain numpy on the host.
:mod:`mpwatch.record.probe.probe_jax` computes the same tables on Keras' JAX backend.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mpwatch.formats import FLOAT16, FloatFormat, headroom_bits  # noqa: F401  (re-exported)

# histogram bins: floor(log2|x|) in [HIST_LO, HIST_HI): float32's subnormals to its max
HIST_LO = -160
HIST_HI = 140
NUM_BINS = HIST_HI - HIST_LO
SWEEP_LOG2 = tuple(range(-8, 41))  # the scales 2**-8 .. 2**40 predicted in each probe
DEFAULT_MARGIN_BITS = 4
UNDERFLOW_LOG2 = -24  # log2 of float16's smallest subnormal
OVERFLOW_LOG2 = 16  # 2**16 > 65504: everything at or above overflows

# columns of grad_table
G_SIZE, G_REF_NONZERO, G_UNDERFLOW, G_ERR_SQ, G_REF_SQ, G_NONFINITE, G_MAX_REF = range(7)
# columns of activation_table
A_SIZE, A_ERR_SQ, A_REF_SQ, A_MAX_MIXED, A_NONFINITE, A_MAX_REF = range(6)
# columns of act_grad_table
AG_REF_NONZERO, AG_UNDERFLOW, AG_MAX_REF, AG_NONFINITE = range(4)


# --- in the graph ---------------------------------------------------------------------------------
def _dense(x: Any) -> Any:
    import tensorflow as tf

    if x is None:
        return None
    if isinstance(x, tf.IndexedSlices):
        x = tf.convert_to_tensor(x)
    return tf.convert_to_tensor(x)


def log2_bins(x: Any) -> Any:
    """int64 ``[NUM_BINS]``: counts of ``floor(log2|x|)`` over the finite nonzero elements of x,
    clipped into ``[HIST_LO, HIST_HI)``. Exact at powers of two (corrected after the log)."""
    import tensorflow as tf

    a = tf.reshape(tf.abs(tf.cast(_dense(x), tf.float64)), [-1])
    a = tf.boolean_mask(a, tf.logical_and(a > 0, tf.math.is_finite(a)))
    e = tf.floor(tf.math.log(a) / math.log(2.0))
    two = tf.constant(2.0, tf.float64)
    e = tf.where(tf.pow(two, e + 1.0) <= a, e + 1.0, e)
    e = tf.where(tf.pow(two, e) > a, e - 1.0, e)
    idx = tf.clip_by_value(tf.cast(e, tf.int32) - HIST_LO, 0, NUM_BINS - 1)
    return tf.math.bincount(idx, minlength=NUM_BINS, maxlength=NUM_BINS, dtype=tf.int64)


def cast_through(x: Any, dtype: str, scale: float = 1.0) -> Any:
    """``x * scale`` rounded through a 16-bit dtype and back to float32 (the pre-flight's fallback
    simulation when no mixed twin can be built)."""
    import tensorflow as tf

    return tf.cast(tf.cast(tf.cast(_dense(x), tf.float32) * scale, dtype), tf.float32)


# --- in the graph, many tensors at once ----------------------------------------------------------
# Tables of many tensors at once: a piece of tf_chunks.CHUNK elements at a time, every piece by one
# function of segment reductions (mpwatch/record/tap/tf_chunks.py), so the graph grows by a few
# operations per tensor, not by ~20 reductions per tensor (a graph's operations cost memory for
# the whole fit, and tracing time), and the temporaries of one piece exist at a time (a few
# float64 copies of tf_chunks.CHUNK elements, not of every gradient). Sums in float64.
def _abs_finite(x: Any) -> Any:
    import tensorflow as tf

    a = tf.abs(x)
    return tf.where(tf.math.is_finite(a), a, tf.constant(0, a.dtype))  # (a scalar: see _zeros_as)


def _zeros_as(x: Any) -> Any:
    """Zeros of ``x``'s shape and dtype computed from ``x`` when the step runs, also where ``x``
    is not finite. Never ``zeros_like``/``ones_like`` of a tensor of static shape: TensorFlow's
    graph optimizer folds those into constants as large as the tensor, kept with the probe's
    function for the whole fit (ResNet50 at 64x64: hundreds of MiB)."""
    import tensorflow as tf

    return tf.math.multiply_no_nan(x, tf.constant(0, x.dtype))


def _flats(tensors: list[Any]) -> list[Any]:
    from mpwatch.record.tap.tf_chunks import flat

    return [flat(t) for t in tensors]


def grad_table(mixed_scaled: list[Any], refs: list[Any], scale: Any) -> Any:
    """float64 ``[n, 7]``, a row per (mixed, reference) gradient pair (columns ``G_*``): size,
    ref_nonzero, underflow_count, err_sq, ref_sq, nonfinite count of the mixed gradient,
    max|g_ref|. ``mixed_scaled`` are the gradients of ``loss * scale``; a missing gradient
    (None) is zeros of the other's shape; both missing: a zero row (size 0)."""
    import tensorflow as tf

    from mpwatch.record.tap import tf_chunks

    ms, rs = [], []
    for m, r in zip(mixed_scaled, refs):
        if m is None and r is None:
            ms.append(tf.zeros([0], tf.float32))
            rs.append(tf.zeros([0], tf.float32))
            continue
        r = tf_chunks.flat(r) if r is not None else _zeros_as(tf_chunks.flat(m))
        ms.append(tf_chunks.flat(m) if m is not None else _zeros_as(r))
        rs.append(r)
    if not rs:
        return tf.zeros([0, 7], tf.float64)
    s64 = tf.cast(scale, tf.float64)

    def rows(cols: list[Any], seg: Any, k: int, sizes: Any) -> Any:
        count, total, largest = tf_chunks.segment_tools(seg, k)
        r, m = cols
        ref_nz = tf.not_equal(r, 0.0)
        diff = m / s64 - r
        a = tf.abs(r)
        max_ref = largest(tf.where(tf.math.is_nan(a), tf.constant(math.inf, tf.float64), a))
        return tf.stack(
            [
                sizes,
                count(ref_nz),
                count(tf.logical_and(ref_nz, tf.equal(m, 0.0))),
                total(tf.square(diff)),
                total(tf.square(r)),
                count(tf.logical_not(tf.math.is_finite(m))),
                max_ref,
            ],
            axis=1,
        )

    return tf_chunks.table([rs, ms], rows, ("sum",) * 6 + ("max",))


def activation_table(mixed: list[Any], refs: list[Any] | None) -> Any:
    """float64 ``[k, 6]``, a row per layer output (columns ``A_*``): size, err_sq, ref_sq,
    max|mixed| (inf if any element is non-finite), nonfinite count, max finite |ref|. ``refs``
    None (no reference pass): err_sq, ref_sq and max|ref| are 0."""
    import tensorflow as tf

    from mpwatch.record.tap import tf_chunks

    if not mixed:
        return tf.zeros([0, 6], tf.float64)

    def rows(cols: list[Any], seg: Any, k: int, sizes: Any) -> Any:
        count, total, largest = tf_chunks.segment_tools(seg, k)
        m = cols[0]
        nonfinite = count(tf.logical_not(tf.math.is_finite(m)))
        max_m = tf.where(
            nonfinite > 0, tf.constant(math.inf, tf.float64), largest(_abs_finite(m))
        )
        if len(cols) == 1:
            zero = sizes * 0.0
            return tf.stack([sizes, zero, zero, max_m, nonfinite, zero], axis=1)
        r = cols[1]
        return tf.stack(
            [
                sizes,
                total(tf.square(m - r)),
                total(tf.square(r)),
                max_m,
                nonfinite,
                largest(_abs_finite(r)),
            ],
            axis=1,
        )

    kinds = ("sum", "sum", "sum", "max", "sum", "max")
    columns = [_flats(mixed)] + ([] if refs is None else [_flats(refs)])
    return tf_chunks.table(columns, rows, kinds)


def act_grad_table(mixed_scaled: list[Any], refs: list[Any]) -> Any:
    """float64 ``[k, 4]``, a row per gradient w.r.t. a layer output (columns ``AG_*``):
    ref_nonzero, underflow_count, max finite |ref| (unscaled), nonfinite count of the mixed one; a
    zero row where the reference gradient is missing."""
    import tensorflow as tf

    from mpwatch.record.tap import tf_chunks

    present = [i for i, r in enumerate(refs) if r is not None]
    if not present:
        return tf.zeros([len(refs), 4], tf.float64)
    rs = [tf_chunks.flat(refs[i]) for i in present]
    ms = [
        tf_chunks.flat(mixed_scaled[i]) if mixed_scaled[i] is not None else _zeros_as(r)
        for i, r in zip(present, rs)
    ]

    def piece(cols: list[Any], seg: Any, k: int, sizes: Any) -> Any:
        count, _, largest = tf_chunks.segment_tools(seg, k)
        r, m = cols
        nz = tf.not_equal(r, 0.0)
        return tf.stack(
            [
                count(nz),
                count(tf.logical_and(nz, tf.equal(m, 0.0))),
                largest(_abs_finite(r)),
                count(tf.logical_not(tf.math.is_finite(m))),
            ],
            axis=1,
        )

    rows = tf_chunks.table([rs, ms], piece, ("sum", "sum", "max", "sum"))
    if len(present) == len(refs):
        return rows
    index = tf.constant([[i] for i in present], tf.int32)
    return tf.scatter_nd(index, rows, [len(refs), 4])


def histogram_and_zeros(tensors: list[Any]) -> tuple[Any, Any]:
    """(:func:`log2_bins` of all ``tensors`` together, float64 count of their exact zeros)."""
    import tensorflow as tf

    from mpwatch.record.tap import tf_chunks

    flats = _flats([t for t in tensors if t is not None])
    if not flats:
        return tf.zeros([NUM_BINS], tf.int64), tf.constant(0.0, tf.float64)

    def rows(cols: list[Any], seg: Any, k: int, sizes: Any) -> Any:
        # the piece's counts together, in its first row (the rows are summed below)
        a = tf.boolean_mask(cols[0], seg >= 0)
        zeros = tf.reduce_sum(tf.cast(tf.equal(a, 0.0), tf.float64))
        row = tf.concat([tf.cast(log2_bins(a), tf.float64), tf.reshape(zeros, [1])], 0)
        return tf.pad(tf.expand_dims(row, 0), [[0, k - 1], [0, 0]])

    table = tf_chunks.table([flats], rows, ("sum",) * (NUM_BINS + 1))
    total = tf.reduce_sum(table, axis=0)
    return tf.cast(total[:NUM_BINS], tf.int64), total[NUM_BINS]


# --- on the host ----------------------------------------------------------------------------------
def fraction(num: float, den: float) -> float:
    """num / den, 0.0 when den is 0 (no nonzero reference element: nothing can underflow)."""
    return float(num) / float(den) if den else 0.0


def rel_error(err_sq: float, ref_sq: float) -> float:
    """sqrt(err_sq / ref_sq); 0 when both are 0, inf when only the reference is 0."""
    if not math.isfinite(err_sq):
        return math.inf if not math.isnan(err_sq) else math.nan
    if ref_sq > 0:
        return math.sqrt(err_sq / ref_sq)
    return 0.0 if err_sq == 0 else math.inf


def _summary(tot: list[float], max_ref: float) -> dict[str, float]:
    """The summary of one grad_table row, or of rows summed (``max_ref``: their largest)."""
    return {
        "size": int(tot[G_SIZE]),
        "ref_nonzero": int(tot[G_REF_NONZERO]),
        "underflow_count": int(tot[G_UNDERFLOW]),
        "underflow_fraction": fraction(tot[G_UNDERFLOW], tot[G_REF_NONZERO]),
        "grad_rel_error": rel_error(tot[G_ERR_SQ], tot[G_REF_SQ]),
        "nonfinite": int(tot[G_NONFINITE]),
        "max_abs_ref": float(max_ref),
    }


def summarize_grads(rows: np.ndarray) -> dict[str, float]:
    """Element-weighted summary of grad_table rows (one per variable): sums, then ratios."""
    rows = np.asarray(rows, np.float64).reshape(-1, 7)
    if not len(rows):
        return _summary([0.0] * 7, 0.0)
    return _summary(rows.sum(axis=0).tolist(), rows[:, G_MAX_REF].max())


def summarize_each(rows: np.ndarray) -> list[dict[str, float]]:
    """:func:`summarize_grads` of each row on its own (one per variable), from the rows as Python
    lists (no numpy call per variable)."""
    return [_summary(r, r[G_MAX_REF]) for r in np.asarray(rows, np.float64).reshape(-1, 7).tolist()]


def histogram(counts: np.ndarray, scale: float | None, fmt: FloatFormat = FLOAT16) -> dict:
    """The record's histogram dict: trimmed integer edges, counts, the format's window in log2 of
    the unscaled gradient (shifted by ``-log2 scale``). ``zeros`` is filled in by the caller."""
    counts = np.asarray(counts, np.int64)
    nz = np.nonzero(counts)[0]
    lo, hi = (int(nz[0]), int(nz[-1]) + 1) if len(nz) else (0, 0)
    shift = math.log2(scale) if scale else 0.0
    w_lo, w_hi = fmt.window_log2
    return {
        "edges_log2": [HIST_LO + i for i in range(lo, hi + 1)] if hi > lo else [],
        "counts": counts[lo:hi].tolist(),
        "zeros": 0,
        "window_log2": [w_lo - shift, w_hi - shift],
    }


def sweep(counts: np.ndarray, scales_log2: tuple[int, ...] = SWEEP_LOG2) -> list[list[float]]:
    """Rows ``[scale_log2, scale, predicted_underflow_fraction, predicted_overflow_fraction]`` from
    the full ``[NUM_BINS]`` histogram of the nonzero reference gradients (see the module doc)."""
    counts = np.asarray(counts, np.float64)
    total = counts.sum()
    e = np.arange(HIST_LO, HIST_HI)
    rows = []
    for k in scales_log2:
        under = counts[e < UNDERFLOW_LOG2 - k].sum()
        over = counts[e >= OVERFLOW_LOG2 - k].sum()
        rows.append([int(k), float(2.0**k), fraction(under, total), fraction(over, total)])
    return rows


def recommend_scale(
    max_abs: float,
    scales_log2: tuple[int, ...] = SWEEP_LOG2,
    margin_bits: float = DEFAULT_MARGIN_BITS,
    fmt: FloatFormat = FLOAT16,
) -> float | None:
    """The largest ``2**k`` with ``max_abs * 2**k <= fmt.max / 2**margin_bits`` (None when even the
    smallest swept scale is too large, or max_abs is not finite). With ``max_abs == 0`` (no gradient
    at all) the largest swept scale."""
    if not math.isfinite(max_abs):
        return None
    limit = fmt.max / 2.0**margin_bits
    ok = [k for k in scales_log2 if max_abs * 2.0**k <= limit]
    return float(2.0 ** max(ok)) if ok else None
