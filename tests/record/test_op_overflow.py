"""mpwatch/record/probe/op_overflow.py on both backends: the first op inside a layer whose float16
output is not finite while its inputs are, named with the source line that made it, against
numpy."""

from __future__ import annotations

import numpy as np
import pytest

with np.errstate(over="ignore"):
    SQUARE_300 = float(np.square(np.float16(300.0)))  # inf in float16: 90000 > 65504
    EXP_20 = float(np.exp(np.float16(20.0)))


@pytest.fixture(scope="module", params=["tensorflow", "jax"])
def cases(request, script_runs):
    return request.param, script_runs("record/op_overflow_cases.py", backend=request.param)[1]


def test_the_overflowing_op_is_named_at_its_line(cases):
    backend, truth = cases
    assert SQUARE_300 == float("inf") and EXP_20 == float("inf")  # the ground truth, numpy
    got = truth["results"]["rms_300"]
    assert got["op"].lower() == "square"
    assert got["source"] == f"op_overflow_cases.py:{truth['lines']['square']}"
    assert got["input_max_abs"] == 300.0 and got["dtype"] == "float16"
    assert got["layer_output_finite"] is True  # rsqrt(inf) = 0: the output hides it
    gate = truth["results"]["gate_20"]
    assert gate["op"].lower() == "exp"
    assert gate["source"] == f"op_overflow_cases.py:{truth['lines']['exp']}"
    assert gate["layer_output_finite"] is True  # x / inf = 0


def test_nothing_where_every_op_is_finite(cases):
    _, truth = cases
    assert truth["results"]["rms_10"] is None  # 10^2 = 100: float16 holds it
    assert truth["results"]["rms_300_float32"] is None  # float32 holds 90000
