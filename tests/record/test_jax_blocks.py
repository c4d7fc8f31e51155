"""BlockLayout (mpwatch/record/tap/jax_blocks.py): per-tensor counts, sums and maxima over tensors
laid out as padded rows equal numpy's, tensor by tensor, for sizes around the row length, empty
tensors, and nonfinite values; the padding is never counted."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")


def _tensors():
    from mpwatch.record.tap.jax_blocks import BLOCK

    rng = np.random.default_rng(3)
    sizes = [0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 7, 5, 0, 2]
    out = []
    for n in sizes:
        t = (rng.normal(size=n) * 10.0 ** rng.integers(-6, 4, size=n)).astype(np.float32)
        t[rng.random(n) < 0.2] = 0.0
        out.append(t)
    out[4][3] = np.inf
    out[5][-1] = np.nan
    return out


def test_counts_sums_and_maxima_per_tensor_equal_numpy():
    from mpwatch.record.tap.jax_blocks import BLOCK, BlockLayout

    tensors = _tensors()

    @jax.jit
    def stats(ts, zero):
        rows = BlockLayout([t.size for t in tensors], zero)
        m = rows.matrix(ts)
        a = jnp.abs(m)
        finite = jnp.where(jnp.isfinite(a), a, 0.0)
        return {
            "nonzero": rows.count(m != 0),
            "nonfinite": rows.count(~jnp.isfinite(m)),
            "sum": rows.sum(jnp.square(finite)),
            "max": rows.max(finite),
            "spread": rows.spread(rows.max(finite)),
            "zeros": jnp.sum(m == 0) - rows.padding,
        }

    got = jax.device_get(stats([jnp.asarray(t) for t in tensors], jnp.int32(0)))
    fin = [np.where(np.isfinite(t), np.abs(t), 0.0).astype(np.float64) for t in tensors]
    np.testing.assert_array_equal(got["nonzero"], [np.count_nonzero(t) for t in tensors])
    np.testing.assert_array_equal(got["nonfinite"], [np.sum(~np.isfinite(t)) for t in tensors])
    np.testing.assert_allclose(got["sum"], [np.sum(f**2) for f in fin], rtol=1e-5)
    np.testing.assert_array_equal(got["max"], [f.max(initial=0.0) for f in fin])
    assert int(got["zeros"]) == sum(int(np.sum(t == 0)) for t in tensors)
    # each row carries its own tensor's value
    rows_of = np.repeat(np.arange(len(tensors)), [-(-t.size // BLOCK) for t in tensors])
    expected = np.array([fin[i].max(initial=0.0) for i in rows_of], np.float32)
    np.testing.assert_array_equal(got["spread"][:, 0], expected)


def test_a_tensor_of_another_size_is_refused():
    from mpwatch.record.tap.jax_blocks import BlockLayout

    rows = BlockLayout([4, 3])
    with pytest.raises(ValueError, match="5 elements where 3 were laid out"):
        rows.matrix([jnp.ones(4), jnp.ones(5)])


def test_no_tensors():
    from mpwatch.record.tap.jax_blocks import BLOCK, BlockLayout

    rows = BlockLayout([])
    m = rows.matrix([])
    assert m.shape == (0, BLOCK) and rows.count(m != 0).shape == (0,)
    assert rows.max(m).shape == (0,) and rows.padding == 0
