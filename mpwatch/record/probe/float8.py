"""Float8 readiness: the error each Dense/EinsumDense layer would have if Keras trained it in
float8 (``layer.quantize("float8")``), measured on the probe's batch, beside its 16-bit error.

Keras' float8 training (``keras/src/layers/core/dense.py``, ``einsum_dense.py``, verified against
Keras 3's own quantized layers on both backends: ``tests/beyond/test_float8.py``):

- forward: the inputs and the kernel, in the layer's compute dtype ``cd``, are quantized and
  dequantized to **E4M3** (``float8_e4m3fn``, max 448) with a per-tensor scale ``s``:
  ``QDQ(t) = cast(cast(clip(t / s, -max, max), f8), cd) * s`` (``s`` itself cast to ``cd``);
  the matmul (or einsum) runs on those in ``cd``; the bias is added after, unquantized;
- backward: the gradient of the loss w.r.t. the matmul's output ``g`` (the activation's derivative
  applied) is quantized and dequantized to **E5M2** (``float8_e5m2``, max 57344); ``dx = gq @
  wq^T`` and ``dW = xq^T @ gq``;
- scales (delayed scaling): ``s = amax / max`` from the largest ``|t|`` in an amax history of the
  last 1024 steps. Readiness uses the scale of this batch's own amax (what the history gives for
  data like this batch; outliers in other batches make it coarser).

Per layer, against the layer in float32 on the same (float32 reference) inputs, kernel and
output gradient: the relative errors of the output ``z`` (before the activation) and of ``dx``,
per row (:func:`row_error`: the mean over tokens or examples of each one's ``||a - ref|| /
||ref||``, so a few outlier rows cannot hide the rest), and of ``dW`` (``||a - ref|| / ||ref||``
over the tensor), in float8 and in the run's 16-bit compute dtype; and the share of nonzero
elements of x, W and g that float8 flushes to zero at that scale (few bits of range: values far
below the tensor's largest). Under a loss scale (mixed_float16) the gradient is taken scaled, as
Keras' float8 layers see it (``S * g``). Readiness (:func:`verdict`) judges what float8 changes of
the run's own 16-bit values (``*_change_8``, the same errors with the 16-bit result as the
reference): rows the 16-bit run already loses (a scaled gradient row of a well-fit example below
float16's range: 100% error in both) are not float8's doing.

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> x, w = rng.standard_normal((8, 32)), 0.1 * rng.standard_normal((32, 16))
    >>> row = layer_errors("...i,ij->...j", x, w, None, 1e-3 * rng.standard_normal((8, 16)),
    ...                    "bfloat16")
    >>> 0.01 < row["out_error_8"] < 0.08 and row["out_error_16"] < 0.01
    True
"""

from __future__ import annotations

import math
import string
from typing import Any

import numpy as np

from mpwatch.formats import E4M3_MAX, E5M2_MAX
from mpwatch.formats import FLOAT8_LOW_ERROR_SHOWN as LOW_ERROR_SHOWN
from mpwatch.formats import FLOAT8_READY_GRAD as READY_GRAD
from mpwatch.formats import FLOAT8_READY_OUT as READY_OUT

#: a tensor whose nonzero elements flush to zero in float8 beyond this share is short of range
FLUSH_WARN = 0.01


def _np_dtype(name: str) -> Any:
    import ml_dtypes

    return {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
            "e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}[name]  # fmt: skip


def jit_scale(t_cd: np.ndarray, fmax: float) -> np.float32:
    """The scale Keras' delayed scaling gives a tensor whose amax history holds only this one's
    largest ``|t|`` (``compute_float8_scale``: ``1 / (max / amax)``, 1.0 for an all-zero one)."""
    amax = np.float32(np.max(np.abs(np.asarray(t_cd, np.float32)))) if np.size(t_cd) else 0.0
    if not amax > 0 or not math.isfinite(float(amax)):
        return np.float32(1.0)
    return np.float32(np.float32(1.0) / np.float32(np.float32(fmax) / np.float32(amax)))


def qdq(t: np.ndarray, scale: np.float32, f8: str, cd: str) -> np.ndarray:
    """Keras' ``quantize_and_dequantize(t, scale, f8, cd)``, in numpy (``ml_dtypes``)."""
    c = _np_dtype(cd)
    fmax = c(E4M3_MAX if f8 == "e4m3" else E5M2_MAX)
    s = np.asarray(scale, np.float32).astype(c)
    # a scale below the compute dtype's smallest value is 0 there, in Keras' op as here: its
    # inf and nan are the result measured, not numpy's warning to print in the user's fit
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        q = (np.asarray(t).astype(c) / s).astype(c)
        q = np.clip(q, -fmax, fmax).astype(c)
        return (q.astype(_np_dtype(f8)).astype(c) * s).astype(c)


def _expand(equation: str, ranks: tuple[int, int]) -> tuple[str, str, str]:
    """An einsum equation with ``...`` spelled out in letters it does not use."""
    lhs, out = equation.replace(" ", "").split("->")
    a, b = lhs.split(",")
    free = [c for c in string.ascii_letters if c not in equation]
    n = max(ranks[0] - len(a.replace("...", "")), ranks[1] - len(b.replace("...", "")), 0)
    dots = "".join(free[:n])
    return a.replace("...", dots), b.replace("...", dots), out.replace("...", dots)


def _einsum(eq: str, a: np.ndarray, b: np.ndarray, cd: str) -> np.ndarray:
    """The contraction with float32 accumulation, rounded once to ``cd``."""
    out = np.einsum(eq, np.asarray(a, np.float32), np.asarray(b, np.float32), optimize=True)
    return out.astype(_np_dtype(cd))


def _rel(a: np.ndarray, ref: np.ndarray) -> float:
    """``||a - ref|| / ||ref||`` over the whole tensor."""
    ref64 = np.asarray(ref, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf is the nan measured, not a
        den = float(np.linalg.norm(ref64))  # warning to print into the user's fit
        if den == 0.0:
            return 0.0 if not np.any(np.asarray(a, np.float64)) else math.inf
        return float(np.linalg.norm(np.asarray(a, np.float64) - ref64) / den)


def row_error(a: np.ndarray, ref: np.ndarray) -> float:
    """The mean over rows (every position but the last axis: a token, an example) of each row's
    ``||a - ref|| / ||ref||`` (rows whose reference is 0 left out): what a typical row loses, so
    one row of outliers cannot hide the others' damage in a tensor-wide norm."""
    last = np.shape(ref)[-1] if np.ndim(ref) else 1
    r = np.asarray(ref, np.float64).reshape(-1, last)
    with np.errstate(invalid="ignore", over="ignore"):  # (as in _rel)
        d = np.asarray(a, np.float64).reshape(-1, last) - r
        den = np.linalg.norm(r, axis=1)
        keep = den > 0
        if not keep.any():
            return 0.0
        return float(np.mean(np.linalg.norm(d[keep], axis=1) / den[keep]))


def _flushed(t: np.ndarray, q: np.ndarray) -> float:
    nz = np.asarray(t, np.float32) != 0
    n = int(nz.sum())
    return float((nz & (np.asarray(q, np.float32) == 0)).sum() / n) if n else 0.0


def layer_errors(
    equation: str, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, g: np.ndarray, cd: str,
    loss_scale: float = 1.0,
) -> dict[str, float]:  # fmt: skip
    """The float8 and 16-bit errors of one layer ``z = einsum(equation, x, w) + bias`` with output
    gradient ``g`` (float32 reference values; ``cd`` the run's compute dtype; ``loss_scale``: the
    gradient as Keras' layers see it is ``loss_scale * g``). Keys: ``out_error_8``,
    ``dx_error_8``, ``dw_error_8``, the same ``_16``, ``x_flush``, ``w_flush``, ``g_flush``,
    ``x_amax``, ``g_amax``. Each array whole: the probe computes a large kernel's a block of its
    units at a time (:func:`mpwatch.record.probe.float8_blocks.errors`, the same numbers)."""
    xs, ws, zs = _expand(equation, (np.ndim(x), np.ndim(w)))
    fwd, dx_eq, dw_eq = f"{xs},{ws}->{zs}", f"{zs},{ws}->{xs}", f"{xs},{zs}->{ws}"
    x32, w32 = np.asarray(x, np.float32), np.asarray(w, np.float32)
    g32 = np.asarray(g, np.float32) * np.float32(loss_scale)
    b32 = None if bias is None else np.asarray(bias, np.float32)
    c = _np_dtype(cd)

    def z_of(a: np.ndarray, b: np.ndarray, dtype: str) -> np.ndarray:
        z = _einsum(fwd, a, b, dtype)
        return z if b32 is None else (z + b32.astype(_np_dtype(dtype))).astype(_np_dtype(dtype))

    ref = {"out": z_of(x32, w32, "float32"), "dx": _einsum(dx_eq, g32, w32, "float32"),
           "dw": _einsum(dw_eq, x32, g32, "float32")}  # fmt: skip
    x_cd, w_cd, g_cd = x32.astype(c), w32.astype(c), g32.astype(c)
    low = {"out": z_of(x_cd, w_cd, cd), "dx": _einsum(dx_eq, g_cd, w_cd, cd),
           "dw": _einsum(dw_eq, x_cd, g_cd, cd)}  # fmt: skip
    xq = qdq(x_cd, jit_scale(x_cd, E4M3_MAX), "e4m3", cd)
    wq = qdq(w_cd, jit_scale(w_cd, E4M3_MAX), "e4m3", cd)
    gq = qdq(g_cd, jit_scale(g_cd, E5M2_MAX), "e5m2", cd)
    f8 = {"out": z_of(xq, wq, cd), "dx": _einsum(dx_eq, gq, wq, cd),
          "dw": _einsum(dw_eq, xq, gq, cd)}  # fmt: skip
    err = {"out": row_error, "dx": row_error, "dw": _rel}
    out = {f"{k}_error_8": err[k](f8[k], ref[k]) for k in ref}
    out |= {f"{k}_error_16": err[k](low[k], ref[k]) for k in ref}
    # what float8 changes of the run's own 16-bit values: where those already lose a row to the
    # float32 reference (a scaled gradient row below float16's range), float8 is not the cause
    out |= {f"{k}_change_8": err[k](f8[k], low[k]) for k in ref}
    out |= {"x_flush": _flushed(x_cd, xq), "w_flush": _flushed(w_cd, wq),
            "g_flush": _flushed(g_cd, gq)}  # fmt: skip
    out["x_amax"] = float(np.max(np.abs(x32))) if x32.size else 0.0
    out["g_amax"] = float(np.max(np.abs(g32))) if g32.size else 0.0
    return out


def verdict(row: dict[str, float], low: str = "16-bit") -> tuple[bool, str]:
    """(ready, why): ready when float8 keeps the output within :data:`READY_OUT` and both
    gradients within :data:`READY_GRAD` of what the run computes now in its 16-bit dtype ``low``
    (the ``*_change_8`` errors: where the 16-bit values are close to float32's, as they are on
    most layers, the same as the errors against float32; where they already lose rows, float8
    is judged on what it adds). Otherwise the reason, by what went wrong: values flushed to zero
    (range: a few large values set the scale), else the mantissa; with the 16-bit error beside
    it where that one is not small."""
    def judged(k: str) -> float:  # against float32 where the 16-bit values are not finite
        change, low_error = row[f"{k}_change_8"], row[f"{k}_error_16"]
        return change if math.isfinite(change) and math.isfinite(low_error) else row[f"{k}_error_8"]

    out, grad = judged("out"), max(judged("dx"), judged("dw"))
    if out <= READY_OUT and grad <= READY_GRAD:
        return True, ""

    def beside(err16: float) -> str:
        if not math.isfinite(err16):
            return f" (the {low} run's own values are not finite)"
        return f" (beyond the {low} run's own {err16:.1%})" if err16 > LOW_ERROR_SHOWN else ""

    why = []
    if out > READY_OUT:
        flush = max(row["x_flush"], row["w_flush"])
        o16 = beside(row["out_error_16"])
        if flush > FLUSH_WARN:
            which = "inputs" if row["x_flush"] >= row["w_flush"] else "kernel"
            why.append(
                f"output error {out:.1%}{o16}: {flush:.1%} of its {which} flush to zero in E4M3 "
                f"at the scale its largest value sets (outliers; E4M3 spans 2^17)"
            )
        else:
            why.append(f"output error {out:.1%}{o16}: E4M3's 3 mantissa bits")
    if grad > READY_GRAD:
        g16 = beside(max(row["dx_error_16"], row["dw_error_16"]))
        if row["g_flush"] > FLUSH_WARN:
            why.append(
                f"gradient error {grad:.1%}{g16}: {row['g_flush']:.1%} of its output gradient "
                "flushes to zero in E5M2 at the scale its largest value sets"
            )
        else:
            why.append(f"gradient error {grad:.1%}{g16}: E5M2's 2 mantissa bits")
    return False, "; ".join(why)
