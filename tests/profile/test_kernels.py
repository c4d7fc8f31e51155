"""The kernel-name classifier (mpwatch/profile/kernel_classes.py, its catalogue kernel_patterns.py)
and the kernel join of mpwatch/profile/ on constructed tables: no trace, no TensorFlow, no GPU.

Kernel names are real ones from public cuBLAS/cuDNN/CUTLASS/XLA traces (the H100 trace of
tests/profile/test_gpu_trace.py for the cuDNN convolution and XLA names).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mpwatch import contract, profile
from mpwatch.profile import kernel_classes, kernel_patterns
from mpwatch.profile.kernel_classes import classify

ROOT = Path(__file__).resolve().parents[2]

# (kernel name, precision, tensor_core)
FLOAT32_SIMT = [
    ("ampere_sgemm_128x64_nn", "float32", "no"),
    ("volta_sgemm_128x64_tn", "float32", "no"),
    ("maxwell_sgemm_128x64_nt", "float32", "no"),
    ("cutlass_80_simt_sgemm_64x64_8x5_tn_align1", "float32", "no"),
    (
        "void cudnn::detail::implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, false, "
        "false, true>(int, int, int, float const*, int, float*, float const*, kernel_conv_params, "
        "unsigned long long, int, float, float, int, float const*, float const*, bool, int, int)",
        "float32",
        "no",
    ),
    (
        "_Z23implicit_convolve_sgemmIffLi128ELi5ELi5ELi3ELi3ELi3ELi1ELb0ELb0ELb1EEviiiPKT_",
        "float32",
        "no",
    ),
    ("volta_scudnn_128x64_relu_interior_nn_v1", "float32", "no"),
    (
        "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize256x64x8_stage3_warpsize2x2x1_ffma_aligna4_"
        "alignc4_execute_kernel__5x_cublas",
        "float32",
        "no",
    ),
    (
        "void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false, "
        "cublasGemvParams<cublasGemvTensorStridedBatched<float const>, "
        "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, "
        "float> >(cublasGemvParams<...>, float, float)",
        "float32",
        "no",
    ),
]
TF32 = [
    (
        "sm80_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x16_stage4_warpsize2x2x1_"
        "tensor16x8x8_execute_kernel__5x_cublas",
        "tf32",
        "yes",
    ),
    (
        "sm86_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4_"
        "warpsize2x2x1_g1_tensor16x8x8_alignc4_execute_kernel__5x_cudnn",
        "tf32",
        "yes",
    ),
    (
        "void cutlass__5x_cudnn::Kernel<cutlass_tensorop_s1688fprop_optimized_tf32_64x64_16x10_"
        "nhwc_align4>(cutlass_tensorop_s1688fprop_optimized_tf32_64x64_16x10_nhwc_align4::Params)",
        "tf32",
        "yes",
    ),
    ("cutlass_tensorop_s1688tf32gemm_256x128_16x3_tn_align4", "tf32", "yes"),
    ("nvjet_sss_tf32_128x256_TNT", "tf32", "yes"),
]
FLOAT16 = [
    (
        "sm80_xmma_fprop_implicit_gemm_indexed_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize256x64x32_"
        "stage3_warpsize4x1x1_g1_tensor16x8x16_execute_kernel__5x_cudnn",
        "float16",
        "yes",
    ),
    (
        "sm90_xmma_dgrad_implicit_gemm_indexed_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize256x32x64_"
        "warpgroupsize2x1x1_g1_strided_execute_kernel__5x_cudnn",
        "float16",
        "yes",
    ),
    (
        "void cutlass__5x_cudnn::Kernel<cutlass_tensorop_f16_s16816dgrad_optimized_f16_256x64_32x4_"
        "nhwc_align8>(cutlass_tensorop_f16_s16816dgrad_optimized_f16_256x64_32x4_nhwc_align8::"
        "Params)",
        "float16",
        "yes",
    ),
    (  # mangled CUTLASS template name (cuDNN's bundled CUTLASS): half_t operands, MmaTensorOp
        "_ZN17cutlass__5x_cudnn6KernelINS_4conv6kernel23ImplicitGemmConvolutionINS1_11threadblock22"
        "ImplicitGemmMultistageINS_4gemm9GemmShapeILi128ELi128ELi32EEENS4_52Conv2dWgradOutputGradie"
        "ntTileAccessIteratorOptimizedINS_11MatrixShapeILi128ELi32EEENS_6half_tENS_9transform29Pitc"
        "hLinearWarpRakedThreadMapINS_16PitchLinearShapeILi128ELi32EEELi128ENSF_ILi8ELi4EEELi8EEENS"
        "_12AlignedArrayISC_Li8ELi16EEEEENSD_11threadblock25RegularTileAccessIteratorISB_SC_NS_6lay"
        "out40ColumnMajorTensorOpMultiplicandCongruousILi16ELi64EEELi1ESI_Li16EEELNS_4arch14CacheOp"
        "eration4KindE0ENS6_11threadblock9MmaPolicyINS6_4warp11MmaTensorOpINS7_ILi64ELi64ELi32EEESC"
        "_SQ_SC_SZ_fNSO_8RowMajorEEEEEvNT_6ParamsE",
        "float16",
        "yes",
    ),
    ("volta_fp16_s884gemm_fp16_128x128_ldg8_f2f_nn", "float16", "yes"),
    ("turing_fp16_s1688cudnn_fp16_256x128_ldg8_relu_f2f_exp_small_nhwc_tn_v1", "float16", "yes"),
    ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn", "float16", "yes"),
    ("volta_h884gemm_64x64_ldg8_nn", "float16", "yes"),
    ("cutlass_tensorop_h16816gemm_256x128_32x3_nn_align8", "float16", "yes"),
    ("nvjet_hsh_256x128_64x4_2x1_v_bz_TNN", "float16", "yes"),
    ("nvjet_sm90_hss_320x128_64x3_1x2_h_bz_coopA_TNT", "float16", "yes"),
    # 16-bit data, but no Tensor Core kernel: a padding helper and a split-K reduction
    (
        "void nhwcAddPaddingKernel<__half, __half, float, true, (cudnnKernelDataType_t)0>(int, "
        "int, int, int, int, int, int, int, __half const*, __half*, int, int, int, int, float, "
        "float)",
        "float16",
        "no",
    ),
    (
        "void cutlass__5x_cudnn::Kernel<cutlass__5x_cudnn::reduction::kernel::ReduceSplitK<"
        "cutlass__5x_cudnn::MatrixShape<4, 256>, cutlass__5x_cudnn::epilogue::thread::"
        "LinearCombination<cutlass__5x_cudnn::half_t, 8, float, float>, "
        "cutlass__5x_cudnn::reduction::thread::ReduceAdd<float, float, 8>, 4> >(...)",
        "float16",
        "no",
    ),
]
BFLOAT16 = [
    ("nvjet_tst_128x128_64x4_1x2_h_bz_coopA_NNT", "bfloat16", "yes"),
    ("nvjet_sm100_tst_64x32_64x16_2x1_2cta_v_bz_TNT", "bfloat16", "yes"),
    (
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_"
        "segment_k_off_kernel__5x_cublas",
        "bfloat16",
        "yes",
    ),
    (
        "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x6_tn_align8>("
        "cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x6_tn_align8::Params)",
        "bfloat16",
        "yes",
    ),
    ("cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8", "bfloat16", "yes"),
    ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_tn", "bfloat16", "yes"),
]
FLOAT8 = [
    ("nvjet_qqtst_128x256_128x6_2x1_2cta_v_bz_TNT", "float8", "yes"),
    ("nvjet_qqhsh_128x128_128x6_1x1_v_bz_TNT", "float8", "yes"),
    (
        "sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n_tilesize128x128x128_warpgroupsize1x1x1_execute_"
        "segment_k_off_kernel__5x_cublas",
        "float8",
        "yes",
    ),
    (
        "cutlass3x_sm90_tensorop_s64x128x32gemm_e4m3_e4m3_f32_bf16_bf16_128x128x128_1x1x1_0_tnn_"
        "align16_warpspecialized",
        "float8",
        "yes",
    ),
]
INT8 = [
    (
        "sm80_xmma_gemm_i8i8_i8i32_f32_tn_n_tilesize128x128x64_stage3_warpsize2x2x1_tensor16x8x32_"
        "execute_kernel__5x_cublas",
        "int8",
        "yes",
    ),
    ("cutlass_tensorop_i16832gemm_s8_128x128_64x3_tn_align16", "int8", "yes"),
    ("turing_int8_i8816gemm_int8_128x128_ldg16_nt", "int8", "yes"),
]
ATTENTION = [
    (
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x128x64_4x1x1_"
        "kernel0_0",
        "float16",
        "yes",
    ),
    (
        "cudnn_generated_fort_native_sdpa_sm80_flash_bprop_bf16_knob_7_64x64x64_4x1x1_kernel0_0",
        "bfloat16",
        "yes",
    ),
    (
        "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64, 64, 4, false, false, "
        "cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 64, 4, cutlass::bfloat16_t> >, false, "
        "true, false, false, true, true, false>(Flash_fwd_params)",
        "bfloat16",
        "yes",
    ),
    (  # float32 attention: the name does not say whether it used Tensor Cores (3xTF32 or SIMT)
        "fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float, "
        "cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)",
        "float32",
        "unknown",
    ),
]
XLA_UNKNOWN = [
    ("gemm_fusion_dot_general_3", "unknown", "unknown"),
    ("gemm_fusion_dot", "unknown", "unknown"),
    ("triton_gemm_dot_1", "unknown", "unknown"),
    ("triton_softmax_3", "unknown", "unknown"),
    ("fusion_209", "unknown", "unknown"),
    ("loop_pad_fusion_1", "unknown", "no"),
    ("input_reduce_select_fusion_1", "unknown", "no"),
    ("loop_add_multiply_fusion_4", "unknown", "no"),
    ("input_transpose_fusion_2", "unknown", "no"),
    ("wrapped_convert_3", "unknown", "no"),
    ("memcpy32_post", "unknown", "no"),
]
NOTHING_SAID = [
    ("my_custom_kernel", "unknown", "unknown"),
    ("kernel", "unknown", "unknown"),
    ("", "unknown", "unknown"),
    ("_Z6kernelPfS_i", "unknown", "unknown"),
]


@pytest.mark.parametrize(
    "name, precision, tensor_core",
    FLOAT32_SIMT
    + TF32
    + FLOAT16
    + BFLOAT16
    + FLOAT8
    + INT8
    + ATTENTION
    + XLA_UNKNOWN
    + NOTHING_SAID,
    ids=lambda v: v[:60] if isinstance(v, str) and len(v) > 12 else v,
)
def test_classify_kernel_names(name, precision, tensor_core):
    c = classify(name)
    assert (c.precision, c.tensor_core) == (precision, tensor_core), c
    assert (
        c.precision in kernel_patterns.PRECISIONS and c.tensor_core in kernel_patterns.TENSOR_CORE
    )
    assert c.is_16bit == (precision in ("float16", "bfloat16"))


def test_kinds_and_pattern_ids():
    assert classify(FLOAT16[0][0]).kind == "conv"
    assert classify(FLOAT16[0][0]).pattern == "xmma"
    assert classify(FLOAT16[2][0]).kind == "conv"
    assert classify(FLOAT16[2][0]).pattern == "cutlass_tensorop"
    assert classify(BFLOAT16[2][0]).kind == "gemm"
    assert classify("ampere_sgemm_128x64_nn").kind == "gemm"
    assert classify(ATTENTION[0][0]).kind == "attention"
    assert classify("gemm_fusion_dot").kind == "gemm_fusion"
    assert classify("loop_pad_fusion").pattern == "xla_loop_fusion"
    assert classify("my_custom_kernel").pattern == ""


def test_unknown_stays_unknown_and_out_of_list_types_are_unknown():
    assert classify("my_custom_kernel") == kernel_classes.UNKNOWN
    # float64 is no value of PRECISIONS: a dgemm is not guessed float32
    assert classify("volta_dgemm_128x64_nn").precision == "unknown"
    assert classify("void gemv2N_kernel<int, int, double, double, double, 128>").precision == (
        "unknown"
    )
    # the s1688 shape names the accumulator (float32), not the operands: precision not decided
    bare = classify("cutlass_tensorop_s1688gemm_64x64_16x3_nn_align4")
    assert (bare.precision, bare.tensor_core) == ("unknown", "yes")


def test_xla_fusions_take_precision_from_hlo_types_in_the_op_name():
    op = "%gemm_fusion_dot.3 = bf16[128,256]{1,0} fusion(bf16[128,64] %p0, bf16[64,256] %p1)"
    c = classify("gemm_fusion_dot_general_3", op_name=op)
    assert (c.precision, c.tensor_core, c.precision_from) == ("bfloat16", "unknown", "op")
    c = classify("loop_convert_fusion", op_name="f16[32,32] convert(f32[32,32] x)")
    assert (c.precision, c.tensor_core) == ("float16", "no")
    # JAX op names carry no types: still unknown
    c = classify("gemm_fusion_dot", op_name="jit(train_step)/jvp(dense)/dot_general")
    assert (c.precision, c.tensor_core) == ("unknown", "unknown")
    # a family that names its types ignores the op name's
    assert classify("ampere_sgemm_128x64_nn", op_name="f16[2,2]").precision == "float32"


def test_xprof_flag_yes_is_trusted_no_never_overrides_the_name():
    f16 = FLOAT16[0][0]
    assert classify(f16, xprof_tensor_core=False).tensor_core == "yes"
    assert classify(f16, xprof_tensor_core=False).evidence == "name"
    assert classify(FLOAT16[2][0], xprof_tensor_core=True).evidence == "name+xprof"
    c = classify("my_custom_kernel", xprof_tensor_core=True)
    assert (c.precision, c.tensor_core, c.evidence) == ("unknown", "yes", "xprof")
    c = classify("my_custom_kernel", xprof_tensor_core=False)
    assert (c.precision, c.tensor_core, c.evidence) == ("unknown", "unknown", "")
    assert classify("ampere_sgemm_128x64_nn", xprof_tensor_core=False).tensor_core == "no"
    assert classify("my_custom_kernel", xprof_tensor_core=np.bool_(True)).tensor_core == "yes"
    assert classify("my_custom_kernel", xprof_tensor_core=None).tensor_core == "unknown"


def test_every_pattern_example_is_read_by_its_own_pattern():
    ids = [p.id for p in kernel_patterns.PATTERNS]
    assert len(ids) == len(set(ids))
    for p in kernel_patterns.PATTERNS:
        assert p.library and p.source and p.example, p.id
        assert p.precision in kernel_patterns.PRECISIONS, p.id
        assert p.tensor_core in (*kernel_patterns.TENSOR_CORE, "typed"), p.id
        assert p.types_from in ("name", "op", "nvjet"), p.id
        for example in p.example.split(" / "):
            got = kernel_patterns.match(example)
            assert got is not None and got.id == p.id, (p.id, example, got and got.id)
        assert kernel_patterns.pattern(p.id) is p


def test_precision_of_types_narrowest_wins():
    assert kernel_patterns.precision_of_types("e4m3e4m3_e4m3f32_f32") == "float8"
    assert kernel_patterns.precision_of_types("f16f16_f16f32_f32") == "float16"
    assert kernel_patterns.precision_of_types("f32f32_tf32f32_f32") == "tf32"
    assert kernel_patterns.precision_of_types("tilesize128x128x8_stage3") == "unknown"
    # mangled substitutions (S8_, Li8E) are no int8
    assert kernel_patterns.precision_of_types("NS8_ILi8ELi4EEE") == "unknown"


def test_the_pattern_table_doc_is_generated_from_the_module():
    doc = ROOT / "docs" / "kernels.md"
    assert doc.read_text() == kernel_classes.render_markdown(), (
        'docs/kernels.md is stale: python -c "from mpwatch.profile import kernel_classes; '
        "open('docs/kernels.md','w').write(kernel_classes.render_markdown())\""
    )
    rows = kernel_patterns.pattern_table()
    assert [r["id"] for r in rows] == [p.id for p in kernel_patterns.PATTERNS]
    for r in rows:
        assert f"`{r['id']}`" in doc.read_text()


# --- op names: JAX scopes, direction, eligibility ------------------------------------------------
def test_jax_scopes_and_direction():
    fwd = "jit(train_step)/jvp(conv2d_1)/conv_general_dilated"
    bwd = "jit(train_step)/transpose(jvp(conv2d_1))/conv_general_dilated"
    assert profile.jax_scopes(fwd) == [("conv2d_1", False, True)]
    assert profile.jax_scopes(bwd) == [("conv2d_1", True, True)]
    assert profile.op_name_direction(fwd) == "forward"
    assert profile.op_name_direction(bwd) == "backward"
    assert profile.jax_scopes("jit(train_step)/reduce_and") == []
    assert profile.jax_scopes("XlaModule") == []
    assert profile.op_name_direction("XlaModule") == "unknown"
    nested = "jit(train_step)/jit(main)/jvp(functional)/jvp(dense)/dot_general"
    assert [s for s, _, _ in profile.jax_scopes(nested)] == ["functional", "dense"]
    assert profile.jax_scopes("jit(predict_step)/dense/dot_general") == [("dense", False, False)]
    assert profile.op_name_direction("net/gradient_tape/net/dense/MatMul") == "backward"
    assert profile.op_name_direction("net/dense/MatMul") == "forward"
    assert profile.is_jax_op_name(fwd) and not profile.is_jax_op_name("net/dense/MatMul")


@pytest.mark.parametrize(
    "op_name, expected",
    [
        ("jit(train_step)/jvp(conv2d)/conv_general_dilated", True),
        ("jit(train_step)/transpose(jvp(dense))/dot_general", True),
        ("net/dense/MatMul", True),
        ("net/dense/MatMul_1", True),
        ("net/gradient_tape/net/conv2d/Conv2DBackpropFilter", True),
        ("net/conv2d/BiasAdd", False),
        ("jit(train_step)/jvp(conv2d)/add", False),
        ("XlaModule", False),
        ("", False),
    ],
)
def test_matmul_or_conv_op_names(op_name, expected):
    assert profile.is_matmul_or_conv(op_name) is expected


def _tree():
    li = profile.LayerInfo
    inner = li("inner", "net/inner", "Sequential", "float16", 0)
    inner.children = [li("dense", "net/inner/dense", "Dense", "float16", 10)]
    root = li("net", "net", "Functional", "mixed_float16")
    root.children = [li("conv2d", "net/conv2d", "Conv2D", "float16", 30), inner]
    return root


def test_attribute_kernels_jax_and_tensorflow_names():
    root = _tree()
    names = [
        "jit(train_step)/jvp(conv2d)/conv_general_dilated",
        "jit(train_step)/transpose(jvp(conv2d))/conv_general_dilated",
        "jit(train_step)/jvp(net)/jvp(inner)/jvp(dense)/dot_general",
        "jit(train_step)/transpose(jvp(adam))/mul",
        "StatefulPartitionedCall/net_1/conv2d_1/Conv2D",
        "StatefulPartitionedCall/gradient_tape/net_1/inner_1/dense_1/MatMul",
        "XlaModule",
    ]
    got = profile.attribute_kernels(names, root)
    assert got[names[0]] == ("conv2d", "net/conv2d", "forward")
    assert got[names[1]] == ("conv2d", "net/conv2d", "backward")
    assert got[names[2]] == ("dense", "net/inner/dense", "forward")
    assert got[names[3]] == (None, None, "backward")  # no layer called adam
    assert got[names[4]] == ("conv2d", "net/conv2d", "forward")
    assert got[names[5]] == ("dense", "net/inner/dense", "backward")
    assert got[names[6]] == (None, None, "unknown")
    # without a model: JAX scopes as they are, TensorFlow names unattributed
    bare = profile.attribute_kernels(names)
    assert bare[names[1]] == ("conv2d", "conv2d", "backward")
    assert bare[names[4]] == (None, None, "forward")
    # a list of layer names is enough for JAX names
    named = profile.attribute_kernels(names, ["conv2d", "dense"])
    assert named[names[2]][0] == "dense" and named[names[3]][0] is None


def _table(rows):
    cols = ["kernel_name", "op_name", "total_duration_us", "xprof_tensor_core", "eligible_flag"]
    df = pd.DataFrame(rows, columns=cols)
    out = pd.DataFrame({c: [None] * len(df) for c in profile.KERNEL_COLUMNS})
    out["kernel_name"] = df["kernel_name"]
    out["op_name"] = df["op_name"]
    out["total_duration_us"] = df["total_duration_us"].astype(float)
    out["occurrences"] = 1
    out["xprof_tensor_core"] = df["xprof_tensor_core"]
    out["xprof_tensor_core_eligible"] = df["eligible_flag"]
    out["grid_dim"] = "1,1,1"
    out["block_dim"] = "128,1,1"
    return out


def test_kernel_time_on_a_constructed_table():
    f16_conv = FLOAT16[0][0]
    rows = [
        (f16_conv, "jit(train_step)/jvp(conv2d)/conv_general_dilated", 40.0, False, True),
        (
            FLOAT16[2][0],
            "jit(train_step)/transpose(jvp(conv2d))/conv_general_dilated",
            30.0,
            True,
            True,
        ),
        ("ampere_sgemm_128x64_nn", "jit(train_step)/jvp(dense)/dot_general", 10.0, False, False),
        ("gemm_fusion_dot", "jit(train_step)/transpose(jvp(dense))/dot_general", 5.0, False, False),
        ("loop_add_fusion", "XlaModule", 10.0, False, False),
        ("my_custom_kernel", "jit(train_step)/jvp(dense)/add", 5.0, False, False),
    ]
    result = profile.kernel_time(_table(rows), ["conv2d", "dense"])
    s = result.summary
    assert s["total_us"] == 100.0
    assert s["by_precision_us"]["float16"] == 70.0
    assert s["by_precision_us"]["float32"] == 10.0
    assert s["by_precision_us"]["unknown"] == 20.0
    assert set(s["by_precision_us"]) == set(kernel_patterns.PRECISIONS)
    assert s["share_16bit"] == pytest.approx(0.70)
    assert s["unknown_share"] == pytest.approx(0.20)
    assert s["tensor_core_share"] == pytest.approx(0.70)
    assert s["xprof_tensor_core_share"] == pytest.approx(0.30)
    assert s["tensor_core_missed_by_xprof_share"] == pytest.approx(0.40)
    assert s["tensor_core_unknown_share"] == pytest.approx(0.10)  # gemm fusion + custom kernel
    # eligible: xprof flag (the two convs) or a matmul/conv op name (the sgemm and the fusion)
    assert s["eligible_us"] == 85.0
    assert s["eligible_not_tensor_core_us"] == 10.0  # the float32 sgemm
    assert s["eligible_tensor_core_unknown_us"] == 5.0  # the gemm fusion: not decided
    assert s["forward_us"] == 55.0 and s["backward_us"] == 35.0
    assert s["direction_unknown_us"] == 10.0
    assert s["attributed_us"] == 90.0 and s["unattributed_us"] == 10.0
    assert s["unknown_kernels"] == ["my_custom_kernel"]

    layers = result.layers.set_index("layer")
    assert list(result.layers.columns) == profile.LAYER_KERNEL_COLUMNS
    assert layers.loc["conv2d", "time_us"] == 70.0
    assert layers.loc["conv2d", "forward_us"] == 40.0
    assert layers.loc["conv2d", "backward_us"] == 30.0
    assert layers.loc["conv2d", "tensor_core_share"] == 1.0
    assert layers.loc["conv2d", "xprof_tensor_core_us"] == 30.0
    assert layers.loc["dense", "float32_us"] == 10.0
    assert layers.loc["dense", "unknown_us"] == 10.0
    assert layers.loc["dense", "eligible_not_tensor_core_us"] == 10.0
    assert layers.loc["dense", "tensor_core_us"] == 0.0
    assert layers["time_us"].sum() + s["unattributed_us"] == s["total_us"]

    k = result.kernels
    assert not k.loc[k["precision"].eq("unknown"), "is_16bit"].any()
    payload = result.payload(steps=[3, 4, 5], trace_dir="/logs/plugins/profile/run")
    text = json.dumps(payload)  # JSON-able (NaN allowed, as in every record)
    assert json.loads(text)["kernel_summary"]["total_us"] == 100.0
    for key in ("kernel_layers", "kernels"):
        assert set(payload[key]) == {"columns", "data"}
        assert all(len(r) == len(payload[key]["columns"]) for r in payload[key]["data"])
    assert payload["kernel_layers"]["columns"] == profile.LAYER_KERNEL_COLUMNS
    assert payload["kernels"]["columns"] == contract.PROFILE_KERNEL_COLUMNS
    assert payload["kernel_tool"] == "kernel_stats" and payload["steps"] == [3, 4, 5]
    assert payload["source"] == "device_kernels"
    assert contract.decode_payload(contract.encode_payload(payload))["kernels_dropped"] == 0


def test_kernel_time_with_a_layer_tree_and_tensorflow_names():
    rows = [
        (
            "volta_sgemm_128x64_nn",
            "StatefulPartitionedCall/net_1/inner_1/dense_1/MatMul",
            8.0,
            False,
            True,
        ),
        (FLOAT16[4][0], "StatefulPartitionedCall/net_1/conv2d_1/Conv2D", 12.0, True, True),
    ]
    result = profile.kernel_time(_table(rows), _tree())
    layers = result.layers.set_index("layer")
    assert layers.loc["dense", "path"] == "net/inner/dense"
    assert layers.loc["dense", "class"] == "Dense"
    assert layers.loc["dense", "eligible_not_tensor_core_us"] == 8.0
    assert layers.loc["conv2d", "float16_us"] == 12.0
    assert layers.loc["conv2d", "tensor_core_us"] == 12.0


def test_empty_kernel_table():
    empty = pd.DataFrame({c: [] for c in profile.KERNEL_COLUMNS})
    result = profile.kernel_time(empty)
    assert result.summary["total_us"] == 0.0
    assert np.isnan(result.summary["tensor_core_share"])
    assert result.layers.empty
    json.dumps(result.payload())


def test_huge_kernel_tables_are_trimmed_to_fit_a_record():
    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz0123456789"))
    rows = [
        (f"k{i}_" + "".join(rng.choice(letters, 2000)), "XlaModule", float(i + 1), False, False)
        for i in range(600)
    ]
    result = profile.kernel_time(_table(rows))
    payload = result.payload()
    assert len(contract.encode_payload(payload)) <= contract.MAX_RECORD_BYTES
    assert payload["kernels_dropped"] > 0
    assert payload["kernel_summary"]["kernels"] == 600  # the summary covers every kernel
    kept = payload["kernels"]["data"]
    assert kept[0][payload["kernels"]["columns"].index("total_duration_us")] == 600.0
