"""Facts of the floating-point formats that mixed precision uses.

Everything here is plain Python (no TensorFlow import) so the advisor and the reader can use it.

>>> FLOAT16.smallest_subnormal == 2.0 ** -24
True
>>> FLOAT16.max
65504.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class FloatFormat:
    """The range of one floating-point format.

    Example:
        >>> from mpwatch.formats import format_of
        >>> format_of("float16").smallest_normal
        6.103515625e-05
    """

    name: str
    bits: int
    mantissa_bits: int
    smallest_subnormal: float
    smallest_normal: float
    max: float

    @property
    def window_log2(self) -> tuple[float, float]:
        """log2 of the smallest subnormal and of the largest finite value."""
        return math.log2(self.smallest_subnormal), math.log2(self.max)

    @property
    def is_16bit(self) -> bool:
        return self.bits == 16


FLOAT16 = FloatFormat("float16", 16, 10, 2.0**-24, 2.0**-14, 65504.0)
BFLOAT16 = FloatFormat("bfloat16", 16, 7, 2.0**-133, 2.0**-126, 3.3895313892515355e38)
FLOAT32 = FloatFormat("float32", 32, 23, 2.0**-149, 2.0**-126, 3.4028234663852886e38)

FORMATS = {f.name: f for f in (FLOAT16, BFLOAT16, FLOAT32)}

#: the dtype names of 16-bit floating-point compute ("half" is float16 in some tools' tables)
SIXTEEN_BIT = frozenset({"float16", "bfloat16", "half"})

# Layers whose policy says float16/bfloat16 but that normalise in float32 inside (Keras 3 upcasts:
# ops.layer_normalization / BatchNormalization.call compute in result_type(x, float32), verified by
# tracing: Mean, SquaredDifference, Rsqrt run in float32), casting the result back.
FLOAT32_INSIDE = frozenset(
    {"BatchNormalization", "LayerNormalization", "GroupNormalization", "RMSNormalization"}
)


def is_16bit(dtype: object) -> bool:
    """Whether a dtype (name, or anything whose ``.name``/``str()`` is one) is a 16-bit float.

    >>> is_16bit("bfloat16"), is_16bit("float32"), is_16bit(None)
    (True, False, False)
    """
    name = getattr(dtype, "name", None) or str(dtype)
    return name.replace("mixed_", "") in SIXTEEN_BIT


# float8 as Keras trains Dense/EinsumDense layers in it (quantize("float8")): E4M3 forward, E5M2
# backward, and the bounds within which mpwatch calls a layer ready for it (record/probe/float8.py
# measures, judge/rules/float8_readiness.py says)
E4M3_MAX = 448.0
E5M2_MAX = 57344.0
FLOAT8_READY_OUT = 0.08  # float8 keeps the layer's output within this relative error ...
FLOAT8_READY_GRAD = 0.15  # ... and both gradients within this one (E5M2: 2 mantissa bits)
FLOAT8_LOW_ERROR_SHOWN = 0.02  # a 16-bit error above this is named beside float8's

# Keras' LossScaleOptimizer starts at 2**15 and grows x2 every 2000 finite steps.
KERAS_INITIAL_SCALE = 2.0**15
#: a regression target reaching this |y| is a raw one: the probe tries it standardised
#: (record/probe/fix_check.py), the target-range rule reads that check
RAW_TARGET = 16.0
#: a layer whose 16-bit output is this far off float32 is run op by op to find the op that
#: overflows inside it (record/probe/op_overflow.py); the output-rel-error rule reads what it found
SCANNED_ERROR = 0.5
KERAS_GROWTH_INTERVAL = 2000


def format_of(dtype: object) -> FloatFormat:
    """The FloatFormat of a dtype name (or anything whose str()/.name is one).

    Raises ValueError for a dtype that is not float16, bfloat16 or float32.
    """
    name = getattr(dtype, "name", None) or str(dtype)
    name = name.replace("mixed_", "")
    if name not in FORMATS:
        raise ValueError(f"mpwatch knows float16, bfloat16 and float32, not {dtype!r}")
    return FORMATS[name]


def headroom_bits(max_abs: float, fmt: FloatFormat = FLOAT16) -> float:
    """log2(fmt.max / max_abs): doublings left before overflow (inf when max_abs is 0)."""
    if max_abs <= 0:
        return math.inf
    if not math.isfinite(max_abs):
        return -math.inf
    return math.log2(fmt.max / max_abs)
