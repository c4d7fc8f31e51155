"""How mpwatch writes a value for a person: one formatter for every report, the CLI, the findings'
evidence and the tab's server-side text.

- :func:`loss_scale`: a power of two as ``2^15 (32768)`` or ``2^-8 (0.00391)`` (small ones, 2^-3
  to 2^3, as the number), anything else as the number; the same spelling everywhere.
- :func:`duration_ms` / :func:`duration_us`: ``461 us``, ``46.7 ms``, ``1.4 s``: the unit by the
  size, three significant digits, never exponent notation.
- :func:`percent`: a fraction as ``5.96%``, ``12.3%``, ``0%``, ``0.0012%`` (no exponent).
- :func:`number`: a plain number: an integer as itself, ``0.102``, ``1.00e-06`` for the very small
  or very large.
- :func:`amount`: a measured amount in a unit said elsewhere (a table column ``time_us``):
  ``2,723``, ``46.71``, ``0.4612``: four significant digits, never exponent notation.
- :func:`plain`: text without terminal escape sequences or control characters (Keras wraps
  exception messages in ``\\x1b[1m``; layer and run names are user input).

Code (a fix's ``initial_scale=...``) keeps Python's exact spelling: these are words, not code.

>>> loss_scale(32768.0), loss_scale(2.0**-8), loss_scale(8.0), loss_scale(1000.0)
('2^15 (32768)', '2^-8 (0.00391)', '8', '1000')
>>> duration_ms(1400.0), duration_ms(46.71), duration_ms(0.4612), duration_us(2000.0)
('1.4 s', '46.7 ms', '461 us', '2 ms')
>>> percent(0.0596), percent(0.123), percent(0.0), percent(1.2e-5)
('5.96%', '12.3%', '0%', '0.0012%')
>>> number(65504.0), number(0.10234), number(1e-6), number(None)
('65504', '0.102', '1.00e-06', 'n/a')
>>> plain("\\x1b[1mboom\\x1b[0m\\n  at line 3")
'boom\\n  at line 3'
"""

from __future__ import annotations

import math
import re

__all__ = [
    "NO_FINDINGS",
    "NO_FINDINGS_TRACE_ONLY",
    "TRACE_ONLY",
    "amount",
    "duration_ms",
    "duration_us",
    "loss_scale",
    "number",
    "percent",
    "plain",
    "raw_trace",
]

NOT_AVAILABLE = "n/a"

#: what the reports and the tab say of a run without findings
NO_FINDINGS = "no findings: mixed precision looks healthy"
#: ... and of a run that is only a profiler trace: nothing else was recorded, so nothing judged
NO_FINDINGS_TRACE_ONLY = (
    "no findings in the profile (a profiler trace alone: no loss scale, gradients or layer "
    "dtypes were recorded, so none were judged)"
)

#: what a run is that holds only a profiler trace
TRACE_ONLY = "a profiler trace only (no mpwatch record: the policy and layers are unknown)"


def raw_trace(trace_dir: str) -> str:
    """Where a profile read from a raw trace (no profile record) came from.

    >>> raw_trace("logs/plugins/profile/2025_01_01")[:52]
    'read from the raw trace logs/plugins/profile/2025_01_01'
    """
    return (
        f"read from the raw trace {trace_dir} (no profile record: converted without the model, "
        "so layers only where the op names say them)"
    )


#: an ANSI/VT escape sequence: CSI (``ESC [ ... final``), OSC (``ESC ] ... BEL`` or ``ESC \\``),
#: any other escape (``ESC``, intermediate bytes, a final byte), or a lone ``ESC``
_ESCAPE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[ -/]*[0-~]|\x1b"
)
#: control characters other than newline and tab (C0, DEL, C1)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _missing(x: float | None) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def _positional(x: float, digits: int, thousands: bool = False) -> str:
    """``x`` with ``digits`` significant digits (all digits of its integer part), never exponent
    notation, trailing zeros of the fraction dropped."""
    if x == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    text = f"{x:,.{decimals}f}" if thousands else f"{x:.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def number(x: float | None, digits: int = 3) -> str:
    """A plain number: ``n/a`` for None or NaN; an integer value below 1e9 as itself; other values
    from 1e-3 to 1e5 with ``digits`` significant digits; the rest in exponent notation with
    ``digits`` significant digits (``1.00e-06``)."""
    if _missing(x):
        return NOT_AVAILABLE
    x = float(x)  # type: ignore[arg-type]
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x.is_integer() and abs(x) < 1e9:
        return str(int(x))
    if x != 0 and (abs(x) >= 1e5 or abs(x) < 1e-3):
        return f"{x:.{digits - 1}e}"
    return _positional(x, digits)


def amount(x: float | None, digits: int = 4) -> str:
    """A measured amount whose unit is said elsewhere (a table's column): ``digits`` significant
    digits, every digit of its integer part with thousands separators, never exponent notation;
    ``n/a`` for None or NaN.

    >>> amount(2723.4), amount(123456.0), amount(0.46123)
    ('2,723', '123,456', '0.4612')
    """
    if _missing(x):
        return NOT_AVAILABLE
    x = float(x)  # type: ignore[arg-type]
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return _positional(x, digits, True)


def percent(x: float | None) -> str:
    """A fraction as a percentage: ``0%`` for exactly 0, one decimal from 10%, two decimals from
    0.1%, two significant digits below (``0.012%``; never exponent notation); ``n/a`` for None or
    NaN."""
    if _missing(x):
        return NOT_AVAILABLE
    p = 100.0 * float(x)  # type: ignore[arg-type]
    if math.isinf(p):
        return "inf%" if p > 0 else "-inf%"
    if p == 0:
        return "0%"
    if abs(p) >= 10:
        return f"{p:.1f}%"
    if abs(p) >= 0.1:
        return f"{p:.2f}%"
    return f"{_positional(p, 2)}%"


def loss_scale(scale: float | None) -> str:
    """A loss scale: ``2^k (value)`` for a power of two with ``|k| > 3`` (the value exact when
    ``k > 0``, three significant digits when ``k < 0``), the number itself otherwise (2^-3 to 2^3,
    or not a power of two: up to four significant digits, never exponent notation)."""
    if _missing(scale):
        return NOT_AVAILABLE
    s = float(scale)  # type: ignore[arg-type]
    if math.isinf(s):
        return "inf" if s > 0 else "-inf"
    if s > 0:
        k = math.log2(s)
        if k.is_integer() and abs(k) > 3:
            value = str(int(s)) if k > 0 else _positional(s, 3)
            return f"2^{int(k)} ({value})"
    if s.is_integer():
        return str(int(s))
    return _positional(s, 4)


def duration_ms(ms: float | None) -> str:
    """A duration given in milliseconds: below 1 ms in ``us``, below 1 s in ``ms``, else in ``s``;
    three significant digits (every digit of a large integer part, with thousands separators),
    never exponent notation; ``n/a`` for None or NaN."""
    if _missing(ms):
        return NOT_AVAILABLE
    t = float(ms)  # type: ignore[arg-type]
    if math.isinf(t):
        return "inf s" if t > 0 else "-inf s"
    if t == 0:
        return "0 ms"
    for unit, size in (("us", 1e-3), ("ms", 1.0)):
        text = _positional(t / size, 3, True)
        if abs(float(text.replace(",", ""))) < 1000:  # rounded up to 1,000: the next unit
            return f"{text} {unit}"
    return f"{_positional(t / 1000, 3, True)} s"


def duration_us(us: float | None) -> str:
    """A duration given in microseconds (a profile's unit), written as :func:`duration_ms`."""
    return duration_ms(None if _missing(us) else float(us) / 1000)  # type: ignore[arg-type]


def plain(text: object) -> str:
    """``text`` without terminal escape sequences (colours, cursor moves, window titles) or
    control characters other than newline and tab."""
    return _CONTROL.sub("", _ESCAPE.sub("", str(text)))
