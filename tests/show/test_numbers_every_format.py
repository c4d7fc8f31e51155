"""Issue 25: every number a person reads, in every format, in one voice (:mod:`mpwatch.words`).

A logdir written with ``RunWriter``: ``mixed`` grows its loss scale to 2^24 (16777216), then it
collapses to 2^-9 (0.00195) and stays; its steps take 0.35 ms; a float16 probe measures an
underflow of 0.012% and a profile holds kernels of 0.4 us and 123,456 us; ``fp32``, the same model
under float32, takes 12,345 ms a step. Each format (text, Markdown, JSON's texts, HTML) is
rendered from it, and each number's form is checked against the values written, computed here:
a scale as ``2^k (v)`` and one spelling per scale, durations with a unit and never in exponent
notation, fractions as percents.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest
from builders import LAYER_COLUMNS, layer_rows, probe_payload, profile_payload, run_info

import mpwatch
from mpwatch import contract
from mpwatch.record.runtime.writer import RunWriter
from mpwatch.show import report

TINY, HUGE = 2.0**-9, 2.0**24
MIXED_MS, FP32_MS = 0.35, 12345.0
UNDERFLOW = 0.00012
KERNEL_US = (0.4, 123456.0)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    root = tmp_path_factory.mktemp("numbers")
    w = RunWriter(str(root / "mixed"))
    w.record(contract.KIND_RUN_INFO, 0, run_info("mixed_float16", batch_size=32))
    w.record(contract.KIND_LAYERS, 1, {"layers": contract.table(LAYER_COLUMNS, layer_rows())})
    steps = list(range(1, 201))
    # 2^15 up to 2^24 (a doubling every 10 steps), then 33 skips down to 2^-9
    scales = {}
    for s in steps:
        if s <= 90:
            scales[s] = 2.0 ** (15 + s // 10)
        else:
            scales[s] = max(TINY, HUGE / 2.0 ** (s - 90))
    w.scalar_series(contract.LOSS_SCALE, steps, [scales[s] for s in steps])
    w.scalar_series(
        contract.STEP_SKIPPED, steps, [1.0 if 90 < s <= 123 else 0.0 for s in steps]
    )
    for s in range(10, 201, 10):
        w.scalars(s, {contract.TRAIN_LOSS: 2.0 / s, contract.STEP_TIME_MS: MIXED_MS,
                      contract.PEAK_MEMORY_MB: 500.0})  # fmt: skip
    probe = probe_payload(150, TINY)
    probe["model"].update(underflow_fraction=UNDERFLOW, underflow_count=1, ref_nonzero=8333)
    w.record(contract.KIND_PROBE, 150, probe)
    prof = profile_payload()
    prof["layers"] = contract.table(
        ["layer", "time_us", "time_16bit_us", "time_32bit_us", "ops", "share"],
        [["conv2d", KERNEL_US[1], 1000.0, KERNEL_US[1] - 1000.0, 12, 0.99],
         ["dense", KERNEL_US[0], 0.2, 0.2, 4, 3e-6]],
    )  # fmt: skip
    prof["total_us"] = sum(KERNEL_US)
    w.record(contract.KIND_PROFILE, 160, prof)
    w.close()
    w = RunWriter(str(root / "fp32"))
    w.record(contract.KIND_RUN_INFO, 0, run_info("float32", batch_size=32))
    w.record(
        contract.KIND_LAYERS, 1, {"layers": contract.table(LAYER_COLUMNS, layer_rows("float32"))}
    )
    for s in range(10, 201, 10):
        w.scalars(s, {contract.TRAIN_LOSS: 2.0 / s, contract.STEP_TIME_MS: FP32_MS,
                      contract.PEAK_MEMORY_MB: 800.0})  # fmt: skip
    w.close()
    runs = mpwatch.load_runs(str(root), warn=False)
    findings = mpwatch.diagnose(runs)
    out = {fmt: report.render(runs, findings, fmt, logdir=str(root))
           for fmt in ("text", "markdown", "html", "json")}  # fmt: skip
    doc = json.loads(out["json"])
    out["json"] = "\n".join(
        str(f.get(k) or "") for f in doc["findings"] for k in ("title", "evidence", "fix")
    )
    out["html"] = _HtmlText.of(out["html"])
    return out


class _HtmlText(HTMLParser):
    """The text a browser shows (no tags, no style or script)."""

    def __init__(self):
        super().__init__()
        self.parts, self._skip = [], 0

    def handle_starttag(self, tag, attrs):
        self._skip += tag in ("style", "script")
        if tag in ("td", "th", "p", "li", "tr", "br", "div", "h2", "h3"):
            self.parts.append("\n")

    def handle_endtag(self, tag):
        self._skip -= tag in ("style", "script")

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)

    @classmethod
    def of(cls, html):
        p = cls()
        p.feed(html)
        return "".join(p.parts)


FORMATS = ["text", "markdown", "html", "json"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_scale_as_a_power_of_two_one_spelling_each(rendered, fmt):
    text = rendered[fmt]
    written: dict[int, set[str]] = {}
    for m in re.finditer(r"2\^(-?\d+) \(([0-9.,]+)\)", text):
        k, value = int(m.group(1)), float(m.group(2).replace(",", ""))
        assert value == pytest.approx(2.0**k, rel=5e-3), m.group(0)
        written.setdefault(k, set()).add(m.group(0))
    assert all(len(v) == 1 for v in written.values()), written
    if fmt != "json":  # the summary facts; JSON's texts are the findings'
        assert "2^-9 (0.00195)" in text
    # the tiny and huge scales never bare (exact, rounded or in exponent notation)
    for wrong in ("0.001953125", "0.00195312", "1.95e-03", "16777216.0", "1.68e+07", "1.6777e+07"):
        assert wrong not in text, wrong


@pytest.mark.parametrize("fmt", FORMATS)
def test_durations_have_a_unit_and_no_exponent(rendered, fmt):
    text = rendered[fmt]
    assert not re.search(r"\d[eE][+-]?\d+\s*(?:ms|us|s)\b", text)
    if fmt in ("text", "markdown", "html"):
        assert "350 us" in text  # 0.35 ms a step, in microseconds
        assert "12.3 s" in text  # 12,345 ms a step, in seconds
    assert "0.35 ms" not in text and "12345 ms" not in text and "12,345 ms" not in text


@pytest.mark.parametrize("fmt", ["text", "markdown", "html"])
def test_fractions_as_percents(rendered, fmt):
    text = rendered[fmt]
    assert "0.012%" in text  # the probe's underflow, 0.00012: two significant digits
    assert "1.2e-04" not in text and "0.00012" not in text


@pytest.mark.parametrize("fmt", FORMATS)
def test_ratios_plainly(rendered, fmt):
    """The mixed run's step time over the float32 run's: 0.35 / 12,345, and its inverse."""
    text = rendered[fmt]
    assert f"x{MIXED_MS / FP32_MS:.2e}" in text  # 2.84e-05, not 'x0.00'
    assert f"speed-up {FP32_MS / MIXED_MS:.0f}x" in text  # 35271, not '35271.43'
    assert "x0.00," not in text
