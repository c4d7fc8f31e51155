"""The JAX probe's statistics one tensor at a time (mpwatch/record/probe/probe_stats_each.py, used
under a keras.distribution) equal the concatenated segment version's and numpy's counts, on tensors
of known magnitude (float16 underflow chosen here)."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")


def _tensors():
    rng = np.random.default_rng(0)
    shapes = [(16, 32), (32,), (32, 1), (1,), (3, 3, 4, 8)]
    ref = [(rng.normal(size=s) * 10.0 ** rng.integers(-9, 2, size=s)).astype("float32")
           for s in shapes]  # fmt: skip
    ref[1][:5] = 0.0  # exact zeros
    scale = 1024.0
    # what float16 keeps of ref * scale: values below its subnormal range become 0
    mixed = [np.asarray(r * scale, np.float16).astype(np.float32) for r in ref]
    mixed[2][0, 0] = np.inf
    return ref, mixed, scale


def test_grad_stats_one_tensor_at_a_time_equal_the_segments_and_numpy():
    from mpwatch.record.probe import probe_jax
    from mpwatch.record.probe import probe_stats_each as each

    ref, mixed, scale = _tensors()
    seg = probe_jax.grad_stats([jnp.asarray(m) for m in mixed], [jnp.asarray(r) for r in ref],
                               scale, jnp.int32(0))  # fmt: skip
    one = each.grad_stats([jnp.asarray(m) for m in mixed], [jnp.asarray(r) for r in ref], scale,
                          probe_jax._pow2_at_least)  # fmt: skip
    for key in ("size", "ref_nonzero", "underflow", "nonfinite"):
        np.testing.assert_array_equal(np.asarray(one[key]), np.asarray(seg[key]), err_msg=key)
    for key in ("err_n", "ref_n", "norm", "max_ref"):
        np.testing.assert_allclose(np.asarray(one[key]), np.asarray(seg[key]), rtol=1e-6)
    # numpy, independently
    assert list(np.asarray(one["ref_nonzero"])) == [int((r != 0).sum()) for r in ref]
    assert list(np.asarray(one["underflow"])) == [int(((r != 0) & (m == 0)).sum())
                                                  for r, m in zip(ref, mixed)]  # fmt: skip
    assert list(np.asarray(one["nonfinite"])) == [0, 0, 1, 0, 0]
    assert sum(np.asarray(one["underflow"])) > 0  # the chosen magnitudes do underflow


def test_activation_and_histogram_stats_equal_the_segments():
    from mpwatch.record.probe import probe_jax
    from mpwatch.record.probe import probe_stats_each as each

    ref, mixed, _ = _tensors()
    r = [jnp.asarray(t) for t in ref]
    m = [jnp.asarray(t) for t in mixed]
    for got, want in (
        (each.act_stats(m, r, probe_jax._pow2_at_least), probe_jax.act_stats(m, r, jnp.int32(0))),
        (each.act_stats(m, None, probe_jax._pow2_at_least),
         probe_jax.act_stats(m, None, jnp.int32(0))),
        (each.act_grad_stats(m, r), probe_jax.act_grad_stats(m, r, jnp.int32(0))),
    ):  # fmt: skip
        assert sorted(got) == sorted(want)
        for key in want:
            np.testing.assert_allclose(np.asarray(got[key], np.float64),
                                       np.asarray(want[key], np.float64), rtol=1e-6)  # fmt: skip
    h1, z1 = each.log2_histogram(r)
    h2, z2 = probe_jax.log2_histogram(r)
    np.testing.assert_array_equal(np.asarray(h1), np.asarray(h2))
    assert int(z1) == int(z2) == 5


def test_large_tensors_reduced_one_by_one_and_chunked_equal_numpy():
    """The probe on one device: tensors of at least DIRECT_MIN elements are reduced one at a
    time (no block-matrix copy) and their histogram is counted a chunk at a time, the last
    chunk's window moved back; small tensors stay in the block matrix. Every column and the
    histogram against numpy on tensors of known magnitude, in the tensors' own order."""
    from mpwatch.record.probe import probe_jax, underflow
    from mpwatch.record.probe import probe_stats_each as each
    from mpwatch.record.tap.stats import DIRECT_MIN

    rng = np.random.default_rng(1)
    n_big = 2 * each.HIST_CHUNK + 12_345  # 3 chunks, the last one overlapping the second
    shapes = [(7,), (n_big // 5, 5), (40, 9), (DIRECT_MIN,)]
    ref = [(rng.normal(size=s) * 2.0 ** rng.integers(-40, 8, size=s)).astype("float32")
           for s in shapes]  # fmt: skip
    ref[1].reshape(-1)[:1000] = 0.0  # genuine zeros in the chunked histogram
    scale = 2.0**10
    with np.errstate(over="ignore"):  # the largest values overflow float16, as in training
        mixed = [np.asarray(r * scale, np.float16).astype(np.float32) for r in ref]
    mixed[3][5] = np.nan
    assert probe_jax._large(ref) == [1, 3]

    got = probe_jax.routed(
        [[jnp.asarray(m) for m in mixed], [jnp.asarray(r) for r in ref]],
        lambda m, r: probe_jax.grad_stats(m, r, scale, jnp.int32(0)),
        lambda m, r: each.grad_stats(m, r, scale, probe_jax._pow2_at_least),
    )
    table = probe_jax.host_tables({"grads": got, "acts": {"size": np.zeros(0), "nonfinite": [],
                                                          "max_mixed": []},
                                   "loss": 0, "ref_loss": 0, "own_loss": 0, "train_loss": 0,
                                   "hist": np.zeros(underflow.NUM_BINS), "zeros": 0})["grads"]
    for i, (r, m) in enumerate(zip(ref, mixed)):
        r64, m64 = r.astype(np.float64), m.astype(np.float64)
        assert table[i, underflow.G_SIZE] == r.size
        assert table[i, underflow.G_REF_NONZERO] == np.count_nonzero(r)
        assert table[i, underflow.G_UNDERFLOW] == np.count_nonzero((r != 0) & (m == 0))
        assert table[i, underflow.G_NONFINITE] == np.count_nonzero(~np.isfinite(m))
        assert table[i, underflow.G_MAX_REF] == np.abs(r).max()
        # sums of squares in float32 over the tensor (JAX's float): within 1e-4 of float64's
        np.testing.assert_allclose(table[i, underflow.G_REF_SQ], np.sum(r64**2), rtol=1e-4)
        if np.isfinite(m).all():
            want = np.sum((m64 / scale - r64) ** 2)
            np.testing.assert_allclose(table[i, underflow.G_ERR_SQ], want, rtol=1e-4)
    assert table[1, underflow.G_UNDERFLOW] > 0  # the magnitudes chosen do underflow

    hist, zeros = probe_jax.histogram_routed([jnp.asarray(r) for r in ref], jnp.int32(0))
    a = np.concatenate([np.abs(r.astype(np.float64)).ravel() for r in ref])
    e = np.floor(np.log2(a[a > 0])).astype(int)
    want = np.bincount(np.clip(e - underflow.HIST_LO, 0, underflow.NUM_BINS - 1),
                       minlength=underflow.NUM_BINS)  # fmt: skip
    np.testing.assert_array_equal(np.asarray(hist), want)
    assert int(zeros) == int((a == 0).sum()) >= 1000
