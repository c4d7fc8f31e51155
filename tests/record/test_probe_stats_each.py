"""The JAX probe's statistics one tensor at a time (mpwatch/record/probe_stats_each.py, used under
a keras.distribution) equal the concatenated segment version's and numpy's counts, on tensors of
known magnitude (float16 underflow chosen here)."""

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
    from mpwatch.record import probe_jax
    from mpwatch.record import probe_stats_each as each

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
    from mpwatch.record import probe_jax
    from mpwatch.record import probe_stats_each as each

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
