"""GPU kernel name → the precision it computed in and whether it ran on Tensor Cores.

xprof's ``kernel_stats`` table has a "Kernel uses TensorCore" column, but it is a substring match
of the kernel name against a list taken from NVIDIA PyProf in the Volta/Turing era
(``IsKernelUsingTensorCore`` in openxla/xprof ``xprof/utils/kernel_stats_utils.cc``; a maintainer
calls it a heuristic that "needs to be updated for Ampere and beyond", tensorflow/tensorflow#51812).
It misses ``sm80_/sm90_xmma_{fprop,dgrad,wgrad}_implicit_gemm*``, cuBLAS ``nvjet_*`` and CUTLASS
template names: on a real H100 trace of a ``mixed_float16`` convnet it marks 12.5% of device time
Tensor Core while 76% runs in float16 Tensor Core kernels. :func:`classify` reads the names
instead, with the pattern table :data:`PATTERNS` (rendered in ``docs/kernels.md`` by
:func:`render_markdown`), and takes xprof's flag as one more signal.

Rules:

- **precision** is one of ``float32, tf32, float16, bfloat16, float8, int8, unknown``: the data type
  the kernel's arithmetic reads (for a GEMM the A/B operands, not the accumulator). It comes from
  the type tokens of the name (``f16``, ``bf16``, ``tf32``, ``e4m3``, ``half_t``, ``__half``…, the
  narrowest type named wins: an ``f16f16_f16f32`` kernel is float16), or from the family when the
  family fixes it (``sgemm`` is float32). A name that says nothing stays ``unknown``; so do types
  outside the list (float64, int4).
- **tensor_core** is ``yes``, ``no`` or ``unknown``. ``yes`` for the Tensor Core families
  (``xmma`` with a 16-bit/TF32/FP8/INT8 type, CUTLASS ``tensorop``, ``hmma``/``imma``/``wgmma``,
  MMA instruction shapes ``884/1688/16816/16832``, cuBLAS ``nvjet`` with a 16-bit/FP8/TF32 code);
  ``no`` for families that cannot use them (SIMT ``sgemm``/``scudnn``/``ffma``, CUTLASS ``simt``,
  GEMV, split-K reductions, XLA loop/reduction fusions, copies, framework element-wise kernels).
- **xprof's flag**: a ``True`` from xprof makes ``tensor_core`` ``yes`` (its list only holds Tensor
  Core instruction names); a ``False`` changes nothing (it misses most Ampere/Hopper names).
- **op name**: for XLA fusions (``gemm_fusion_*``, ``triton_*``, ``loop_*_fusion``,
  ``input_*_fusion``) the kernel name carries no type; the precision is read from HLO types in the
  op name (``f16[128,64]``) when there are any, else it stays ``unknown``.

Ground truth, where a GPU is at hand, is Nsight Compute's ``sm__inst_executed_pipe_tensor.sum`` per
kernel; the table is what the names say.

Example:
    >>> c = classify("sm80_xmma_fprop_implicit_gemm_indexed_f16f16_f16f32_f32_nhwckrsc_nhwc")
    >>> (c.precision, c.tensor_core, c.pattern)
    ('float16', 'yes', 'xmma')
    >>> classify("ampere_sgemm_128x64_nn").precision, classify("ampere_sgemm_128x64_nn").tensor_core
    ('float32', 'no')
    >>> c = classify("loop_add_fusion_3")
    >>> (c.precision, c.tensor_core)
    ('unknown', 'no')
    >>> classify("my_custom_kernel").precision, classify("my_custom_kernel").tensor_core
    ('unknown', 'unknown')
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache, lru_cache

PRECISIONS = ("float32", "tf32", "float16", "bfloat16", "float8", "int8", "unknown")
TENSOR_CORE = ("yes", "no", "unknown")
#: precisions that count as 16-bit compute (float8 and int8 are narrower, not "16-bit")
SIXTEEN_BIT_PRECISIONS = frozenset({"float16", "bfloat16"})
#: precisions Tensor Cores compute in (Volta: float16; Ampere+: bfloat16, tf32, int8; Hopper: fp8)
TENSOR_CORE_PRECISIONS = frozenset({"float16", "bfloat16", "tf32", "float8", "int8"})

# Type tokens in kernel names, narrowest first: the first that matches names the precision.
# Case-sensitive on purpose: mangled names use upper-case substitutions (``S8_``) that must not read
# as ``s8`` (int8).
_TYPE_TOKENS: tuple[tuple[str, re.Pattern[str]], ...] = (
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
_OTHER_TYPES = re.compile(r"f64|fp64|double|dgemm|zgemm|cgemm|int4|i8832|i16864")

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


@dataclass(frozen=True)
class KernelClass:
    """What a kernel name says: precision, Tensor Core use, the pattern that matched.

    ``evidence``: where ``tensor_core`` came from (``name``, ``xprof``, ``name+xprof``, or ``""``
    when it is unknown). ``precision_from``: ``name`` (the kernel name), ``op`` (HLO types in the op
    name), ``family`` (the family fixes it, e.g. sgemm) or ``""`` (unknown).
    """

    precision: str
    tensor_core: str
    pattern: str = ""
    library: str = ""
    kind: str = "unknown"
    evidence: str = ""
    precision_from: str = ""

    @property
    def is_16bit(self) -> bool:
        """float16 or bfloat16 (known; an unknown precision is never 16-bit)."""
        return self.precision in SIXTEEN_BIT_PRECISIONS


UNKNOWN = KernelClass("unknown", "unknown")


def precision_of_types(text: str, hlo: bool = False) -> str:
    """The narrowest precision whose type token appears in ``text`` (``unknown`` when none).

    >>> precision_of_types("f16f16_f16f32_f32")
    'float16'
    >>> precision_of_types("f32f32_tf32f32_f32")
    'tf32'
    >>> precision_of_types("fusion(bf16[128,64] x, f32[64] y)", hlo=True)
    'bfloat16'
    """
    for precision, rx in _HLO_TYPES if hlo else _TYPE_TOKENS:
        if rx.search(text):
            return precision
    return "unknown"


def _nvjet(name: str) -> str:
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


def _kind(pattern: KernelPattern, name: str) -> str:
    if pattern.kind != "gemm_or_conv":
        return pattern.kind
    return "conv" if _CONV_WORDS.search(name) else "gemm"


@lru_cache(maxsize=4096)
def _from_name(kernel_name: str, op_name: str) -> KernelClass:
    pattern = match(kernel_name)
    if pattern is None:
        return UNKNOWN
    precision, source = "unknown", ""
    if pattern.types_from == "nvjet":
        precision = _nvjet(kernel_name)
    elif pattern.types_from == "name":
        precision = precision_of_types(kernel_name)
        if precision == "unknown" and _OTHER_TYPES.search(kernel_name):
            precision = "out_of_list"
    if pattern.types_from == "op" or precision == "unknown":
        from_op = precision_of_types(op_name, hlo=True) if op_name else "unknown"
        if from_op != "unknown":
            precision, source = from_op, "op"
    if precision not in ("unknown", "out_of_list") and not source:
        source = "name"
    if precision == "unknown" and pattern.precision != "unknown":
        precision, source = pattern.precision, "family"
    if precision == "out_of_list":
        precision = "unknown"
    tc = pattern.tensor_core
    if tc == "typed":
        tc = "yes" if precision in TENSOR_CORE_PRECISIONS else "unknown"
    if pattern.id == "xmma" and precision == "float32":
        tc = "unknown"  # f32 xmma without the ffma token: not decided by the name
    return KernelClass(
        precision=precision,
        tensor_core=tc,
        pattern=pattern.id,
        library=pattern.library,
        kind=_kind(pattern, kernel_name),
        evidence="name" if tc != "unknown" else "",
        precision_from=source if precision != "unknown" else "",
    )


def classify(
    kernel_name: str, xprof_tensor_core: bool | None = None, op_name: str = ""
) -> KernelClass:
    """Precision and Tensor Core use of one GPU kernel, from its name (see the module docstring).

    ``xprof_tensor_core``: xprof's "Kernel uses TensorCore" for the kernel (None: not known). A
    ``True`` makes ``tensor_core`` ``"yes"``; a ``False`` never overrides the name. ``op_name``: the
    framework op the kernel belongs to; its HLO types (``f16[...]``) give the precision of XLA
    fusions, whose names carry none.

    >>> classify("sm90_xmma_dgrad_implicit_gemm_indexed_f16f16_f16f32_f32", False).tensor_core
    'yes'
    >>> c = classify("some_kernel", xprof_tensor_core=True)
    >>> (c.precision, c.tensor_core, c.evidence)
    ('unknown', 'yes', 'xprof')
    """
    base = _from_name(str(kernel_name), str(op_name or ""))
    if xprof_tensor_core is True or (
        xprof_tensor_core is not None
        and not isinstance(xprof_tensor_core, bool)
        and str(xprof_tensor_core).lower() == "true"
    ):
        evidence = "name+xprof" if base.tensor_core == "yes" else "xprof"
        return KernelClass(
            base.precision,
            "yes",
            base.pattern,
            base.library,
            base.kind,
            evidence,
            base.precision_from,
        )
    return base


def classify_many(
    kernel_names: Iterable[str],
    xprof_tensor_core: Iterable[bool | None] | None = None,
    op_names: Iterable[str] | None = None,
) -> list[KernelClass]:
    """:func:`classify` over parallel sequences (``None`` for a missing column)."""
    names = list(kernel_names)
    flags = list(xprof_tensor_core) if xprof_tensor_core is not None else [None] * len(names)
    ops = list(op_names) if op_names is not None else [""] * len(names)
    return [classify(n, f, o) for n, f, o in zip(names, flags, ops)]


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


def render_markdown() -> str:
    """``docs/kernels.md``: the rules and the pattern table, generated from this module."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    doc = __doc__ or ""
    intro = doc.split("\nExample:")[0].strip()
    intro = re.sub(r":\w+:`([^`]+)`", r"`mpwatch.kernels.\1`", intro)  # Sphinx roles
    intro = intro.replace("``", "`")
    lines = [
        "# GPU kernels: precision and Tensor Core use",
        "",
        "<!-- generated by mpwatch.kernels.render_markdown(); do not edit by hand -->",
        "",
        intro,
        "",
        "## Patterns, in matching order",
        "",
        "The first pattern whose regular expression matches the kernel name (`re.search`) "
        "decides. *precision*: the value when the name's type tokens say nothing (`unknown`: only "
        "the tokens decide); *types from*: `name` (type tokens of the kernel name), `op` (HLO "
        "types in the op name), `nvjet` (cuBLAS' type letters); *Tensor Core*: `typed` = yes for "
        "a Tensor Core "
        "type (float16, bfloat16, tf32, float8, int8), else unknown.",
        "",
        "| id | library | precision | Tensor Core | kind | types from | example | source |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in PATTERNS:
        lines.append(
            f"| `{p.id}` | {cell(p.library)} | {p.precision} | {p.tensor_core} | {p.kind} | "
            f"{p.types_from} | `{cell(p.example)}` | {cell(p.source)} |"
        )
    lines += [
        "",
        "## Regular expressions",
        "",
    ]
    for p in PATTERNS:
        lines.append(f"- `{p.id}`: `{p.regex}`")
    lines += [
        "",
        "## Type tokens, narrowest first",
        "",
    ]
    for precision, rx in _TYPE_TOKENS:
        lines.append(f"- {precision}: `{rx.pattern}`")
    lines.append(f"- not in the list (precision unknown): `{_OTHER_TYPES.pattern}`")
    lines.append("")
    return "\n".join(lines)


def pattern(pattern_id: str) -> KernelPattern:
    """The pattern with this id (KeyError when there is none)."""
    return _BY_ID[pattern_id]
