"""Float8 readiness of a large layer, a block of the kernel's output units at a time.

:func:`mpwatch.record.probe.float8.layer_errors` computes, for one layer, the output, ``dx`` and
``dW`` in float32, in the run's 16-bit dtype and in float8, each whole: for a Dense kernel of 4096 x
4096 (64 MiB in float32) that was the kernel three times over, three weight gradients and their
float64 copies for the norms, about 500 MiB at once beside the fit (a wide MLP's fit peak with a
probe every 3 steps went from 1.05x to 1.38x a plain fit's for it, on TensorFlow). Here the same
numbers come from blocks of the kernel's last axis (a Dense layer's units): each block's kernel
slice quantized with the whole kernel's scale, its output columns, its ``dW`` block and its share
of ``dx`` (summed over blocks in float32, as the einsum's own float32 accumulation, rounded to the
16-bit dtype once at the end); the norms are accumulated in float64 per row (output) and over the
tensor (``dW``). Only a block's arrays and the activation-sized ones exist at a time.

It applies where the kernel's last axis is the output's last axis and nowhere in the input (a
Dense layer, an EinsumDense such as ``abc,cd->abd``) and the bias, if any, is along that axis;
:func:`layer_errors` returns None for the others, which are computed whole.

Example:
    >>> import numpy as np
    >>> from mpwatch.record.probe import float8
    >>> rng = np.random.default_rng(0)
    >>> x, w = rng.standard_normal((8, 32)), 0.1 * rng.standard_normal((32, 16))
    >>> g = 1e-3 * rng.standard_normal((8, 16))
    >>> got = layer_errors("...i,ij->...j", x, w, None, g, "bfloat16", block=64)
    >>> want = float8.layer_errors("...i,ij->...j", x, w, None, g, "bfloat16")
    >>> abs(got["dw_error_8"] - want["dw_error_8"]) < 1e-6
    True
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

#: kernel elements of one block (a 1 MiB float32 slice; its float64 temporaries 2 MiB each)
BLOCK = 1 << 18


def _amax_scale(amax: float, fmax: float) -> np.float32:
    """:func:`mpwatch.record.probe.float8.jit_scale` from the tensor's largest ``|t|``."""
    amax = np.float32(amax)
    if not amax > 0 or not math.isfinite(float(amax)):
        return np.float32(1.0)
    return np.float32(np.float32(1.0) / np.float32(np.float32(fmax) / amax))


def _sq(a: np.ndarray, axis: Any = None) -> Any:
    """Sum of squares in float64 (of the last axis where ``axis=-1``); inf and nan are the
    values measured, not a warning to print into the user's fit."""
    a64 = np.asarray(a, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        return np.einsum("...i,...i->...", a64, a64) if axis == -1 else float(np.vdot(a64, a64))


def _norm_ratio(d2: float, r2: float, any_a: bool) -> float:
    """``_rel`` of float8.py from sums of squares."""
    if r2 == 0.0:
        return 0.0 if not any_a else math.inf
    return float(math.sqrt(d2) / math.sqrt(r2))


def _row_ratio(d2: np.ndarray, r2: np.ndarray) -> float:
    """``row_error`` of float8.py from per-row sums of squares."""
    keep = r2 > 0
    if not keep.any():
        return 0.0
    return float(np.mean(np.sqrt(d2[keep]) / np.sqrt(r2[keep])))


def errors(
    equation: str, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, g: np.ndarray, cd: str,
    loss_scale: float = 1.0,
) -> dict[str, float]:  # fmt: skip
    """:func:`mpwatch.record.probe.float8.layer_errors` of one layer: a kernel of more than
    :data:`BLOCK` elements a block at a time where it can be (:func:`layer_errors`), else whole."""
    from mpwatch.record.probe import float8

    if np.size(w) > BLOCK:
        got = layer_errors(equation, x, w, bias, g, cd, loss_scale)
        if got is not None:
            return got
    return float8.layer_errors(equation, x, w, bias, g, cd, loss_scale)


def layer_errors(
    equation: str, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, g: np.ndarray, cd: str,
    loss_scale: float = 1.0, block: int = BLOCK,
) -> dict[str, float] | None:  # fmt: skip
    """:func:`mpwatch.record.probe.float8.layer_errors` of one layer, a block of ``block`` kernel
    elements at a time (see the module doc); None where the equation or bias does not allow
    it."""
    from mpwatch.record.probe import float8

    xs, ws, zs = float8._expand(equation, (np.ndim(x), np.ndim(w)))
    unit = ws[-1]
    n = int(np.shape(w)[-1])
    if zs[-1] != unit or unit in xs or (bias is not None and np.shape(bias) != (n,)):
        return None
    fwd, dx_eq, dw_eq = f"{xs},{ws}->{zs}", f"{zs},{ws}->{xs}", f"{xs},{zs}->{ws}"
    c = float8._np_dtype(cd)
    w = np.asarray(w)
    x32 = np.asarray(x, np.float32)
    g32 = np.asarray(g, np.float32) * np.float32(loss_scale)
    x_cd, g_cd = x32.astype(c), g32.astype(c)
    xq = float8.qdq(x_cd, float8.jit_scale(x_cd, float8.E4M3_MAX), "e4m3", cd)
    gq = float8.qdq(g_cd, float8.jit_scale(g_cd, float8.E5M2_MAX), "e5m2", cd)
    step = max(1, block // max(1, int(np.size(w)) // max(n, 1)))
    spans = [(j, min(j + step, n)) for j in range(0, n, step)]
    # the kernel's scale is its whole amax in the compute dtype (rounding keeps the order)
    amax = 0.0
    for j0, j1 in spans:
        part = np.abs(w[..., j0:j1].astype(c).astype(np.float32))
        amax = max(amax, float(part.max()) if part.size else 0.0)
    w_scale = _amax_scale(amax, float8.E4M3_MAX)

    rows = int(np.prod(np.shape(g32)[:-1]))
    out = {k: np.zeros(rows) for k in ("r", "l", "e8", "e16", "c8")}
    dx = {k: np.zeros(np.shape(x32), np.float32) for k in ("r", "l", "q")}
    dw = dict.fromkeys(("r", "l", "e8", "e16", "c8"), 0.0)
    any_l = any_q = False
    w_nz = w_flushed = 0
    for j0, j1 in spans:
        wb32 = np.asarray(w[..., j0:j1], np.float32)
        wb_cd = wb32.astype(c)
        wbq = float8.qdq(wb_cd, w_scale, "e4m3", cd)
        nz = wb_cd != 0
        w_nz += int(nz.sum())
        w_flushed += int((nz & (wbq.astype(np.float32) == 0)).sum())
        bb = None if bias is None else np.asarray(bias, np.float32)[j0:j1]
        gb = (g32[..., j0:j1], g_cd[..., j0:j1], gq[..., j0:j1])

        def z_of(a: np.ndarray, b: np.ndarray, dtype: str, bb: Any = bb) -> np.ndarray:
            z = float8._einsum(fwd, a, b, dtype)
            t = float8._np_dtype(dtype)
            return z if bb is None else (z + bb.astype(t)).astype(t)

        zr = z_of(x32, wb32, "float32").reshape(rows, -1)
        zl = z_of(x_cd, wb_cd, cd).reshape(rows, -1)
        zq = z_of(xq, wbq, cd).reshape(rows, -1)
        out["r"] += _sq(zr, -1)
        out["l"] += _sq(zl, -1)
        with np.errstate(invalid="ignore", over="ignore"):
            out["e8"] += _sq(zq.astype(np.float64) - zr, -1)
            out["e16"] += _sq(zl.astype(np.float64) - zr, -1)
            out["c8"] += _sq(zq.astype(np.float64) - zl, -1)
        del zr, zl, zq
        for key, gk, wk in (("r", gb[0], wb32), ("l", gb[1], wb_cd), ("q", gb[2], wbq)):
            dx[key] += np.einsum(dx_eq, np.asarray(gk, np.float32), np.asarray(wk, np.float32),
                                 optimize=True)  # fmt: skip
        dwr = float8._einsum(dw_eq, x32, gb[0], "float32")
        dwl = float8._einsum(dw_eq, x_cd, gb[1], cd)
        dwq = float8._einsum(dw_eq, xq, gb[2], cd)
        dw["r"] += _sq(dwr)
        dw["l"] += _sq(dwl)
        with np.errstate(invalid="ignore", over="ignore"):
            dw["e8"] += _sq(dwq.astype(np.float64) - dwr)
            dw["e16"] += _sq(dwl.astype(np.float64) - dwr)
            dw["c8"] += _sq(dwq.astype(np.float64) - dwl)
        any_l = any_l or bool(np.any(dwl))
        any_q = any_q or bool(np.any(dwq))
        del dwr, dwl, dwq, wb32, wb_cd, wbq

    dx_l, dx_q = dx["l"].astype(c), dx["q"].astype(c)
    got = {
        "out_error_8": _row_ratio(out["e8"], out["r"]),
        "out_error_16": _row_ratio(out["e16"], out["r"]),
        "out_change_8": _row_ratio(out["c8"], out["l"]),
        "dx_error_8": float8.row_error(dx_q, dx["r"]),
        "dx_error_16": float8.row_error(dx_l, dx["r"]),
        "dx_change_8": float8.row_error(dx_q, dx_l),
        "dw_error_8": _norm_ratio(dw["e8"], dw["r"], any_q),
        "dw_error_16": _norm_ratio(dw["e16"], dw["r"], any_l),
        "dw_change_8": _norm_ratio(dw["c8"], dw["l"], any_q),
    }
    got["x_flush"] = float8._flushed(x_cd, xq)
    got["w_flush"] = float(w_flushed / w_nz) if w_nz else 0.0
    got["g_flush"] = float8._flushed(g_cd, gq)
    got["x_amax"] = float(np.max(np.abs(x32))) if x32.size else 0.0
    got["g_amax"] = float(np.max(np.abs(g32))) if g32.size else 0.0
    return got
