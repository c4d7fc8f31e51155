"""The JAX probe's statistics one tensor at a time, for tensors sharded over a device mesh.

:mod:`mpwatch.record.probe_jax` reduces all the gradients (or layer outputs) of a pass at once:
concatenated, then segment reductions, a few operations whatever the number of tensors (a small
program: XLA compiles it fast). Under a ``keras.distribution`` the tensors are sharded, each
after its own layout; concatenating them re-lays them out, which gathers every shard (the whole
model's gradients on every device), and XLA's partitioned scatter over the padded concatenation
counted padding as zeros (measured in the tap: :func:`mpwatch.record.stats.jax_counts_table_each`).
Here each statistic is a reduction of one tensor where its shards live (XLA combines the partial
results, scalars), stacked: the same columns, equal values.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mpwatch.record import underflow


def sharded() -> bool:
    """Whether the probe traces under a ``keras.distribution`` (then the statistics here)."""
    import keras

    return keras.distribution.distribution() is not None


def _f32(t: Any) -> Any:
    import jax.numpy as jnp

    return jnp.asarray(t).astype(jnp.float32)


def _count(mask: Any) -> Any:
    import jax.numpy as jnp

    return jnp.sum(mask, dtype=jnp.int32)


def _max_abs_finite(x: Any) -> Any:
    import jax.numpy as jnp

    a = jnp.abs(x)
    return jnp.max(jnp.where(jnp.isfinite(a), a, 0.0), initial=0.0)


def _stack(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, Any]:
    import jax.numpy as jnp

    if not rows:
        return {k: jnp.zeros((0,), jnp.float32) for k in keys}
    return {k: jnp.stack([r[k] for r in rows]) for k in keys}


def grad_stats(mixed_scaled: list, ref: list, scale: Any, pow2: Any) -> dict:
    """:func:`mpwatch.record.probe_jax.grad_stats`, one variable at a time."""
    import jax.numpy as jnp

    rows = []
    for m, r in zip(mixed_scaled, ref):
        m, r = _f32(m), _f32(r)
        nz = r != 0
        max_ref = jnp.where(_count(~jnp.isfinite(r)) > 0, jnp.inf, _max_abs_finite(r))
        norm = pow2(max_ref)
        diff = (m / scale - r) / norm
        rows.append({
            "ref_nonzero": _count(nz),
            "underflow": _count(nz & (m == 0)),
            "err_n": jnp.sum(diff * diff),
            "ref_n": jnp.sum(jnp.square(r / norm)),
            "norm": norm,
            "nonfinite": _count(~jnp.isfinite(m)),
            "max_ref": max_ref,
        })  # fmt: skip
    out = _stack(rows, ("ref_nonzero", "underflow", "err_n", "ref_n", "norm", "nonfinite",
                        "max_ref"))  # fmt: skip
    out["size"] = np.array([int(np.size(r)) for r in ref], np.int64)
    return out


def act_stats(mixed: list, ref: list | None, pow2: Any) -> dict:
    """:func:`mpwatch.record.probe_jax.act_stats`, one layer output at a time."""
    import jax.numpy as jnp

    rows = []
    for i, m in enumerate(mixed):
        m = _f32(m)
        nonfinite = _count(~jnp.isfinite(m))
        row = {
            "nonfinite": nonfinite,
            "max_mixed": jnp.where(nonfinite > 0, jnp.inf, _max_abs_finite(m)),
        }
        if ref is not None:
            r = _f32(ref[i])
            row["max_ref"] = _max_abs_finite(r)
            row["norm"] = pow2(row["max_ref"])
            d = (m - r) / row["norm"]
            row["err_n"] = jnp.sum(d * d)
            row["ref_n"] = jnp.sum(jnp.square(r / row["norm"]))
        rows.append(row)
    keys = ("nonfinite", "max_mixed") + (
        ("max_ref", "norm", "err_n", "ref_n") if ref is not None else ()
    )
    out = _stack(rows, keys)
    out["size"] = np.array([int(np.size(m)) for m in mixed], np.int64)
    return out


def act_grad_stats(mixed_scaled: list, ref: list) -> dict:
    """:func:`mpwatch.record.probe_jax.act_grad_stats`, one layer output at a time."""
    import jax.numpy as jnp

    rows = []
    for m, r in zip(mixed_scaled, ref):
        m, r = _f32(m), _f32(r)
        nz = r != 0
        rows.append({
            "ref_nonzero": _count(nz),
            "underflow": _count(nz & (m == 0)),
            "max_ref": _max_abs_finite(r),
            "nonfinite": _count(~jnp.isfinite(m)),
        })  # fmt: skip
    keys = ("ref_nonzero", "underflow", "max_ref", "nonfinite")
    return _stack(rows, keys)


def log2_histogram(tensors: list) -> tuple[Any, Any]:
    """:func:`mpwatch.record.probe_jax.log2_histogram`: one histogram per tensor, summed."""
    import jax
    import jax.numpy as jnp

    hist = jnp.zeros((underflow.NUM_BINS + 1,), jnp.int32)
    zeros = jnp.zeros((), jnp.int32)
    for t in tensors:
        a = jnp.abs(_f32(t))
        counted = (a > 0) & jnp.isfinite(a)
        _, e = jnp.frexp(jnp.where(counted, a, 1.0))
        idx = jnp.clip(e - 1 - underflow.HIST_LO, 0, underflow.NUM_BINS - 1)
        idx = jnp.where(counted, idx, underflow.NUM_BINS).ravel()
        hist = hist + jax.ops.segment_sum(
            jnp.ones_like(idx, jnp.int32), idx, num_segments=underflow.NUM_BINS + 1
        )
        zeros = zeros + _count(a == 0)
    return hist[: underflow.NUM_BINS], zeros
