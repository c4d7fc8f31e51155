"""Memory by dtype, against the variables' own sizes and an eager count of the layers' outputs.

tests/beyond/beyond_fit.py records, without mpwatch's code, every variable of the model, the
trainable ones and the optimizer's (path, dtype, elements), and the outputs of every leaf layer of
one eager training-mode call on one batch (elements by dtype). Bytes per element come from numpy
(``ml_dtypes`` for bfloat16).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from html.parser import HTMLParser

import ml_dtypes
import numpy as np
import pytest

import mpwatch

CASES = ["bfloat16", "sgd", "mixed"]


def _itemsize(dtype: str) -> int:
    return np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype).itemsize


def _by_dtype(items) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for _, dtype, n in items:
        out[dtype] += n
    return dict(out)


@pytest.mark.parametrize("case", CASES)
def test_memory_by_dtype_is_the_variables_and_outputs_own(beyond_runs, case):
    out, truth = beyond_runs
    t = truth[case]
    run = mpwatch.load_run(str(out / case))
    assert run.memory["policy"] == t["policy"] and run.memory["batch_size"] == t["batch_size"]
    got: dict[str, dict[str, int]] = defaultdict(dict)
    for r in run.memory_by_dtype.to_dict("records"):
        got[r["kind"]][r["dtype"]] = r["elements"]
        assert r["bytes"] == r["elements"] * _itemsize(r["dtype"])
    assert got["weights"] == _by_dtype(t["variables"])
    assert got["gradients"] == _by_dtype(t["trainable"])
    assert got["optimizer_state"] == _by_dtype(t["optimizer"])
    assert got["activations"] == t["activations"]


@pytest.mark.parametrize("case", CASES)
def test_other_policies_store_the_same_elements_in_their_dtypes(beyond_runs, case):
    out, truth = beyond_runs
    t = truth[case]
    run = mpwatch.load_run(str(out / case))
    rows = {r["policy"]: r for r in run.memory_by_policy.to_dict("records")}
    own = run.memory_by_policy.iloc[0]
    assert own["policy"] == t["policy"]
    assert own["total"] == sum(run.memory_by_dtype["bytes"])
    assert {"float32", "mixed_float16", "mixed_bfloat16"} <= set(rows)

    def under(var_bytes: int, act_bytes: int) -> dict[str, int]:
        """What the policy needs, counted here: every float variable (and its gradient and
        optimizer slot) in var_bytes, every float output in act_bytes; the rest as they are."""

        def size(items, each):
            return sum(n * (each if d in ("float32", "bfloat16", "float16") and n > 1 else
                            _itemsize(d)) for _, d, n in items)  # fmt: skip

        return {
            "weights": size(t["variables"], var_bytes),
            "gradients": size(t["trainable"], var_bytes),
            "optimizer_state": size(t["optimizer"], var_bytes),
            "activations": sum(n * act_bytes for n in t["activations"].values()),
        }

    for policy, (vb, ab) in {"float32": (4, 4), "mixed_float16": (4, 2),
                             "mixed_bfloat16": (4, 2)}.items():  # fmt: skip
        want = under(vb, ab)
        for kind, n in want.items():
            assert rows[policy][kind] == n, (policy, kind)
        assert rows[policy]["total"] == sum(want.values())


def test_the_reports_show_the_memory_table(beyond_runs):
    out, truth = beyond_runs
    path = str(out / "bfloat16")
    proc = subprocess.run(
        [sys.executable, "-m", "mpwatch", "diagnose", path, "--format", "json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    (doc,) = json.loads(proc.stdout)["runs"]
    memory = doc["memory"]
    assert [r["policy"] for r in memory["by_policy"]][0] == "bfloat16"
    text = subprocess.run(
        [sys.executable, "-m", "mpwatch", "diagnose", path], capture_output=True, text=True,
        check=True,
    ).stdout  # fmt: skip
    assert f"memory: {memory['lines'][0]}" in text

    class Tables(HTMLParser):
        def __init__(self):
            super().__init__()
            self.tables, self._in = defaultdict(list), None

        def handle_starttag(self, tag, attrs):
            cls = dict(attrs).get("class", "")
            if tag == "table" and cls.startswith("memory"):
                self._in = cls
            elif tag == "tr" and self._in:
                self.tables[self._in].append([])

        def handle_endtag(self, tag):
            if tag == "table":
                self._in = None

        def handle_data(self, data):
            if self._in and self.tables[self._in]:
                self.tables[self._in][-1].append(data)

    from mpwatch.show.report import render

    html = render(mpwatch.load_run(path), mpwatch.diagnose(path), fmt="html")
    parsed = Tables()
    parsed.feed(html)
    elements = _by_dtype(truth["bfloat16"]["variables"])["bfloat16"]
    weights = [r for r in parsed.tables["memory-by-dtype"] if r[:2] == ["weights", "bfloat16"]]
    assert weights and weights[0][2] == f"{elements:,}"
    assert [r[0] for r in parsed.tables["memory-by-policy"][1:]] == [
        "bfloat16", "float32", "mixed_float16", "mixed_bfloat16"
    ]  # fmt: skip
