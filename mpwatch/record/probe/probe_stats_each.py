"""The JAX probe's statistics one tensor at a time: for tensors sharded over a device mesh, and
for every large tensor.

:mod:`mpwatch.record.probe.probe_jax` reduces all the gradients (or layer outputs) of a pass at
once: concatenated, then segment reductions, a few operations whatever the number of tensors (a
small program: XLA compiles it fast). Under a ``keras.distribution`` the tensors are sharded, each
after its own layout; concatenating them re-lays them out, which gathers every shard (the whole
model's gradients on every device), and XLA's partitioned scatter over the padded concatenation
counted padding as zeros (measured in the tap:
:func:`mpwatch.record.tap.stats.jax_counts_table_each`). Here each statistic is a reduction of one
tensor where its shards live (XLA combines the partial results, scalars), stacked: the same columns,
equal values.

The same reductions bound the probe's memory on one device: laying a tensor out as rows copies
it (the block matrix of every gradient and layer output made the probe of a wide MLP, 3 x Dense
4096, need 8.6x its float32 weights in XLA's temporary buffers), where a reduction of the tensor
itself is fused with what computes its operands and copies nothing. So
:func:`mpwatch.record.probe.probe_jax.routed` sends each tensor of at least
:data:`mpwatch.record.tap.stats.DIRECT_MIN` elements here and keeps the small ones (biases, norms)
in the block matrix, which keeps the program small for models of hundreds of them. The histogram is
the one statistic that is not a reduction (a scatter of each element's bin): on one device a
large tensor's bins are counted :data:`HIST_CHUNK` elements at a time in a loop
(:func:`log2_histogram` with ``chunked=True``), so the bin of each element never exists for the
whole tensor at once (it was an int32 copy of every gradient, twice).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mpwatch.record.probe import underflow


def sharded() -> bool:
    """Whether the probe traces under a ``keras.distribution`` (then the statistics here)."""
    import keras

    return keras.distribution.distribution() is not None


def _f32(t: Any) -> Any:
    import jax.numpy as jnp

    return jnp.asarray(t).astype(jnp.float32)


def _reduce(**operands: tuple[str, Any]) -> dict[str, Any]:
    """Reductions of same-shaped operands over every axis in one variadic reduction: each
    keyword is ``(kind, values)``, ``kind`` ``"count"`` (a mask, counted in int32), ``"sum"``
    or ``"max"`` (of values >= 0; 0 for an empty tensor). One pass over the elements, and the
    operands, computed from the tensors element by element, are never stored whole (separate
    reductions kept each int32 mask as a copy of the tensor). Sums are float32, as everything
    JAX computes (a sum of squares over 600k elements of magnitudes 2^-40 to 2^8 was 7e-5 off
    float64's: a gradient relative error 3.5e-5 of itself off)."""
    import jax.numpy as jnp
    from jax import lax

    kinds = [k for k, _ in operands.values()]
    values = tuple(
        v.astype(jnp.int32) if k == "count" else v.astype(jnp.float32)
        for k, v in operands.values()
    )
    inits = tuple(jnp.zeros((), v.dtype) for v in values)

    def combine(x: Any, y: Any) -> Any:
        return tuple(
            jnp.maximum(a, b) if k == "max" else a + b for a, b, k in zip(x, y, kinds)
        )

    if not sharded():  # float32 sums: rows of ROW elements first, then the rows' partial
        # results (one sequence over a 4096 x 4096 gradient was 3.5e-3 off float64's; by rows,
        # as the block matrix sums, 6e-8). Flattened, sliced and laid out as rows inside the
        # reduction's fusion: no copy. (A sharded tensor is reduced where its shards are.)
        values = _by_rows(values, inits, combine)
    out = lax.reduce(values, inits, combine, tuple(range(values[0].ndim)))
    return dict(zip(operands, out))


#: elements a row of :func:`_by_rows` sums in one sequence
ROW = 1024


def _by_rows(values: tuple, inits: tuple, combine: Any) -> tuple:
    """The operands' partial results by rows of :data:`ROW` elements (the rest, fewer than a
    row, as one more partial result): vectors to reduce again."""
    import jax.numpy as jnp
    from jax import lax

    n = int(values[0].size)
    whole = n - n % ROW
    if whole < 2 * ROW:
        return values
    flat = [jnp.ravel(v) for v in values]
    parts = lax.reduce(tuple(f[:whole].reshape(-1, ROW) for f in flat), inits, combine, (1,))
    if whole == n:
        return parts
    rest = lax.reduce(tuple(f[whole:] for f in flat), inits, combine, (0,))
    return tuple(jnp.concatenate([p, r[None]]) for p, r in zip(parts, rest))


def _stack(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, Any]:
    import jax.numpy as jnp

    if not rows:
        return {k: jnp.zeros((0,), jnp.float32) for k in keys}
    return {k: jnp.stack([r[k] for r in rows]) for k in keys}


def _largest(x: Any, pow2: Any) -> tuple[dict[str, Any], Any, Any]:
    """(the finite max and non-finite count of ``|x|``, the max (inf where a value is not
    finite), the power of two at or above it that divides x's squares)."""
    import jax.numpy as jnp

    a = jnp.abs(x)
    finite = jnp.isfinite(a)
    got = _reduce(max=("max", jnp.where(finite, a, 0.0)), nonfinite=("count", ~finite))
    top = jnp.where(got["nonfinite"] > 0, jnp.inf, got["max"])
    return got, top, pow2(top)


def grad_stats(mixed_scaled: list, ref: list, scale: Any, pow2: Any) -> dict:
    """:func:`mpwatch.record.probe.probe_jax.grad_stats`, one variable at a time."""
    import jax.numpy as jnp

    rows = []
    for m, r in zip(mixed_scaled, ref):
        m, r = _f32(m), _f32(r)
        _, max_ref, norm = _largest(r, pow2)
        nz = r != 0
        diff = (m / scale - r) / norm
        got = _reduce(
            ref_nonzero=("count", nz),
            underflow=("count", nz & (m == 0)),
            err_n=("sum", diff * diff),
            ref_n=("sum", jnp.square(r / norm)),
            nonfinite=("count", ~jnp.isfinite(m)),
        )
        rows.append({**got, "norm": norm, "max_ref": max_ref})
    out = _stack(rows, ("ref_nonzero", "underflow", "err_n", "ref_n", "norm", "nonfinite",
                        "max_ref"))  # fmt: skip
    out["size"] = np.array([int(np.size(r)) for r in ref], np.int64)
    return out


def act_stats(mixed: list, ref: list | None, pow2: Any) -> dict:
    """:func:`mpwatch.record.probe.probe_jax.act_stats`, one layer output at a time."""
    import jax.numpy as jnp

    rows = []
    for i, m in enumerate(mixed):
        m = _f32(m)
        got, top, _ = _largest(m, pow2)
        row = {"nonfinite": got["nonfinite"], "max_mixed": top}
        if ref is not None:
            r = _f32(ref[i])
            ref_got, _, _ = _largest(r, pow2)
            row["max_ref"], row["norm"] = ref_got["max"], pow2(ref_got["max"])
            d = (m - r) / row["norm"]
            row.update(_reduce(err_n=("sum", d * d), ref_n=("sum", jnp.square(r / row["norm"]))))
        rows.append(row)
    keys = ("nonfinite", "max_mixed") + (
        ("max_ref", "norm", "err_n", "ref_n") if ref is not None else ()
    )
    out = _stack(rows, keys)
    out["size"] = np.array([int(np.size(m)) for m in mixed], np.int64)
    return out


def act_grad_stats(mixed_scaled: list, ref: list) -> dict:
    """:func:`mpwatch.record.probe.probe_jax.act_grad_stats`, one layer output at a time."""
    import jax.numpy as jnp

    rows = []
    for m, r in zip(mixed_scaled, ref):
        m, r = _f32(m), _f32(r)
        nz = r != 0
        a = jnp.abs(r)
        rows.append(_reduce(
            ref_nonzero=("count", nz),
            underflow=("count", nz & (m == 0)),
            max_ref=("max", jnp.where(jnp.isfinite(a), a, 0.0)),
            nonfinite=("count", ~jnp.isfinite(m)),
        ))  # fmt: skip
    keys = ("ref_nonzero", "underflow", "max_ref", "nonfinite")
    return _stack(rows, keys)


#: elements whose bins one step of the chunked histogram counts (a 1 MiB int32 temporary)
HIST_CHUNK = 1 << 18


def _bins(t: Any, keep: Any = True) -> Any:
    """int32 ``[NUM_BINS + 2]``: counts of ``floor(log2|t|)`` over t's finite nonzero elements
    where ``keep``, then the rest, then t's exact zeros where ``keep``."""
    import jax
    import jax.numpy as jnp

    a = jnp.abs(_f32(t))
    counted = (a > 0) & jnp.isfinite(a) & keep
    _, e = jnp.frexp(jnp.where(counted, a, 1.0))
    idx = jnp.clip(e - 1 - underflow.HIST_LO, 0, underflow.NUM_BINS - 1)
    zero = (a == 0) & keep
    idx = jnp.where(counted, idx, jnp.where(zero, underflow.NUM_BINS + 1, underflow.NUM_BINS))
    idx = idx.ravel()
    return jax.ops.segment_sum(
        jnp.ones_like(idx, jnp.int32), idx, num_segments=underflow.NUM_BINS + 2
    )


def _chunked_bins(t: Any) -> Any:
    """:func:`_bins` of a flat tensor, :data:`HIST_CHUNK` elements a step of a loop: the last
    step's window is moved back to end at the tensor's end, and the elements the step before
    counted are left out of it."""
    import jax.numpy as jnp
    from jax import lax

    flat = jnp.ravel(t)
    n = int(flat.shape[0])
    if n <= HIST_CHUNK:
        return _bins(flat)
    steps = -(-n // HIST_CHUNK)
    position = jnp.arange(HIST_CHUNK, dtype=jnp.int32)

    def body(i: Any, hist: Any) -> Any:
        begin = i * HIST_CHUNK
        start = jnp.minimum(begin, n - HIST_CHUNK)
        part = lax.dynamic_slice(flat, (start,), (HIST_CHUNK,))
        return hist + _bins(part, keep=position + start >= begin)

    return lax.fori_loop(0, steps, body, jnp.zeros((underflow.NUM_BINS + 2,), jnp.int32))


def log2_histogram(tensors: list, chunked: bool = False) -> tuple[Any, Any]:
    """:func:`mpwatch.record.probe.probe_jax.log2_histogram`: one histogram per tensor, summed.
    ``chunked``: each tensor's bins counted a chunk at a time (:func:`_chunked_bins`; on one
    device: a loop over slices of a sharded tensor would gather it)."""
    import jax.numpy as jnp

    hist = jnp.zeros((underflow.NUM_BINS + 2,), jnp.int32)
    for t in tensors:
        hist = hist + (_chunked_bins(t) if chunked else _bins(t))
    return hist[: underflow.NUM_BINS], hist[underflow.NUM_BINS + 1]
