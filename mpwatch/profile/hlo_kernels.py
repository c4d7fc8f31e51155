"""GPU kernel → the HLO instruction it runs → its precision, Tensor Core use and owner.

A kernel's name says little for XLA's own kernels (``loop_add_fusion``, ``input_reduce_fusion_4``,
``memcpy``); the instruction it runs says everything. The device plane's events carry the program
(``hlo_module``, ``program_id``) and, for a kernel launched by its own thunk, the instruction
(``hlo_op``: ``cudnn-conv-bw-filter.9``, ``input_reduce_fusion.1``); inside a CUDA graph
(``hlo_op`` ``command_buffer_N``) a fusion's kernel is named after its instruction
(``input_reduce_fusion_4`` for ``input_reduce_fusion.4``). :func:`hlo_columns` adds to a
:func:`~mpwatch.profile.traces.kernel_table` what that instruction says:

- **precision** (:func:`instruction_precision`): a dot or convolution (a cuBLAS/cuDNN custom
  call, or a fusion with one inside: Triton GEMM fusions) by its operands' element types; other
  work by the floating-point element types it reads and writes (scalars aside): ``float16``,
  ``bfloat16``, ``float32``, ``mixed`` (16- and 32-bit both), ``integer`` (no floating point);
  a float32 dot whose precision config allows TF32 on a GPU that has it is ``tf32``.
- **Tensor Core use**: matrix math in float16 (compute capability 7.0+), bfloat16 or TF32 (8.0+),
  float8 (8.9+), int8 (7.2+) runs on Tensor Cores; the helper kernels of a library call (cuDNN's
  padding, split-K sums, memsets: told by their names) and all other work do not; ``why`` says.
- **owner**: the op names of the instruction's metadata and of the instructions fused into it
  (:mod:`mpwatch.profile.step_parts` and the layer join decide in
  :func:`mpwatch.profile.kernel_time.classify_kernels`), and the train step's arguments it reads.
- **casts**: float→float ``convert`` instructions inside it; ``is_cast`` when it does nothing else
  (beside moving data).

Example (needs xprof and a GPU trace):
    >>> from mpwatch.profile import traces  # doctest: +SKIP
    >>> table = traces.kernel_table("logs/run1")  # hlo_columns is applied there  # doctest: +SKIP
    >>> table[["kernel_name", "hlo_op", "hlo_precision", "hlo_tensor_core"]]  # doctest: +SKIP
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from mpwatch.profile import xplane
from mpwatch.profile.hlo import FLOAT_TYPES, HloInstruction, HloModule, hlo_modules
from mpwatch.profile.hlo_events import kernel_instructions
from mpwatch.profile.kernel_classes import classify
from mpwatch.profile.step_parts import part_of_state

__all__ = [
    "HLO_COLUMNS",
    "TENSOR_CORE_MIN_CC",
    "HloReading",
    "compute_capability",
    "instruction_precision",
    "read_instruction",
    "hlo_columns",
]

#: columns :func:`hlo_columns` adds to a kernel table
HLO_COLUMNS = [
    "hlo_program",
    "hlo_op",
    "hlo_opcode",
    "hlo_precision",
    "hlo_math",
    "hlo_tensor_core",
    "hlo_tensor_core_why",
    "hlo_is_cast",
    "hlo_converts",
    "hlo_op_names",
    "hlo_state_part",
]
#: the compute capability from which Tensor Cores run each precision
TENSOR_CORE_MIN_CC = {
    "float16": (7, 0),
    "int8": (7, 2),
    "bfloat16": (8, 0),
    "tf32": (8, 0),
    "float8": (8, 9),
}
_SIXTEEN = {"f16": "float16", "bf16": "bfloat16"}
_MATMUL_CALL = re.compile(r"cublas|\$gemm|matmul|cudnn\$conv|cudnn\$fmha|cudnn\$fusion|triton_gemm")
_DATA_MOVES = frozenset(
    {
        "parameter",
        "constant",
        "bitcast",
        "copy",
        "transpose",
        "pad",
        "broadcast",
        "reshape",
        "slice",
        "dynamic-slice",
        "concatenate",
        "tuple",
        "get-tuple-element",
        "iota",
    }
)
_HELPER_KINDS = frozenset({"helper", "reduction", "copy", "memset", "memcpy"})
_SM = re.compile(r"(?<![a-z0-9])sm_?(\d)(\d)(?![0-9])")


@dataclass
class HloReading:
    """What an instruction says of the kernel that runs it (see the module's docstring)."""

    precision: str
    math: str  # "dot", "conv" or ""
    operand_types: tuple[str, ...]
    tf32_allowed: bool
    converts: int
    is_cast: bool
    op_names: tuple[str, ...]
    state_part: str


def compute_capability(
    spaces: Iterable[Any], kernel_names: Iterable[str] = ()
) -> tuple[tuple[int, int] | None, str]:
    """``((major, minor), where)`` of the traced GPU: the device plane's ``compute_cap_major`` and
    ``compute_cap_minor`` stats (``where`` ``"trace"``), else the highest ``smXY`` of the kernel
    names (``"kernel names"``: a lower bound), else ``(None, "")``."""
    for space in spaces:
        for plane in space.device_planes:
            major, minor = (
                plane.stats.get("compute_cap_major"),
                plane.stats.get("compute_cap_minor"),
            )
            if isinstance(major, int) and major > 0:
                return (int(major), int(minor or 0)), "trace"
    found = [(int(a), int(b)) for n in kernel_names for a, b in _SM.findall(str(n).lower())]
    return (max(found), "kernel names") if found else (None, "")


def _precision_of(types: Iterable[str]) -> str:
    floats = {t for t in types if t in FLOAT_TYPES}
    if not floats:
        return "integer" if any(t for t in types if t not in ("tuple", "token", "")) else "unknown"
    if any(t.startswith("f8") for t in floats):
        return "float8"
    widths = {_SIXTEEN.get(t, "float32" if t == "f32" else "other") for t in floats}
    if widths == {"float16"} or widths == {"bfloat16"}:
        return next(iter(widths))
    if widths == {"float32"}:
        return "float32"
    if "other" in widths:  # f64
        return "unknown"
    return "mixed"


def _tf32_allowed(instr: HloInstruction) -> bool:
    """A float32 dot/convolution may run at TF32: its precision config is DEFAULT or HIGH (XLA's
    GPU backend runs those at TF32) and no algorithm asks for full float32."""
    if instr.algorithm not in ("ALG_UNSET", ""):
        return "TF32" in instr.algorithm
    return all(p <= 1 for p in instr.operand_precision)


def instruction_precision(module: HloModule, instr: HloInstruction) -> tuple[str, str, tuple, bool]:
    """``(precision, math, operand types, tf32_allowed)`` of an instruction: see the module's
    docstring. ``precision`` for float32 matrix math is ``float32`` here (TF32 needs the
    device: :func:`read_instruction`)."""
    inner = [instr, *module.inside(instr)]
    for i in inner:
        if i.opcode in ("dot", "convolution") or (
            i.opcode == "custom-call" and _MATMUL_CALL.search(i.custom_call_target)
        ):
            types = tuple(o.dtype for o in module.operands(i)[:2])
            math = "conv" if ("conv" in i.opcode or "conv" in i.custom_call_target) else "dot"
            if all(t in ("s8", "u8") for t in types) and types:
                return "int8", math, types, False
            return _precision_of(types), math, types, _tf32_allowed(i)
    reads = [o for o in module.operands(instr)]
    sized = [o for o in reads if o.elements > 1]
    types = [t for o in (sized or reads) for t in o.types]
    types += list(instr.types) if instr.elements > 1 or not sized else list(instr.types)
    return _precision_of(types), "", tuple(types), False


def read_instruction(module: HloModule, instr: HloInstruction) -> HloReading:
    """Everything :func:`hlo_columns` keeps of one instruction (device-independent)."""
    precision, math, types, tf32 = instruction_precision(module, instr)
    inner = [instr, *module.inside(instr)]
    converts = 0
    for i in inner:
        if i.opcode == "convert" and i.dtype in FLOAT_TYPES:
            src = module.operands(i)
            if src and src[0].dtype in FLOAT_TYPES and src[0].dtype != i.dtype:
                converts += 1
    work = {i.opcode for i in inner if i.opcode not in _DATA_MOVES and i.opcode != "fusion"}
    is_cast = converts > 0 and work <= {"convert"}
    names = [instr.op_name] + [i.op_name for i in module.inside(instr)]
    if not any(names) and instr.opcode in ("copy", "transpose", "bitcast"):
        # a copy XLA added (no op name): it belongs to what it copies
        src = module.source(instr)
        names = [src.op_name] + [i.op_name for i in module.inside(src)]
    op_names = tuple(dict.fromkeys(n for n in names if n))
    state = ""
    for o in module.operands(instr):
        part = part_of_state(module.source(o).op_name)
        if part:
            state = part
            break
    return HloReading(precision, math, types, tf32, converts, is_cast, op_names, state)


def _tensor_core(
    reading: HloReading, cc: tuple[int, int] | None, kernel: str
) -> tuple[str, str, str]:
    """``(precision, tensor_core, why)`` of a kernel from its instruction and the device; where
    the library ran a CUDA-core kernel for the matrix math (its name says SIMT), the name's no."""
    p = reading.precision
    if not reading.math:
        return p, "no", "no matrix math"
    name = classify(kernel, None, "")
    if name.kind in _HELPER_KINDS or (
        name.tensor_core == "no" and name.kind not in ("gemm", "conv") and name.pattern
    ):
        return p, "no", f"helper kernel of the {reading.math} ({name.kind or name.pattern})"
    if name.tensor_core == "no" and name.kind in ("gemm", "conv"):
        # the library picked a CUDA-core kernel (SIMT, sgemm): the name tells what ran
        return (
            p,
            "no",
            (
                f"{p} operands, but a CUDA-core {name.kind} kernel ran ({name.pattern}: dimensions "
                "or alignment the library's Tensor Core kernels did not take)"
            ),
        )
    if p == "float32":
        if reading.tf32_allowed and cc is not None and cc >= TENSOR_CORE_MIN_CC["tf32"]:
            return "tf32", "yes", "float32 operands at TF32 (precision config allows it)"
        if cc is None and reading.tf32_allowed:
            return p, "unknown", "float32 operands: TF32 depends on the GPU (unknown)"
        return (
            p,
            "no",
            (
                "float32 operands, TF32 not allowed by the precision config"
                if not reading.tf32_allowed
                else "float32 operands on a GPU without TF32 (compute capability < 8.0)"
            ),
        )
    need = TENSOR_CORE_MIN_CC.get(p)
    if need is None:
        return p, "no", f"{p} operands ({', '.join(reading.operand_types)})"
    if cc is None:
        return p, "unknown", f"{p} operands; the GPU's compute capability is unknown"
    if cc >= need:
        return p, "yes", f"{p} operands on compute capability {cc[0]}.{cc[1]}"
    return p, "no", f"{p} operands need compute capability {need[0]}.{need[1]}+"


def hlo_columns(table: pd.DataFrame, traces: Sequence[str]) -> pd.DataFrame:
    """``table`` (a kernel table) with :data:`HLO_COLUMNS`: each kernel's HLO instruction and
    what it says (empty where the trace has no HLO or the kernel no instruction). A row whose
    kernel ran several instructions (a fusion kernel XLA reuses for identical fusions, a memcpy
    kernel for several copies) is split, one row per instruction with its share of the time; a
    row whose op name is xprof's keeps the instructions of that op name (else the longest). The
    op name of a row xprof named no op (``XlaModule``) becomes its instruction's.
    ``attrs["compute_capability"]``: ``"9.0"`` (``""`` unknown);
    ``attrs["compute_capability_from"]``: where it came from."""
    out = table.copy()
    for col in HLO_COLUMNS:
        out[col] = [() if col == "hlo_op_names" else "" for _ in range(len(out))]
    out["hlo_is_cast"] = False
    out["hlo_converts"] = 0
    try:
        spaces = [xplane.read_xspace(t, xplane.metadata_and_devices) for t in traces]
    except (xplane.XSpaceError, OSError):
        return out
    modules: dict[str, HloModule] = {}
    for space in spaces:
        modules.update(hlo_modules(space))
    cc, cc_from = compute_capability(spaces, out["kernel_name"] if len(out) else ())
    out.attrs["compute_capability"] = f"{cc[0]}.{cc[1]}" if cc else ""
    out.attrs["compute_capability_from"] = cc_from
    if not modules or not len(out):
        return out
    try:
        return _with_hlo(out, spaces, modules, cc)
    except (KeyError, IndexError, ValueError, TypeError) as e:  # an HLO this reader misreads
        out.attrs["hlo_note"] = f"the HLO could not be joined to the kernels: {e!r}"
        return out


def _with_hlo(
    out: pd.DataFrame, spaces: Sequence[Any], modules: dict[str, HloModule], cc: Any
) -> pd.DataFrame:
    found = kernel_instructions(spaces, modules)
    readings: dict[tuple[str, str], HloReading] = {}
    rows: list[dict[str, Any]] = []
    for _, row in out.iterrows():
        kernel = str(row["kernel_name"])
        launches = found.get(kernel) or {}
        # the launches of this row's grid and block (xprof's rows are kernel, op and launch shape)
        shape = (str(row.get("grid_dim", "")), str(row.get("block_dim", "")))
        fitting = {k: us for k, us in launches.items() if (k[2], k[3]) == shape} or launches
        cands: dict[tuple[str, str], float] = {}
        for k, us in fitting.items():
            cands[(k[0], k[1])] = cands.get((k[0], k[1]), 0.0) + us
        if not cands:
            rows.append(row.to_dict())
            continue
        if row.get("op_name_from") == "xprof":  # xprof's op name picks the instruction(s)
            op = str(row["op_name"])
            same = {k: us for k, us in cands.items() if _own(modules[k[0]].by_name[k[1]]) == op}
            cands = same or {max(cands.items(), key=lambda kv: kv[1])[0]: 1.0}
        weight = sum(cands.values())
        for (prog, name), us in sorted(cands.items(), key=lambda kv: -kv[1]):
            instr = modules[prog].by_name[name]
            reading = readings.get((prog, name))
            if reading is None:
                reading = read_instruction(modules[prog], instr)
                readings[(prog, name)] = reading
            rows.append(_with_instruction(row, prog, instr, reading, cc, us / weight))
    frame = pd.DataFrame(rows, columns=list(out.columns))
    frame.attrs.update(out.attrs)
    return frame


def _own(instr: HloInstruction) -> str:
    return instr.op_name


def _with_instruction(
    row: pd.Series,
    prog: str,
    instr: HloInstruction,
    reading: HloReading,
    cc: tuple[int, int] | None,
    share: float,
) -> dict[str, Any]:
    """A kernel table row for the part of its kernel's time ``instr`` ran (``share`` of it)."""
    out = row.to_dict()
    if share < 1.0:  # a kernel several instructions ran (a reused fusion kernel, copies)
        for col in ("total_duration_us",):
            out[col] = float(out[col]) * share
        out["occurrences"] = max(1, int(round(int(out["occurrences"]) * share)))
    if out.get("op_name_from") != "xprof" and reading.op_names:
        fused = set(reading.op_names)
        own = instr.op_name or (next(iter(fused)) if len(fused) == 1 else "")
        if own:
            out["op_name"], out["op_name_from"] = own, "hlo"
    precision, tc, why = _tensor_core(reading, cc, str(row["kernel_name"]))
    out.update(
        hlo_program=prog,
        hlo_op=instr.name,
        hlo_opcode=instr.opcode,
        hlo_precision=precision,
        hlo_math=reading.math,
        hlo_tensor_core=tc,
        hlo_tensor_core_why=why,
        hlo_is_cast=reading.is_cast,
        hlo_converts=reading.converts,
        hlo_op_names=reading.op_names,
        hlo_state_part=reading.state_part,
    )
    return out
