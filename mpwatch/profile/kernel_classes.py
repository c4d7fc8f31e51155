"""GPU kernel name → the precision it computed in and whether it ran on Tensor Cores.

xprof's ``kernel_stats`` table has a "Kernel uses TensorCore" column, but it is a substring match
of the kernel name against a list taken from NVIDIA PyProf in the Volta/Turing era
(``IsKernelUsingTensorCore`` in openxla/xprof ``xprof/utils/kernel_stats_utils.cc``; a maintainer
calls it a heuristic that "needs to be updated for Ampere and beyond", tensorflow/tensorflow#51812).
It misses ``sm80_/sm90_xmma_{fprop,dgrad,wgrad}_implicit_gemm*``, cuBLAS ``nvjet_*`` and CUTLASS
template names: on a real H100 trace of a ``mixed_float16`` convnet it marks 12.5% of device time
Tensor Core while 76% runs in float16 Tensor Core kernels. :func:`classify` reads the names
instead, with the pattern table :data:`mpwatch.profile.kernel_patterns.PATTERNS` (rendered in
``docs/kernels.md`` by :func:`render_markdown`), and takes xprof's flag as one more signal.

Where the trace holds the program's HLO (XLA: Keras on JAX, TensorFlow with ``jit_compile``) the
instruction each kernel runs decides instead (:mod:`mpwatch.profile.hlo_kernels`, issue 26): a
dot or convolution by its operand types and the GPU's compute capability, other XLA kernels by the
floating-point types they read and write (``mixed`` where 16- and 32-bit both, ``integer`` where
none); the name's reading is kept beside it as corroboration, and a disagreement is flagged. The
rules below are the name's.

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
from functools import lru_cache

from mpwatch.profile.kernel_patterns import (
    OTHER_TYPES,
    PATTERNS,
    SIXTEEN_BIT_PRECISIONS,
    TENSOR_CORE_PRECISIONS,
    TYPE_TOKENS,
    kernel_kind,
    match,
    nvjet_precision,
    precision_of_types,
)


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


@lru_cache(maxsize=4096)
def _from_name(kernel_name: str, op_name: str) -> KernelClass:
    pattern = match(kernel_name)
    if pattern is None:
        return UNKNOWN
    precision, source = "unknown", ""
    if pattern.types_from == "nvjet":
        precision = nvjet_precision(kernel_name)
    elif pattern.types_from == "name":
        precision = precision_of_types(kernel_name)
        if precision == "unknown" and OTHER_TYPES.search(kernel_name):
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
        kind=kernel_kind(pattern, kernel_name),
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


def render_markdown() -> str:
    """``docs/kernels.md``: the rules (this module's docstring) and the pattern table
    (:mod:`mpwatch.profile.kernel_patterns`), generated from the code."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    doc = __doc__ or ""
    intro = doc.split("\nExample:")[0].strip()
    intro = re.sub(  # Sphinx roles: names of this module get its path
        r":\w+:`([^`]+)`",
        lambda m: f"`{m[1] if '.' in m[1] else f'{__name__}.{m[1]}'}`",
        intro,
    )
    intro = intro.replace("``", "`")
    lines = [
        "# GPU kernels: precision and Tensor Core use",
        "",
        f"<!-- generated by {__name__}.render_markdown(); do not edit by hand -->",
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
    for precision, rx in TYPE_TOKENS:
        lines.append(f"- {precision}: `{rx.pattern}`")
    lines.append(f"- not in the list (precision unknown): `{OTHER_TYPES.pattern}`")
    lines.append("")
    return "\n".join(lines)
