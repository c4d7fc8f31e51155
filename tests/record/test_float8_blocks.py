"""Float8 readiness of a large layer a block of its units at a time
(mpwatch/record/probe/float8_blocks.py) gives the numbers the whole-tensor arithmetic gives (itself
checked against Keras' own float8 layers in tests/beyond/test_float8.py), in a block's memory
(numpy's allocations traced)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from mpwatch.record.probe import float8, float8_blocks


@pytest.mark.parametrize(
    "equation,x_shape,w_shape,bias",
    [("...i,ij->...j", (4, 300), (300, 257), True), ("abc,cd->abd", (2, 3, 64), (64, 40), False)],
)
@pytest.mark.parametrize("cd,scale", [("float16", 2.0**10), ("bfloat16", 1.0)])
def test_blocks_equal_the_whole_tensor(equation, x_shape, w_shape, bias, cd, scale):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(x_shape).astype("float32")
    x[0, ..., :3] *= 1e3  # outliers that coarsen the input's float8 scale
    w = (0.05 * rng.standard_normal(w_shape)).astype("float32")
    b = rng.standard_normal(w_shape[-1]).astype("float32") if bias else None
    g = (1e-4 * rng.standard_normal(x_shape[:-1] + (w_shape[-1],))).astype("float32")
    want = float8.layer_errors(equation, x, w, b, g, cd, scale)
    got = float8_blocks.layer_errors(equation, x, w, b, g, cd, scale, block=1000)
    assert got is not None and sorted(got) == sorted(want)
    for key in want:
        # dx sums the blocks' float32 partial products in another order before its one rounding
        # to the 16-bit dtype: that rounding may differ by an ulp in a few elements
        rtol = 1e-3 if key.startswith("dx_") else 1e-6
        assert got[key] == pytest.approx(want[key], rel=rtol, abs=1e-12), key
    assert want["out_error_8"] > want["out_error_16"] > 0  # the errors measured are real ones


def test_an_equation_without_its_units_last_is_computed_whole():
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((2, 8)), rng.standard_normal((8, 5))
    g = rng.standard_normal((5, 2))
    assert float8_blocks.layer_errors("bi,ij->jb", x, w, None, g, "float16", block=4) is None
    got = float8.layer_errors("bi,ij->jb", x, w, None, g, "float16")
    assert np.isfinite(got["out_error_8"])


def test_a_large_layer_needs_a_blocks_memory():
    """A 2048 x 2048 Dense kernel (16 MiB in float32): the whole arithmetic holds several
    kernels' worth at once; the blocks, less than the kernel's own size."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 2048)).astype("float32")
    w = (0.01 * rng.standard_normal((2048, 2048))).astype("float32")
    g = (1e-3 * rng.standard_normal((4, 2048))).astype("float32")
    peaks = {}
    for blocked in (False, True):
        tracemalloc.start()
        try:
            layer_errors = float8_blocks.errors if blocked else float8.layer_errors
            layer_errors("...i,ij->...j", x, w, None, g, "float16", 1024.0)
            peaks[blocked] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peaks[False] > 4 * w.nbytes
    assert peaks[True] < w.nbytes
