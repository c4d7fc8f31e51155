"""The pre-flight on Keras' JAX backend (tests/jax/preflight_fit.py, in a subprocess): the skips
it predicts for mixed_float16 against the optimizer's own iterations and scale in a fit of the
same network, its recommendation applied and trained, the model left as it was, and TensorFlow
never imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parent.parent / "jax" / "preflight_fit.py"


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pre_jax")
    out = tmp / "result.json"
    env = dict(os.environ, KERAS_BACKEND="jax")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), str(tmp / "runs")],
        capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_the_skips_predicted_are_the_fits(result):
    """The steps a fit under mixed_float16 skips before its first applied step, as the
    optimizer's own iterations say, lie in the predicted range."""
    f16 = next(c for c in result["candidates"] if c["policy"] == "mixed_float16")
    p = f16["predictions"]
    assert p["skips"] is True and p["stuck"] is False
    fewest, most = p["skipped_steps"]
    skipped = result["fit"]["first_skips"]  # before the first step the optimizer applied
    assert fewest <= skipped <= most, (p, result["fit"])


def test_the_recommendation_applied_trains_with_a_float32_output(result):
    chosen = next(c for c in result["candidates"] if c["policy"] == result["recommended"])
    assert chosen["verdict"] == "ready with the change"
    assert chosen["checked_problems"] == []
    assert result["fixed_output_dtype"] == "float32"
    assert result["fixed_fit"]["loss"] == result["fixed_fit"]["loss"]  # finite, not NaN
    assert result["fixed_fit"]["iterations"][-1] >= 1


def test_no_tensorflow_and_the_model_left_as_it_was(result):
    assert result["tensorflow_imported"] is False
    assert result["policies_after"] == ["float32"]
