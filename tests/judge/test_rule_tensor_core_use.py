"""Rule ``tensor-core-use`` (mpwatch/judge/rules/tensor_core_use.py) on constructed Runs.

The profile records are built by mpwatch's own kernel summary (``profile.kernel_time``) from
constructed kernel tables with real kernel names (pure pandas, no trace), so the rule reads the
record exactly as a capture writes it; the expected numbers are the table's sums.
"""

from __future__ import annotations

import pandas as pd
import pytest
from builders import (
    assert_findings,
    findings_of,
    healthy_layers,
    layer_rows,
    make_run,
    run_info,
)

from mpwatch import profile
from mpwatch.judge import diagnose

RULE = "tensor-core-use"

# real kernel names (cuDNN/CUTLASS/cuBLAS/XLA), classified in tests/profile/test_kernels.py
F16_TC_CONV = (
    "sm80_xmma_fprop_implicit_gemm_indexed_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize256x64x32_"
    "stage3_warpsize4x1x1_g1_tensor16x8x16_execute_kernel__5x_cudnn"
)
F16_SIMT_GEMM = "cutlass_80_simt_hgemm_128x128_8x2_nn_align1"  # float16 on CUDA cores
F32_SGEMM = "ampere_sgemm_128x64_nn"  # float32 on CUDA cores
XLA_LOOP = "loop_add_fusion_3"  # element-wise, precision unknown
XLA_GEMM = "gemm_fusion_dot_general_3"  # a Triton matmul: precision and Tensor Cores unknown
PADDING = "void nhwcAddPaddingKernel<__half, __half, float, true, (cudnnKernelDataType_t)0>(int)"

CONV_F = "jit(train_step)/jvp(conv2d)/conv_general_dilated"
CONV_B = "jit(train_step)/transpose(jvp(conv2d))/conv_general_dilated"
DENSE_F = "jit(train_step)/jvp(dense)/dot_general"
DENSE_B = "jit(train_step)/transpose(jvp(dense))/dot_general"
PRED_F = "jit(train_step)/jvp(predictions)/dot_general"
NORM_F = "jit(train_step)/jvp(layer_norm)/add"


def kernel_profile(rows: list[tuple[str, str, float]], dims=None) -> dict:
    """A ``profile`` record with the kernel figures of ``(kernel, op name, us)`` rows."""
    table = pd.DataFrame({c: [None] * len(rows) for c in profile.KERNEL_COLUMNS})
    table["kernel_name"] = [r[0] for r in rows]
    table["op_name"] = [r[1] for r in rows]
    table["op_name_from"] = "xprof"
    table["total_duration_us"] = [float(r[2]) for r in rows]
    table["occurrences"] = 1
    table["xprof_tensor_core"] = False
    table["xprof_tensor_core_eligible"] = [profile.is_matmul_or_conv(r[1]) for r in rows]
    table["grid_dim"] = "1,1,1"
    table["block_dim"] = "128,1,1"
    names = ["conv2d", "dense", "layer_norm", "predictions"]
    return profile.kernel_time(table, names, dims).payload(steps=[3, 5])


def healthy_kernels(dense_kernel=F16_TC_CONV, dense_us=2000.0, extra=()) -> list:
    return [
        (F16_TC_CONV, CONV_F, 3000.0),
        (F16_TC_CONV, CONV_B, 4000.0),
        (dense_kernel, DENSE_F, dense_us / 2),
        (dense_kernel, DENSE_B, dense_us / 2),
        (XLA_LOOP, NORM_F, 800.0),
        (XLA_LOOP, "XlaModule", 200.0),
        *extra,
    ]


def _layers(changes: dict) -> list[list]:
    rows = layer_rows("mixed_float16")
    for (name, col), value in changes.items():
        row = next(r for r in rows if r[0] == name)
        row[col] = value
    return rows


def _float32_dense() -> list[list]:
    rows = layer_rows("mixed_float16")
    rows[1][4:6] = ["float32", "float32"]  # dense: policy float32
    return rows


def _aligned_dense(units: int = 64) -> list[list]:
    rows = layer_rows("mixed_float16")
    rows[1][11] = {"units": units, "kernel_input_dim": 64}
    rows[1][12] = units % 8 == 0
    return rows


CASES = [
    pytest.param(
        make_run(profile=kernel_profile(healthy_kernels())),
        [
            {
                "layer": None,
                "severity": "info",
                "title_has": ("90.0% of GPU time ran on Tensor Cores", "xprof's flag: 0%"),
                "evidence_has": (
                    "unknown precision 10.0% (never counted as 16-bit)",
                    "layer_norm 800 us (no matrix math)",
                ),
                "data": {"tensor_core_share": 0.9, "unknown_share": 0.1},
            }
        ],
        id="all-matrix-math-on-tensor-cores-one-summary",
    ),
    pytest.param(
        make_run(layers=_float32_dense(), profile=kernel_profile(healthy_kernels(F32_SGEMM))),
        [
            {
                "layer": "dense",
                "severity": "warning",
                "title_has": "(its policy)",
                "evidence_has": ("2 ms (20.0% of device time)", "2 ms in float32 kernels"),
                "fix_has": 'Dense(..., dtype="mixed_float16")',
                # the profile rule's float32-layer finding of dense is the same cause: folded
                "data": {"cause": "policy", "also": ["profile"]},
            },
            {"layer": None, "severity": "info"},
        ],
        id="float32-policy-layer-not-on-tensor-cores",
    ),
    pytest.param(
        make_run(
            layers=_layers({("dense", 11): {"units": 60, "kernel_input_dim": 64}}),
            profile=kernel_profile(healthy_kernels(F16_SIMT_GEMM)),
        ),
        [
            {
                "layer": "dense",
                "severity": "warning",
                "title_has": "units not a multiple of 8",
                "evidence_has": ("2 ms in 16-bit kernels", "units=60 -> 64"),
                "fix_has": "Dense(units=64, ...)",
                "data": {"cause": "alignment", "dims": {"units": 60}},
            },
            {"layer": None, "severity": "info"},
        ],
        id="unaligned-units-16bit-cuda-core-kernels",
    ),
    pytest.param(
        make_run(
            layers=_aligned_dense(),
            profile=kernel_profile(healthy_kernels(F16_SIMT_GEMM)),
        ),
        [
            {
                "layer": "dense",
                "severity": "warning",
                "title_has": "batch size 30 not a multiple of 8",
                "fix_has": "batch_size=32",
                "data": {"cause": "batch_size"},
            },
            {"layer": None},
        ],
        id="aligned-dims-but-batch-size-30",
    ),
    pytest.param(
        make_run(
            layers=_aligned_dense(),
            info=run_info("mixed_float16", batch_size=64),
            profile=kernel_profile(healthy_kernels(F16_SIMT_GEMM)),
        ),
        [
            {"layer": None},
            {"layer": "dense", "severity": "info", "data": {"cause": "unexplained"}},
        ],
        id="no-reason-in-the-record-is-info",
    ),
    pytest.param(
        make_run(
            layers=healthy_layers(),  # predictions: a float32 output
            profile=kernel_profile(healthy_kernels(extra=[(F32_SGEMM, PRED_F, 500.0)])),
        ),
        [
            {"layer": None},
            {
                "layer": "predictions",
                "severity": "info",
                "title_has": "an output kept in float32",
                "data": {"cause": "output_float32"},
            },
        ],
        id="float32-output-is-info",
    ),
    pytest.param(
        make_run(profile=kernel_profile(healthy_kernels(XLA_GEMM))),
        [
            {
                "layer": None,
                "severity": "info",
                # the Triton gemm's Tensor Core use is unknown: neither on nor off
                "evidence_has": "Tensor Core use unknown 2 ms",
                "data": {"unknown_share": 0.3},
            }
        ],
        id="unknown-stays-unknown-no-layer-finding",
    ),
    pytest.param(
        make_run(
            layers=_aligned_dense(),
            profile=kernel_profile(
                [(F16_SIMT_GEMM, DENSE_F, 3000.0), (F16_TC_CONV, CONV_F, 1000.0)]
            ),
        ),
        [
            {
                "layer": None,
                "severity": "warning",
                "title_has": "only 25.0% of the matrix math",
            },
            {"layer": "dense", "severity": "warning"},
        ],
        id="most-matrix-math-off-tensor-cores-warns",
    ),
    pytest.param(
        make_run(
            policy="float32",
            profile=kernel_profile([(F32_SGEMM, DENSE_F, 3000.0), (XLA_LOOP, NORM_F, 100.0)]),
        ),
        [{"layer": None, "severity": "info", "title_has": "0% of GPU time"}],
        id="float32-run-summary-only",
    ),
    pytest.param(
        make_run(
            profile=kernel_profile(healthy_kernels(extra=[(PADDING, CONV_F, 400.0)])),
        ),
        [
            {"layer": None},
            {
                "layer": "conv2d",
                "severity": "info",
                "title_has": "cuDNN pads its tensors",
                "evidence_has": ("nhwcAddPaddingKernel", "filters=30 -> 32"),
                "fix_has": "Conv2D(filters=32, ...)",
                # tensor-core-alignment's static finding for conv2d's filters: folded into it
                "data": {"cause": "padding", "also": ["tensor-core-alignment"]},
            },
        ],
        id="cudnn-padding-names-the-dimension-and-folds-alignment",
    ),
    pytest.param(
        # the 16-bit output 'predictions' (10 classes) off the Tensor Cores: its units are the
        # task's, never to be changed (issue 24)
        make_run(profile=kernel_profile(healthy_kernels(extra=[(F16_SIMT_GEMM, PRED_F, 2000.0)]))),
        [
            {"layer": None},
            {
                "layer": "predictions",
                "severity": "info",
                "title_has": "its width fixed by the task",
                "evidence_has": "units=10 is the width of the model's output 'predictions'",
                "fix_has": "nothing to change",
                "data": {"cause": "task_fixed", "dims": {"units": 10}},
            },
        ],
        id="an-outputs-class-count-is-never-asked-to-change",
    ),
    pytest.param(make_run(), [], id="no-profile"),
]


@pytest.mark.parametrize(("run", "expected"), CASES)
def test_tensor_core_use(run, expected):
    assert_findings(findings_of(diagnose(run), RULE), expected)


def test_a_cpu_profile_gives_nothing():
    from builders import profile_payload

    prof = dict(profile_payload(), source="host_ops")
    assert findings_of(diagnose(make_run(profile=prof)), RULE) == []


def test_alignment_measured_on_tensor_cores_becomes_info():
    # conv2d's filters=30: the static rule warns; the kernels show its convolutions on Tensor
    # Cores (no padding kernel), so the warning becomes info with the measurement
    found = diagnose(make_run(profile=kernel_profile(healthy_kernels())))
    align = [f for f in findings_of(found, "tensor-core-alignment") if f.layer == "conv2d"]
    assert len(align) == 1
    assert align[0].severity == "info"
    assert "on Tensor Cores" in align[0].evidence
    assert align[0].data["measured_on_tensor_cores"] is True
    # without a profile it stays a warning
    plain = diagnose(make_run())
    assert [f.severity for f in findings_of(plain, "tensor-core-alignment") if f.layer] == [
        "warning"
    ]


def test_summary_numbers_are_the_tables_sums():
    rows = healthy_kernels(F16_SIMT_GEMM)
    found = findings_of(diagnose(make_run(profile=kernel_profile(rows))), RULE)
    head = next(f for f in found if f.layer is None)
    total = sum(r[2] for r in rows)
    tc = sum(r[2] for r in rows if r[0] == F16_TC_CONV)
    assert head.data["tensor_core_share"] == pytest.approx(tc / total)
    dense = next(d for d in head.data["not_tensor_core_layers"] if d["layer"] == "dense")
    assert dense["eligible_not_tensor_core_us"] == pytest.approx(2000.0)
    assert head.data["unattributed_us"] == pytest.approx(200.0)


def test_a_kernel_whose_name_and_hlo_disagree_is_named():
    """Issue 26: where a kernel's name says another precision than the HLO instruction it runs,
    the HLO counts and the finding says so."""
    payload = kernel_profile(healthy_kernels())
    payload["kernel_summary"]["precision_disagreements"] = [
        {
            "kernel": "ampere_h16816gemm",
            "name_precision": "float16",
            "hlo_precision": "bfloat16",
            "us": 1500.0,
        }
    ]
    found = findings_of(diagnose(make_run(profile=payload)), RULE)
    head = next(f for f in found if f.layer is None)
    assert "kernel name and HLO disagree (the HLO counted): ampere_h16816gemm" in head.evidence
    assert "name: float16, HLO: bfloat16, 1.5 ms" in head.evidence
    assert head.data["precision_disagreements"][0]["kernel"] == "ampere_h16816gemm"
    # none: nothing said
    clean = kernel_profile(healthy_kernels())
    head = next(f for f in findings_of(diagnose(make_run(profile=clean)), RULE) if f.layer is None)
    assert "disagree" not in head.evidence and head.data["precision_disagreements"] == []
