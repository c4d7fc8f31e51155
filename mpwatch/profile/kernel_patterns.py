"""The catalogue of GPU kernel names: their families (:data:`PATTERNS`) and the type tokens.

Each :class:`KernelPattern` is one family of kernel names (cuBLAS ``nvjet``/``gemm``, cuDNN,
CUTLASS, ``xmma``, XLA fusions, framework element-wise kernels, copies...) with its regular
expression, the precision and Tensor Core use the family fixes, where the types are read from, an
example name and a source. The lookups here read a name against the catalogue: :func:`match` (the
first family whose regex matches), :func:`precision_of_types` (the narrowest type token in a name,
or HLO type in an op name), :func:`nvjet_precision` (cuBLAS' type letters), :func:`kernel_kind`
(GEMM or convolution). What a kernel computed in, from these, is decided in
:mod:`mpwatch.profile.kernel_classes` (its docstring has the rules; ``docs/kernels.md`` shows both).

Example:
    >>> match("ampere_sgemm_128x64_nn").id
    'simt_sgemm'
    >>> precision_of_types("f16f16_f16f32_f32")
    'float16'
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from mpwatch.contract import PROFILE_PRECISIONS

#: ``mixed`` (16- and 32-bit data both) and ``integer`` (no floating point) come from the HLO of
#: XLA's own kernels (:mod:`mpwatch.profile.hlo_kernels`), never from a name
PRECISIONS = PROFILE_PRECISIONS  # the profile record's own list (one list, in the contract)
TENSOR_CORE = ("yes", "no", "unknown")
#: precisions that count as 16-bit compute (float8 and int8 are narrower, not "16-bit")
SIXTEEN_BIT_PRECISIONS = frozenset({"float16", "bfloat16"})
#: precisions Tensor Cores compute in (Volta: float16; Ampere+: bfloat16, tf32, int8; Hopper: fp8)
TENSOR_CORE_PRECISIONS = frozenset({"float16", "bfloat16", "tf32", "float8", "int8"})

# Type tokens in kernel names, narrowest first: the first that matches names the precision.
# Case-sensitive on purpose: mangled names use upper-case substitutions (``S8_``) that must not read
# as ``s8`` (int8).
TYPE_TOKENS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("float8", re.compile(r"e4m3|e5m2|fp8|float8|Float8")),
    (
        "int8",
        re.compile(r"i8816|i16832|imma|int8|(?<![A-Za-z0-9])[isu]8(?![0-9])|signed char"),
    ),
    ("bfloat16", re.compile(r"bf16|bfloat16|BFloat16")),
    (
        "float16",
        re.compile(
            r"(?<![bB])f16|fp16|half|Half|(?<![A-Za-z0-9])h(?:884|1688|16816)|(?<![a-z])hgemm"
        ),
    ),
    ("tf32", re.compile(r"tf32|tfloat32")),
    (
        "float32",
        re.compile(r"(?<![A-Za-z0-9])f32(?![0-9])|fp32|\bfloat\b|f32f32|(?<![a-z])sgem[mv]|scudnn"),
    ),
)
# Types outside PRECISIONS: when one of them is the only type named, the precision is unknown.
OTHER_TYPES = re.compile(r"f64|fp64|double|dgemm|zgemm|cgemm|int4|i8832|i16864")

# HLO element types in op names / metadata (``f16[128,64]``), narrowest first.
_HLO_TYPES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("float8", re.compile(r"\bf8e\w*\[")),
    ("int8", re.compile(r"\b[su]8\[")),
    ("bfloat16", re.compile(r"\bbf16\[")),
    ("float16", re.compile(r"\bf16\[")),
    ("tf32", re.compile(r"\btf32\[")),
    ("float32", re.compile(r"\bf32\[")),
)

# cuBLAS nvjet: nvjet_[smXX_][qq]<A/B><compute><output>[_tf32]_...
_NVJET = re.compile(r"nvjet_(?:sm\d+_)?(qq)?([a-z])([a-z])([a-z])(?:_(tf32))?(?:_|$)")
_NVJET_LETTERS = {"h": "float16", "t": "bfloat16", "s": "float32"}

_CONV_WORDS = re.compile(r"fprop|dgrad|wgrad|[Cc]onv|scudnn|[hs]\d+cudnn")


@dataclass(frozen=True)
class KernelPattern:
    """One family of kernel names: how to read precision and Tensor Core use from it.

    ``precision``: a value of :data:`PRECISIONS` used when the name's type tokens say nothing
    (``"unknown"``: only the tokens decide). ``types_from``: ``"name"`` (type tokens of the kernel
    name), ``"op"`` (HLO types in the op name only; XLA fusion names carry none), ``"nvjet"``
    (cuBLAS' three type letters). ``tensor_core``: ``yes``/``no``/``unknown``, or ``"typed"``: yes
    when the precision is a Tensor Core type (:data:`TENSOR_CORE_PRECISIONS`), else unknown.
    """

    id: str
    library: str
    regex: str
    precision: str
    tensor_core: str
    kind: str
    example: str
    source: str
    types_from: str = "name"
    flags: int = 0

    @property
    def compiled(self) -> re.Pattern[str]:
        return _compiled(self.regex, self.flags)


@cache
def _compiled(regex: str, flags: int) -> re.Pattern[str]:
    return re.compile(regex, flags)


#: The kernel name families, checked in order; the first whose ``regex`` matches (``re.search``)
#: classifies the kernel. Sources: NVIDIA/cutlass ``media/docs/profiler.md`` and the CUTLASS
#: library generator (``python/cutlass_library/gemm_operation.py``: names are
#: ``cutlass_<opclass>_[<C type>_]<accum><instr shape>[<math type>]<kind>[_<A type>]_...``),
#: cuBLAS/cuDNN names in public traces, openxla/xla fusion naming, openxla/xprof
#: ``kernel_stats_utils.cc``.
PATTERNS: tuple[KernelPattern, ...] = (
    # --- cuBLAS --------------------------------------------------------------------------------
    KernelPattern(
        "nvjet",
        "cuBLAS (Hopper/Blackwell nvjet)",
        r"\bnvjet_",
        "unknown",
        "typed",
        "gemm",
        "nvjet_hsh_256x128_64x4_2x1_v_bz_TNN",
        "No NVIDIA documentation (NVIDIA calls the naming confidential, NVIDIA/TensorRT-LLM#1541). "
        "Community decoding of public traces, an assumption: three letters after nvjet_[smXX_] = "
        "A/B, compute, output type; h float16, t bfloat16, s float32; sss_tf32 = float32 run as "
        "TF32; a qq prefix = FP8 A and B (nvjet_qqtst).",
        types_from="nvjet",
    ),
    KernelPattern(
        "xmma_ffma",
        "cuBLAS/cuDNN (xmma, FFMA)",
        r"xmma_\w*_ffma|xmma_\w*f32f32_f32f32",
        "float32",
        "no",
        "gemm",
        "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8_stage3_warpsize2x2x1_ffma",
        "xmma type code f32f32_f32f32 (A/B float32, compute float32) with the ffma token: float32 "
        "fused multiply-add on CUDA cores. Tensor Cores have no float32 input mode; float32 on "
        "Tensor Cores is named tf32 (f32f32_tf32f32).",
    ),
    KernelPattern(
        "xmma",
        "cuBLAS/cuDNN (xmma)",
        r"xmma_",
        "unknown",
        "typed",
        "gemm_or_conv",
        "sm80_xmma_fprop_implicit_gemm_indexed_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize256x64x32",
        "cuBLAS/cuDNN xmma kernels (gemm, fprop, dgrad, wgrad): type code <A><B>_<C><accum>, "
        "f16f16_f16f32 = float16 operands, float32 accumulation; tensorNxNxN = MMA shape; "
        "warpgroupsize = Hopper wgmma (inferred from names). xprof's list holds only "
        "xmma_gemm / xmma_implicit_gemm, so sm80_xmma_fprop_implicit_gemm_* reads 'no' there.",
    ),
    KernelPattern(
        "cublas_splitk_reduce",
        "cuBLAS/CUTLASS (split-K reduction)",
        r"splitKreduce|ReduceSplitK|split_k_reduce|reduce_split_k",
        "unknown",
        "no",
        "reduction",
        "cutlass::reduction::kernel::ReduceSplitK<..., LinearCombination<half_t, 8, float, float>>",
        "Adds the partial sums of a split-K GEMM: an element-wise reduction on CUDA cores; "
        "precision from its template types (the output type).",
    ),
    KernelPattern(
        "cublas_gemv",
        "cuBLAS (GEMV / small GEMM)",
        r"gemv|gemmSN_|gemmk1_kernel|dot_kernel|scal_kernel|axpy_kernel",
        "unknown",
        "no",
        "gemm",
        "void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, ...>",
        "cuBLAS matrix-vector and small-N kernels (gemv2T/gemv2N, gemmSN, gemmk1): CUDA-core "
        "kernels; precision from their template types.",
    ),
    # --- CUTLASS (and cuDNN's bundled CUTLASS: cutlass__5x_cudnn) ------------------------------
    KernelPattern(
        "cutlass_simt",
        "CUTLASS (SIMT)",
        r"cutlass\w*?_simt_|MmaSimt|OpClassSimt",
        "unknown",
        "no",
        "gemm_or_conv",
        "cutlass_80_simt_sgemm_64x64_8x5_tn_align1",
        "NVIDIA/cutlass profiler docs: opcode class 'simt' = CUDA cores; sgemm = float32, "
        "hgemm = float16.",
    ),
    KernelPattern(
        "cutlass_tensorop",
        "CUTLASS / cuDNN (tensorop)",
        r"cutlass\w*?_(?:wmma_|sp)?tensorop_|MmaTensorOp|TensorOpMultiplicand|OpClassTensorOp",
        "unknown",
        "yes",
        "gemm_or_conv",
        "cutlass_tensorop_f16_s16816dgrad_optimized_f16_256x64_32x4_nhwc_align8",
        "NVIDIA/cutlass profiler docs: opcode class 'tensorop' = Tensor Cores. Generator naming "
        "<C type>_<accum><shape>[<math type>]<kind>_<A type>: f16_s16816dgrad_..._f16 = float16 "
        "operands, float32 accumulation; s1688...tf32 = TF32; a bare s1688gemm names no operand "
        "type (float32 data as TF32 or 3xTF32): precision unknown. Template names (also mangled) "
        "carry half_t / bfloat16_t / tfloat32_t / float_e4m3_t.",
    ),
    # --- cuDNN fused attention, flash attention ------------------------------------------------
    KernelPattern(
        "attention",
        "cuDNN / flash / fmha attention",
        r"sdpa|fmha|flash_?(?:fwd|bwd|fprop|bprop|attn|attention)|fused_attn|flash_attn",
        "unknown",
        "typed",
        "attention",
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x128x64",
        "cuDNN's fused attention (sdpa/flash, fprop/bprop), FlashAttention, CUTLASS fmha: matmuls "
        "on Tensor Cores in float16/bfloat16/fp8; a float32 variant (fmha_cutlassF_f32) is not "
        "decided by the name.",
    ),
    # --- instruction names and shapes (cuBLAS/cuDNN Volta..Ampere names, anything else) --------
    KernelPattern(
        "mma_instruction",
        "cuBLAS/cuDNN (MMA instruction shape)",
        r"(?<![A-Za-z0-9])(?:h|s|i)(?:884|1688|16816|8816|16832|161616)[a-z0-9]*?"
        r"(?:gemm|cudnn|fprop|dgrad|wgrad|conv)|hmma|imma|wgmma|gmma_",
        "unknown",
        "yes",
        "gemm_or_conv",
        "turing_fp16_s1688cudnn_fp16_256x128_ldg8_relu_f2f_exp_small_nhwc_tn_v1",
        "Tensor Core MMA instruction shapes in the name: h884/s884 (Volta), h1688/s1688 (Turing), "
        "s16816/i16832 (Ampere+); the first letter is the accumulator (h float16, s float32, "
        "i int32); hmma/imma/wgmma are the instructions. Operand type from the other tokens "
        "(fp16, bf16, tf32); h-accumulate implies float16 operands; a bare s1688 says none.",
    ),
    # --- float32 on CUDA cores -----------------------------------------------------------------
    KernelPattern(
        "simt_sgemm",
        "cuBLAS/cuDNN (SIMT float32)",
        r"sgemm|scudnn|_ffma_|(?<![a-z])sgemv",
        "float32",
        "no",
        "gemm_or_conv",
        "ampere_sgemm_128x64_nn / implicit_convolve_sgemm<float, float, 128, 5, 5, ...>",
        "cuBLAS sgemm and cuDNN scudnn / implicit_convolve_sgemm / precomputed_convolve_sgemm: "
        "single-precision GEMM/convolution on CUDA cores (no instruction shape, no tensorop).",
    ),
    KernelPattern(
        "simt_hgemm",
        "cuBLAS (hgemm without instruction shape)",
        r"(?<![a-z])hgemm|hcudnn",
        "float16",
        "unknown",
        "gemm_or_conv",
        "maxwell_hgemm_256x128_nn",
        "float16 GEMM without an MMA shape token: HFMA2 on CUDA cores on pre-Volta GPUs; not "
        "decided on newer ones.",
    ),
    # --- cuDNN helpers, framework element-wise kernels -----------------------------------------
    KernelPattern(
        "cudnn_helper",
        "cuDNN (helper kernels)",
        r"nhwcAddPaddingKernel|nchwToNhwc|nhwcToNchw|nchwAddPadding|bn_fw|bn_bw|bn_fwd|bn_bwd|"
        r"cudnn::|cudnn_ops|transpose_readWrite|computeOffsetsKernel|scalePackedTensor|"
        r"pooling_fw|pooling_bw|softmax_fw|softmax_bw|op_generic_tensor_kernel|setOutputKernel",
        "unknown",
        "no",
        "helper",
        "void nhwcAddPaddingKernel<__half, __half, float, true, (cudnnKernelDataType_t)0>(...)",
        "cuDNN layout, padding, batch-norm, pooling and softmax kernels: memory-bound CUDA-core "
        "code; precision from their template types.",
    ),
    KernelPattern(
        "framework_elementwise",
        "Eigen / TensorFlow / PyTorch / CUB",
        r"Eigen::|tensorflow::|at::native::|\bcub::|_ZN5Eigen|_ZN10tensorflow|_ZN2at6native|"
        r"_ZN3cub",
        "unknown",
        "no",
        "elementwise",
        "void Eigen::internal::EigenMetaKernel<Eigen::TensorEvaluator<...Eigen::half...>>",
        "Framework element-wise, reduction and copy kernels (matmuls go to cuBLAS/cuDNN); "
        "precision from their template types.",
    ),
    # --- XLA / Triton --------------------------------------------------------------------------
    KernelPattern(
        "xla_gemm_fusion",
        "XLA (Triton / GEMM fusion)",
        r"^(?:gemm_fusion|triton_gemm|triton_dot|triton_\w*gemm|cutlass_gemm_fusion|"
        r"__triton_gemm|custom_gemm_fusion)",
        "unknown",
        "unknown",
        "gemm_fusion",
        "gemm_fusion_dot_general_3",
        "XLA's Triton GEMM fusions (openxla/xla, fusion kind __triton_gemm) name the HLO, not "
        "the types or the instructions: precision only from the op's HLO types, Tensor Core use "
        "not decided.",
        types_from="op",
    ),
    KernelPattern(
        "xla_triton",
        "XLA / Triton (other)",
        r"^triton_|^__triton",
        "unknown",
        "unknown",
        "fusion",
        "triton_softmax_3",
        "XLA Triton fusions other than GEMMs (softmax, normalization): names carry no types.",
        types_from="op",
    ),
    KernelPattern(
        "xla_loop_fusion",
        "XLA (loop / input / transpose fusion)",
        r"^(?:loop|input|wrapped|transpose|concatenate|copy|scatter|reduce|dynamic|slice|"
        r"convert|broadcast|pad|select)_[A-Za-z0-9_]*$",
        "unknown",
        "no",
        "elementwise",
        "loop_pad_fusion_1 / input_reduce_fusion_4 / wrapped_convert_3",
        "XLA GPU fusion names <kind>_<ops>_fusion (loop = element-wise, input = reduction; "
        "wrapped_<op> = one instruction): emitted by XLA's own loop/reduction emitters, which "
        "emit no MMA instructions (dots go to cuBLAS/cuDNN/Triton). Precision from the op's HLO "
        "types only.",
        types_from="op",
    ),
    KernelPattern(
        "xla_fusion",
        "XLA (fusion of unnamed kind)",
        r"^fusion(?:_\d+)?$|^cudnn_fusion",
        "unknown",
        "unknown",
        "fusion",
        "fusion_209",
        "A fusion whose name gives neither its kind nor its types.",
        types_from="op",
    ),
    KernelPattern(
        "copy",
        "CUDA / XLA (memory copy)",
        r"^memcpy|^memset|[Mm]emcpy|[Mm]emset|^copy_\d+$",
        "unknown",
        "no",
        "copy",
        "memcpy32_post",
        "Copies and fills move bytes; no arithmetic.",
        types_from="op",
    ),
)

_BY_ID = {p.id: p for p in PATTERNS}


def precision_of_types(text: str, hlo: bool = False) -> str:
    """The narrowest precision whose type token appears in ``text`` (``unknown`` when none).

    >>> precision_of_types("f16f16_f16f32_f32")
    'float16'
    >>> precision_of_types("f32f32_tf32f32_f32")
    'tf32'
    >>> precision_of_types("fusion(bf16[128,64] x, f32[64] y)", hlo=True)
    'bfloat16'
    """
    for precision, rx in _HLO_TYPES if hlo else TYPE_TOKENS:
        if rx.search(text):
            return precision
    return "unknown"


def nvjet_precision(name: str) -> str:
    """The precision of a cuBLAS ``nvjet`` kernel from its type letters (``unknown``: none).

    >>> nvjet_precision("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NNN")
    'float16'
    """
    m = _NVJET.search(name)
    if not m:
        return "unknown"
    qq, a, _compute, _out, tf32 = m.groups()
    if qq:
        return "float8"
    if tf32:
        return "tf32"
    return _NVJET_LETTERS.get(a, "unknown")


def match(kernel_name: str) -> KernelPattern | None:
    """The first pattern of :data:`PATTERNS` whose regex matches the name (None: no family)."""
    for p in PATTERNS:
        if p.compiled.search(kernel_name):
            return p
    return None


def kernel_kind(pattern: KernelPattern, name: str) -> str:
    """The kind of a kernel of ``pattern`` (a ``gemm_or_conv`` family: ``conv`` when the name has a
    convolution word, else ``gemm``)."""
    if pattern.kind != "gemm_or_conv":
        return pattern.kind
    return "conv" if _CONV_WORDS.search(name) else "gemm"


def pattern(pattern_id: str) -> KernelPattern:
    """The pattern with this id (KeyError when there is none)."""
    return _BY_ID[pattern_id]


def pattern_table() -> list[dict[str, str]]:
    """:data:`PATTERNS` as rows (id, library, regex, precision, tensor_core, kind, types_from,
    example, source), in matching order."""
    return [
        {
            "id": p.id,
            "library": p.library,
            "regex": p.regex,
            "precision": p.precision,
            "tensor_core": p.tensor_core,
            "kind": p.kind,
            "types_from": p.types_from,
            "example": p.example,
            "source": p.source,
        }
        for p in PATTERNS
    ]
