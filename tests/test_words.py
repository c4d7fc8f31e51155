"""``mpwatch.words``: the one formatter of loss scales, durations, percentages and plain numbers,
on known values (the expected strings written by hand) and on properties checked by parsing the
text back."""

from __future__ import annotations

import math
import re

import pytest

from mpwatch import words
from mpwatch.judge import rule
from mpwatch.judge.evidence import scale_evidence


@pytest.mark.parametrize(
    ("scale", "text"),
    [
        (32768.0, "2^15 (32768)"),
        (65536.0, "2^16 (65536)"),
        (16.0, "2^4 (16)"),
        (8.0, "8"),
        (1.0, "1"),
        (0.5, "0.5"),
        (0.125, "0.125"),
        (2.0**-4, "2^-4 (0.0625)"),
        (2.0**-8, "2^-8 (0.00391)"),
        (2.0**-9, "2^-9 (0.00195)"),
        (2.0**-24, "2^-24 (0.0000000596)"),
        (1000.0, "1000"),
        (3e-5, "0.00003"),
        (0.0, "0"),
        (None, "n/a"),
        (math.nan, "n/a"),
        (math.inf, "inf"),
    ],
)
def test_loss_scale(scale, text):
    assert words.loss_scale(scale) == text


def test_every_power_of_two_scale_reads_back_as_itself():
    """``2^k (v)``: k is the exponent, v is 2^k (exact above 1, three significant digits below),
    never exponent notation."""
    for k in range(-30, 41):
        text = words.loss_scale(2.0**k)
        if abs(k) <= 3:
            assert float(text) == 2.0**k
            continue
        m = re.fullmatch(r"2\^(-?\d+) \(([0-9.]+)\)", text)
        assert m, text
        assert int(m.group(1)) == k
        value = float(m.group(2))
        assert value == 2.0**k if k > 0 else value == pytest.approx(2.0**k, rel=5e-3), text


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (1400.0, "1.4 s"),
        (1234567.0, "1,235 s"),
        (999.4, "999 ms"),
        (999.6, "1 s"),  # rounds to 1,000 ms: the next unit
        (46.71, "46.7 ms"),
        (10.0, "10 ms"),
        (1.0, "1 ms"),
        (0.9999, "1 ms"),
        (0.4612, "461 us"),
        (0.0091, "9.1 us"),
        (0.0, "0 ms"),
        (None, "n/a"),
    ],
)
def test_duration_ms(ms, text):
    assert words.duration_ms(ms) == text


@pytest.mark.parametrize(
    ("us", "text"), [(2000.0, "2 ms"), (800.0, "800 us"), (15969.0, "16 ms"), (1.4e6, "1.4 s")]
)
def test_duration_us(us, text):
    assert words.duration_us(us) == text


def test_durations_never_use_exponent_notation_and_read_back():
    unit = {"us": 1e-3, "ms": 1.0, "s": 1e3}
    for e in range(-6, 9):
        for m in (1.0, 1.4, 3.333, 9.996):
            ms = m * 10.0**e
            text = words.duration_ms(ms)
            assert "e" not in text.split(" ")[0], text
            number, u = text.split(" ")
            assert float(number.replace(",", "")) * unit[u] == pytest.approx(ms, rel=6e-3), text


@pytest.mark.parametrize(
    ("x", "text"),
    [
        (0.05, "5.00%"),
        (0.0596, "5.96%"),
        (0.123, "12.3%"),
        (1.0, "100.0%"),
        (0.0, "0%"),
        (1e-4, "0.01%"),
        (1.2e-5, "0.0012%"),
        (-0.05, "-5.00%"),
        (None, "n/a"),
    ],
)
def test_percent(x, text):
    assert words.percent(x) == text


@pytest.mark.parametrize(
    ("x", "text"),
    [
        (65504.0, "65504"),
        (20000.0, "20000"),
        (0.10234, "0.102"),
        (12345.6, "12346"),  # not 1.23e+04
        (1e-6, "1.00e-06"),
        (1e30, "1.00e+30"),
        (None, "n/a"),
        (math.nan, "n/a"),
    ],
)
def test_number(x, text):
    assert words.number(x) == text


def test_the_judges_old_names_are_the_formatter():
    assert rule.fmt is words.number and rule.pct is words.percent
    assert scale_evidence.scale_text is words.loss_scale


@pytest.mark.parametrize(
    ("text", "clean"),
    [
        ("\x1b[1mboom\x1b[0m", "boom"),  # Keras' bold around an exception message
        ("a\x1b[2Jb\x1b[10;5Hc", "abc"),  # clear screen, cursor move
        ("a\x1b]0;title\x07b", "ab"),  # window title (OSC)
        ("a\x1b(Bb\x1b", "ab"),  # charset switch, a lone ESC
        ("tab\there\nnext\r\x00\x9b", "tab\there\nnext"),
        ("layer 'dense' • x=1", "layer 'dense' • x=1"),
    ],
)
def test_plain(text, clean):
    assert words.plain(text) == clean
