"""The probe's math against numpy ground truth: underflow counts on gradients built with known
magnitudes, dead ReLUs, the histogram, the sweep and the recommended scale."""

from __future__ import annotations

import math

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from mpwatch.record.probe import underflow  # noqa: E402
from mpwatch.record.probe.probe import Probe  # noqa: E402


def f16_zero(v):
    """Elements that become 0 when rounded to float16 (numpy's own float16)."""
    return np.asarray(v, np.float32).astype(np.float16) == 0


# --- pure math ------------------------------------------------------------------------------------
def test_log2_bins_exact_at_powers_of_two():
    vals = np.array([2.0**-30, 2.0**-30 * 1.999, 2.0**-29, 1.0, 0.75, 0.0, -(2.0**5), np.inf])
    counts = underflow.log2_bins(tf.constant(vals, tf.float32)).numpy()
    e = np.arange(underflow.HIST_LO, underflow.HIST_HI)
    got = {int(k): int(c) for k, c in zip(e, counts) if c}
    assert got == {-30: 2, -29: 1, 0: 1, -1: 1, 5: 1}  # zero and inf are not binned


def test_sweep_matches_numpy_thresholds_and_never_rises():
    rng = np.random.default_rng(0)
    g = (2.0 ** rng.uniform(-45, 5, size=5000)).astype(np.float32)
    counts = underflow.log2_bins(tf.constant(g)).numpy()
    rows = underflow.sweep(counts)
    for _k, scale, under, over in rows:
        assert under == pytest.approx(np.mean(g * scale < 2.0**-24), abs=0)
        assert over == pytest.approx(np.mean(g * scale >= 2.0**16), abs=0)
    unders = [r[2] for r in rows]
    overs = [r[3] for r in rows]
    assert all(a >= b for a, b in zip(unders, unders[1:]))
    assert all(a <= b for a, b in zip(overs, overs[1:]))


def test_sweep_is_within_one_doubling_of_float16_rounding():
    """The sweep's thresholds (2^-24, 2^16) against what numpy's float16 does to g * 2^k: values
    up to 2^-25 round to 0, values from 65520 to inf. So the predicted underflow at k is at least
    the zero share at k and at most the one at k - 1; the predicted overflow at k at most the inf
    share at k and at least the one at k - 1."""
    rng = np.random.default_rng(2)
    g = (2.0 ** rng.uniform(-50, 10, size=20000)).astype(np.float32)
    counts = underflow.log2_bins(tf.constant(g)).numpy()
    rows = {int(r[0]): (r[2], r[3]) for r in underflow.sweep(counts)}
    g64 = g.astype(np.float64)
    for k in range(-7, 40):
        scaled = (g64 * 2.0**k).astype(np.float16)
        zero, inf = float(np.mean(scaled == 0)), float(np.mean(np.isinf(scaled)))
        assert rows[k + 1][0] <= zero <= rows[k][0], k
        assert rows[k][1] <= inf <= rows[k + 1][1], k


def test_recommend_scale_keeps_margin():
    s = underflow.recommend_scale(2.0**-3, margin_bits=4)
    # 2**-3 * S <= 65504 / 16  ->  S <= 32752  ->  largest power of two 2**14
    assert s == 2.0**14
    assert 2.0**-3 * s * 2**4 <= 65504 < 2.0**-3 * (2 * s) * 2**4
    assert underflow.recommend_scale(math.inf) is None
    assert underflow.recommend_scale(2.0**70) is None


def test_grad_pair_stats_counts_only_reference_nonzeros():
    ref = np.array([0.0, 1e-9, 2.0**-3, 0.0, 5.0], np.float32)
    mixed = np.array([0.0, 0.0, 2.0**-3 * 8, 0.0, 40.0], np.float32)  # scale 8
    (row,) = underflow.grad_table([tf.constant(mixed)], [tf.constant(ref)], 8.0).numpy()
    assert row[underflow.G_SIZE] == 5
    assert row[underflow.G_REF_NONZERO] == 3
    assert row[underflow.G_UNDERFLOW] == 1
    rel = underflow.rel_error(row[underflow.G_ERR_SQ], row[underflow.G_REF_SQ])
    assert rel == pytest.approx(1e-9 / np.linalg.norm(ref.astype(np.float64)), rel=1e-5)


@pytest.mark.parametrize("chunk", [None, 4, 1])
def test_tables_of_many_tensors_equal_numpy_tensor_by_tensor(chunk, monkeypatch):
    """The segment-reduced tables against numpy, one tensor at a time: shapes that differ, a
    missing gradient on either side or both, an empty tensor, a non-finite mixed value. With the
    pieces' size (``tf_chunks.CHUNK``) at 4 and 1 element(s), every tensor over it is reduced a
    slice at a time in a loop and the small ones in groups: the same tables."""
    if chunk is not None:
        from mpwatch.record.tap import tf_chunks

        monkeypatch.setattr(tf_chunks, "CHUNK", chunk)
    rng = np.random.default_rng(5)
    scale = 2.0**10
    refs = [rng.normal(size=(3, 4)) * 1e-11, None, rng.normal(size=(7,)), np.zeros((0,)), None]
    refs = [None if r is None else r.astype(np.float32) for r in refs]
    mixed = [
        (refs[0] * scale).astype(np.float16).astype(np.float32),
        rng.normal(size=(2, 2)).astype(np.float32),
        np.where(np.arange(7) == 3, np.inf, refs[2] * scale).astype(np.float32),
        np.zeros((0,), np.float32),
        None,
    ]
    tf_or_none = lambda v: None if v is None else tf.constant(v)  # noqa: E731
    table = underflow.grad_table(
        [tf_or_none(m) for m in mixed], [tf_or_none(r) for r in refs], scale
    ).numpy()
    assert table.shape == (5, 7)
    for row, m, r in zip(table, mixed, refs):
        if m is None and r is None:
            assert (row == 0).all()
            continue
        r64 = np.zeros_like(m, np.float64) if r is None else r.astype(np.float64)
        m64 = np.zeros_like(r64) if m is None else m.astype(np.float64)
        nz = r64 != 0
        with np.errstate(invalid="ignore"):
            want = [
                r64.size,
                nz.sum(),
                (nz & (m64 == 0)).sum(),
                np.square(m64 / scale - r64).sum(),
                np.square(r64).sum(),
                (~np.isfinite(m64)).sum(),
                np.abs(r64).max(initial=0.0),
            ]
        np.testing.assert_allclose(row, want, rtol=1e-12)
    assert table[0, underflow.G_UNDERFLOW] > 0  # float16 lost some of the 1e-11 * 2**10 values

    acts_m = [rng.normal(size=(2, 3)).astype(np.float16), np.array([1.0, np.inf], np.float16)]
    acts_r = [a.astype(np.float32) * 1.001 for a in acts_m]
    for refs_or_none in (acts_r, None):
        got = underflow.activation_table(
            [tf.constant(a) for a in acts_m],
            None if refs_or_none is None else [tf.constant(a) for a in refs_or_none],
        ).numpy()
        for row, m, r in zip(got, acts_m, refs_or_none or [None, None]):
            m64 = m.astype(np.float64)
            fin = np.isfinite(m64)
            assert row[underflow.A_SIZE] == m.size
            assert row[underflow.A_NONFINITE] == (~fin).sum()
            assert row[underflow.A_MAX_MIXED] == (np.inf if (~fin).any() else np.abs(m64).max())
            if r is None:
                assert row[underflow.A_ERR_SQ] == row[underflow.A_REF_SQ] == 0
            else:
                r64 = r.astype(np.float64)
                with np.errstate(invalid="ignore"):
                    want = np.square(m64 - r64).sum()  # nan where both are inf
                np.testing.assert_allclose(row[underflow.A_ERR_SQ], want, rtol=1e-12)
                rfin = np.abs(r64)[np.isfinite(r64)]
                assert row[underflow.A_MAX_REF] == pytest.approx(rfin.max())

    ag = underflow.act_grad_table(
        [tf.constant([0.0, 2.0, 3.0]), None, None],
        [tf.constant([1e-9, 0.0, 3.0]), None, tf.constant([4.0, 0.0])],
    ).numpy()
    np.testing.assert_array_equal(ag, [[2, 1, 3, 0], [0, 0, 0, 0], [1, 1, 4, 0]])

    hist, zeros = underflow.histogram_and_zeros([tf.constant(r) for r in refs if r is not None])
    flat = np.concatenate([r.ravel() for r in refs if r is not None]).astype(np.float64)
    assert int(zeros) == (flat == 0).sum()
    exps = np.floor(np.log2(np.abs(flat[flat != 0]))).astype(int) - underflow.HIST_LO
    np.testing.assert_array_equal(hist.numpy(), np.bincount(exps, minlength=underflow.NUM_BINS))

def test_element_weighted_summary():
    rows = np.zeros((2, 7))
    rows[0, [underflow.G_REF_NONZERO, underflow.G_UNDERFLOW]] = [10, 9]
    rows[1, [underflow.G_REF_NONZERO, underflow.G_UNDERFLOW]] = [990, 0]
    s = underflow.summarize_grads(rows)
    assert s["underflow_fraction"] == 9 / 1000  # not the mean of 0.9 and 0.0


# --- ground truth through the probe ---------------------------------------------------------------
def _known_model(kernel):
    layer = keras.layers.Dense(
        kernel.shape[1], use_bias=False, activation="relu", name="known", dtype="mixed_float16"
    )
    model = keras.Sequential([keras.Input((kernel.shape[0],)), layer])
    layer.kernel.assign(kernel)
    return model


# x, c, S chosen so that every product x_i * c_j * S is a power of two (or zero): float16 either
# holds it exactly or flushes it to zero, and numpy's float16 says which.
X = np.array([[2.0**-4, 0.0, 2.0**-12, 1.0, 2.0**-8]], np.float32)
C = np.array([[2.0**-40, 2.0**-12, 2.0**-22, 2.0**-30]], np.float32)
KERNEL = np.ones((5, 4), np.float32)
KERNEL[:, 2] = -1.0  # unit 2 is a dead ReLU: its column of dL/dW is 0 in the reference too


def sum_loss(y_true, y_pred):
    return tf.reduce_sum(tf.cast(y_pred, tf.float32) * C)


def truth(scale):
    mask = (X @ KERNEL > 0).astype(np.float32)
    g_ref = X.T @ (C * mask)  # dL/dW in float32
    nonzero = g_ref != 0
    lost = nonzero & f16_zero(g_ref * scale)
    act_ref = np.broadcast_to(C, (1, 4))  # dL/d(output)
    act_lost = (act_ref != 0) & f16_zero(act_ref * scale)
    return g_ref, int(nonzero.sum()), int(lost.sum()), act_lost.sum() / (act_ref != 0).sum()


@pytest.mark.parametrize("log2_scale", [0, 6, 10, 15, 20])
def test_recorded_underflow_equals_numpy_truth(mixed16, log2_scale):
    scale = 2.0**log2_scale
    model = _known_model(KERNEL)
    probe = Probe(model, loss_fn=sum_loss)
    payload = probe.run((X, np.zeros((1, 4), np.float32)), scale=scale)
    g_ref, nonzero, lost, act_frac = truth(scale)
    m = payload["model"]
    # 3 live units x 4 nonzero inputs: the dead unit and the zero input are never counted
    assert m["ref_nonzero"] == nonzero == 12
    assert m["underflow_count"] == lost
    assert m["underflow_fraction"] == lost / nonzero
    (var_row,) = payload["variables"]["data"]
    cols = payload["variables"]["columns"]
    assert var_row[cols.index("underflow_count")] == lost
    (layer_row,) = payload["layers"]["data"]
    lcols = payload["layers"]["columns"]
    assert layer_row[lcols.index("act_grad_underflow_fraction")] == pytest.approx(act_frac)
    # the histogram holds exactly the nonzero reference elements, in their log2 bins
    h = payload["histogram"]
    assert sum(h["counts"]) == nonzero
    assert h["zeros"] == g_ref.size - nonzero
    want = np.log2(np.abs(g_ref[g_ref != 0]))
    got = np.repeat(h["edges_log2"][:-1], h["counts"])
    assert sorted(got) == sorted(want.astype(int))
    assert h["window_log2"] == [-24 - log2_scale, math.log2(65504) - log2_scale]


def test_dead_relu_units_are_never_underflow(mixed16):
    # everything dead: the reference gradient is all zeros, so nothing can count as underflow
    model = _known_model(-np.ones((5, 4), np.float32))
    payload = Probe(model, loss_fn=sum_loss).run((X, np.zeros((1, 4), np.float32)), scale=1.0)
    assert payload["model"]["ref_nonzero"] == 0
    assert payload["model"]["underflow_count"] == 0
    assert payload["model"]["underflow_fraction"] == 0.0


def test_measured_underflow_never_rises_with_scale(mixed16):
    rng = np.random.default_rng(1)
    x = (2.0 ** rng.integers(-20, 0, size=(1, 16))).astype(np.float32)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(8, use_bias=False)])
    c = (2.0 ** rng.integers(-30, -5, size=(1, 8))).astype(np.float32)

    def loss(y_true, y_pred):
        return tf.reduce_sum(tf.cast(y_pred, tf.float32) * c)

    probe = Probe(model, loss_fn=loss)
    fracs = [
        probe.run((x, np.zeros((1, 8), np.float32)), scale=2.0**k)["model"]["underflow_fraction"]
        for k in range(0, 22, 2)
    ]
    assert fracs[0] > 0 and fracs[-1] < fracs[0]
    assert all(a >= b for a, b in zip(fracs, fracs[1:])), fracs


def test_tables_in_a_traced_function_slice_as_eagerly(monkeypatch):
    """Inside ``tf.function`` (as the probe runs them) the sliced loop and the groups give the
    tables numpy gives: a tensor of 10 elements in pieces of 3, beside two small ones."""
    from mpwatch.record.tap import tf_chunks

    monkeypatch.setattr(tf_chunks, "CHUNK", 3)
    rng = np.random.default_rng(2)
    refs = [rng.normal(size=(10,)).astype(np.float32) * 1e-10, np.float32([1.0, 0.0])]
    refs.append(np.float32([3.0]))
    scale = 2.0**8
    mixed = [(r * scale).astype(np.float16).astype(np.float32) for r in refs]

    @tf.function(autograph=False)
    def tables():
        g = underflow.grad_table([tf.constant(m) for m in mixed], [tf.constant(r) for r in refs],
                                 scale)  # fmt: skip
        h, z = underflow.histogram_and_zeros([tf.constant(r) for r in refs])
        return g, h, z

    g, h, z = (t.numpy() for t in tables())
    for row, m, r in zip(g, mixed, refs):
        r64, m64 = r.astype(np.float64), m.astype(np.float64)
        assert row[underflow.G_SIZE] == r.size
        assert row[underflow.G_UNDERFLOW] == ((r64 != 0) & (m64 == 0)).sum()
        np.testing.assert_allclose(row[underflow.G_ERR_SQ], np.square(m64 / scale - r64).sum(),
                                   rtol=1e-12)  # fmt: skip
        assert row[underflow.G_MAX_REF] == np.abs(r64).max()
    assert g[0, underflow.G_UNDERFLOW] > 0
    flat = np.concatenate(refs).astype(np.float64)
    assert z == 1
    exps = np.floor(np.log2(np.abs(flat[flat != 0]))).astype(int) - underflow.HIST_LO
    np.testing.assert_array_equal(h, np.bincount(exps, minlength=underflow.NUM_BINS))
