"""The in-graph gradient counts (record/tap/stats.py), TensorFlow's and JAX's, against numpy.

Tensors of known magnitude (zeros, float16 subnormals, inf, nan, empty tensors, None, mixed
dtypes) go through ``counts_table`` (TensorFlow, in a ``tf.function`` and under XLA) and
``jax_counts_table`` (under ``jax.jit``); numpy counts the same elements in float64.
"""

from __future__ import annotations

import numpy as np
import pytest

from mpwatch.record.tap import stats


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


@pytest.mark.parametrize("chunk,items", [(None, None), (5, None), (16, 2)])
def test_tensorflow_counts_equal_numpy(chunk, items, monkeypatch):
    """Also with the pieces (record/tap/tf_chunks.py) at 5 elements (the larger tensors cut in
    slices, a slice's rest packed with the next tensors) and at 16 elements of at most 2 items each;
    in a graph and under XLA."""
    tf = pytest.importorskip("tensorflow")
    from mpwatch.record.tap import tf_chunks

    if chunk is not None:
        monkeypatch.setattr(tf_chunks, "CHUNK", chunk)
    if items is not None:
        monkeypatch.setattr(tf_chunks, "MAX_ITEMS", items)
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
    # tensors of unknown size in the graph (a function traced for any batch): each an item of
    # its own, beside the ones of static size
    spec = [tf.TensorSpec([None, *t.shape[1:]] if t.ndim > 1 and i % 2 else t.shape, t.dtype)
            for i, t in enumerate(dense)]  # fmt: skip
    fn = tf.function(lambda *x: stats.counts_table(list(x)), input_signature=spec)
    np.testing.assert_allclose(fn(*dense).numpy(), want_dense, rtol=1e-6)


def _graph_operations(tf, fn, args) -> int:
    graph = fn.get_concrete_function(*args).graph.as_graph_def()
    return len(graph.node) + sum(len(f.node_def) for f in graph.library.function)


def test_tensorflow_counts_graph_grows_by_a_few_operations_per_tensor(monkeypatch):
    """A graph's operations cost memory for the whole fit, whether the counts run or not: the
    counts of 4x as many tensors (a third of them cut in slices) add at most 10 operations per
    tensor, and one function counts every piece (not a copy of its reductions per tensor,
    slice or loop)."""
    tf = pytest.importorskip("tensorflow")
    from mpwatch.record.tap import tf_chunks

    monkeypatch.setattr(tf_chunks, "CHUNK", 1024)

    def operations(n: int) -> tuple[int, int]:
        args = [tf.zeros([2000 if i % 3 == 0 else 7], tf.float32) for i in range(n)]
        fn = tf.function(lambda *x: stats.counts_table(list(x)), autograph=False)
        graph = fn.get_concrete_function(*args).graph.as_graph_def()
        pieces = [f for f in graph.library.function if "one" in f.signature.name]
        return _graph_operations(tf, fn, args), len(pieces)

    (small, bodies_small), (large, bodies_large) = operations(30), operations(120)
    assert large - small <= 10 * 90, (small, large)  # (82 a tensor with a loop per slice)
    assert bodies_small == bodies_large == 1


def test_jax_counts_equal_numpy():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    ts = _tensors()
    want = np.array([_numpy_counts(t) for t in ts])
    fn = jax.jit(lambda xs, z: stats.jax_counts_table(xs, z))
    got = np.asarray(fn([None if t is None else jnp.asarray(t) for t in ts], jnp.int32(0)))
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("direct_min", [None, 0, 5, 64])
def test_jax_counts_reduced_one_by_one_or_in_blocks_equal_numpy(direct_min):
    """Large tensors are reduced on their own (one variadic reduction each), small ones as rows
    of the block matrix: at every split of the same tensors (none, all, some) the table is
    numpy's, in the tensors' order."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    ts = _tensors()
    want = np.array([_numpy_counts(t) for t in ts])
    fn = jax.jit(lambda xs: stats.jax_counts_table(xs, direct_min=direct_min))
    got = np.asarray(fn([None if t is None else jnp.asarray(t) for t in ts]))
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_jax_counts_of_a_tensor_above_the_direct_size_equal_numpy():
    """A tensor of more than ``DIRECT_MIN`` elements (float16 and float32, with zeros,
    subnormals, inf and nan at known places) between two small ones: its counts are numpy's."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    rng = np.random.default_rng(3)
    n = stats.DIRECT_MIN + 1000
    big32 = (rng.normal(size=(n,)) * 1e-3).astype("float32")
    big32[:7], big32[7:11], big32[11], big32[12] = 0.0, 2.0**-20, np.inf, np.nan
    big16 = (rng.normal(size=(n // 100, 100)) * 1e-4).astype("float16")
    ts = [np.ones(3, "float32"), big32, big16, np.zeros(2, "float16")]
    want = np.array([_numpy_counts(t) for t in ts])
    assert want[1, 1] >= 4 and want[2, 1] > 0  # subnormals in float16 terms in both
    got = np.asarray(jax.jit(stats.jax_counts_table)([jnp.asarray(t) for t in ts]))
    np.testing.assert_allclose(got, want, rtol=1e-6)
