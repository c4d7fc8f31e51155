"""The in-graph gradient counts (record/stats.py), TensorFlow's and JAX's, against numpy.

Tensors of known magnitude (zeros, float16 subnormals, inf, nan, empty tensors, None, mixed
dtypes) go through ``counts_table`` (TensorFlow, in a ``tf.function`` and under XLA) and
``jax_counts_table`` (under ``jax.jit``); numpy counts the same elements in float64.
"""

from __future__ import annotations

import numpy as np
import pytest

from mpwatch.record import stats


def _tensors():
    rng = np.random.default_rng(0)
    out = []
    for shape, dtype in [((3, 4), "float32"), ((0,), "float32"), ((5,), "float16"),
                         ((7, 2), "float32"), ((1,), "float16"), ((0, 3), "float16"),
                         ((64,), "float32")]:  # fmt: skip
        x = rng.normal(size=shape) * 10.0 ** rng.integers(-9, 3, size=shape)
        out.append(x.astype(dtype))
    out[0][0, 0], out[0][1, 1], out[0][2, 2] = np.inf, np.nan, 0.0
    out[6][:10] = 2.0**-20  # float16 subnormals, exactly
    out.insert(2, None)
    return out


def _numpy_counts(t):
    if t is None:
        return np.zeros(stats.NUM_COUNTS)
    a = np.abs(np.asarray(t, np.float64)).ravel()
    fin = np.isfinite(a)
    sub = ((a > 0) & (a < 2.0**-14)).sum()
    return np.array([(a == 0).sum(), sub, (~fin).sum(), a[fin].max() if fin.any() else 0, a.size])


def test_tensorflow_counts_equal_numpy():
    tf = pytest.importorskip("tensorflow")
    ts = _tensors()
    want = np.array([_numpy_counts(t) for t in ts])
    eager = stats.counts_table([None if t is None else tf.constant(t) for t in ts]).numpy()
    np.testing.assert_allclose(eager, want, rtol=1e-6)
    dense = [t for t in ts if t is not None]
    want_dense = np.array([_numpy_counts(t) for t in dense])
    for jit in (False, True):
        fn = tf.function(lambda *x: stats.counts_table(list(x)), jit_compile=jit)
        np.testing.assert_allclose(fn(*dense).numpy(), want_dense, rtol=1e-6)
    assert stats.counts_table([]).shape == (0, stats.NUM_COUNTS)


def test_jax_counts_equal_numpy():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    ts = _tensors()
    want = np.array([_numpy_counts(t) for t in ts])
    fn = jax.jit(lambda xs, z: stats.jax_counts_table(xs, z))
    got = np.asarray(fn([None if t is None else jnp.asarray(t) for t in ts], jnp.int32(0)))
    np.testing.assert_allclose(got, want, rtol=1e-6)
