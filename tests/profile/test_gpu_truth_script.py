"""benchmarks/gpu_truth.py (issue 54's GPU check): its own HLO truth, checked here without a GPU.

The classifier on the script's synthetic HLO snippet (``self_test``), and on the real H100 trace of
``tests/data/h100`` with the HLO of the trace's metadata plane: every kernel mapped, and the
convolutions' kernels still found when they are moved into one CUDA graph launch (where the
events name the command buffer, not the instruction).
"""

from __future__ import annotations

import os

import pytest
from repo_scripts import ROOT, load_script

TRACE = os.path.join(ROOT, "tests", "data", "h100", "seed004_convnet_mixed_float16_bs128.xplane.pb")


@pytest.fixture(scope="module")
def gt():
    return load_script("benchmarks/gpu_truth.py")


def test_classifier_on_synthetic_hlo(gt):
    gt.self_test()


def test_h100_trace_truth(gt):
    pytest.importorskip("jax")  # jaxlib prints the trace's HloProto as text
    from mpwatch.profile import xplane

    space = xplane.read_xspace(TRACE)
    kernels, _ = gt.gpu_kernels([space])
    truth = gt.truth_summary(gt.classify_kernels(kernels, gt.TracePrograms([space])), "trace")
    assert truth["unknown_share"] == 0
    assert truth["by_category_us"]["unmapped"] == 0
    assert truth["tensor_core_share"] == pytest.approx(0.763, abs=0.005)  # cuDNN's f16 kernels
    assert truth["tensor_core_share_helpers_in"] > truth["tensor_core_share"]  # padding, split-K

    for k in kernels:  # the whole step as one graph launch
        k.hlo_op, k.correlation = "command_buffer_99", "launch"
    rows = gt.classify_kernels(kernels, gt.TracePrograms([space]))
    moved = gt.truth_summary(rows, "trace")
    assert moved["tensor_core_share"] == pytest.approx(truth["tensor_core_share"])
    assert {r.how for r in rows if r.category == "tc16"} <= {"cb_window", "kernel_name"}
