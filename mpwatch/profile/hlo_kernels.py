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
from mpwatch.profile.kernel_classes import classify
from mpwatch.profile.step_parts import part_of_state

__all__ = [
    "HLO_COLUMNS",
    "TENSOR_CORE_MIN_CC",
    "HloReading",
    "compute_capability",
    "instruction_precision",
    "read_instruction",
    "kernel_instructions",
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
    op_names = tuple(dict.fromkeys(n for n in names if n))
    state = ""
    for o in module.operands(instr):
        part = part_of_state(module.source(o).op_name)
        if part:
            state = part
            break
    return HloReading(precision, math, types, tf32, converts, is_cast, op_names, state)


def _tensor_core(reading: HloReading, cc: tuple[int, int] | None, kernel: str) -> tuple[str, str]:
    """``(precision, tensor_core, why)`` of a kernel from its instruction and the device."""
    p = reading.precision
    if not reading.math:
        return p, "no", "no matrix math"
    name = classify(kernel, None, "")
    if name.kind in _HELPER_KINDS or (
        name.tensor_core == "no" and name.kind not in ("gemm", "conv") and name.pattern
    ):
        return p, "no", f"helper kernel of the {reading.math} ({name.kind or name.pattern})"
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


def _sanitized(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def kernel_instructions(
    spaces: Sequence[Any], modules: dict[str, HloModule]
) -> dict[str, dict[tuple[str, str], float]]:
    """GPU kernel name -> {(program, instruction name): device time in us} from the device
    planes' events: the event's ``hlo_op`` where it names an instruction of its program, else the
    instruction the kernel is named after."""
    by_base: dict[str, list[str]] = {}
    for key in modules:
        by_base.setdefault(xplane.module_base(key), []).append(key)
    sanitized: dict[str, dict[str, str]] = {}
    out: dict[str, dict[tuple[str, str], float]] = {}
    for space in spaces:
        for plane in space.device_planes:
            for line in plane.lines:
                for ev in line.events:
                    module = ev.stats.get("hlo_module")
                    if not module:
                        continue
                    pid = ev.stats.get("program_id")
                    key = f"{module}({pid})"
                    keys = [key] if key in modules else by_base.get(str(module), [])
                    for k in keys:
                        mod = modules[k]
                        hop = str(ev.stats.get("hlo_op") or "")
                        instr = mod.by_name.get(hop)
                        if instr is None:
                            table = sanitized.get(k)
                            if table is None:
                                table = {_sanitized(n): n for n in mod.by_name}
                                sanitized[k] = table
                            name = table.get(_sanitized(ev.name))
                            instr = mod.by_name.get(name) if name else None
                        if instr is not None:
                            per = out.setdefault(ev.name, {})
                            per[(k, instr.name)] = per.get((k, instr.name), 0.0) + (
                                ev.duration_ps / 1e6
                            )
                            break
    return out


def hlo_columns(table: pd.DataFrame, traces: Sequence[str]) -> pd.DataFrame:
    """``table`` (a kernel table) with :data:`HLO_COLUMNS`: each kernel's HLO instruction and
    what it says (empty where the trace has no HLO or the kernel no instruction). A row whose
    kernel ran several instructions takes the one whose op name is the row's, else the longest.
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
    found = kernel_instructions(spaces, modules)
    readings: dict[tuple[str, str], HloReading] = {}
    for i in out.index:
        kernel = str(out.at[i, "kernel_name"])
        cands = found.get(kernel)
        if not cands:
            continue
        row_op = str(out.at[i, "op_name"])
        same = {k: us for k, us in cands.items() if modules[k[0]].by_name[k[1]].op_name == row_op}
        prog, name = max((same or cands).items(), key=lambda kv: kv[1])[0]
        instr = modules[prog].by_name[name]
        reading = readings.get((prog, name))
        if reading is None:
            reading = read_instruction(modules[prog], instr)
            readings[(prog, name)] = reading
        precision, tc, why = _tensor_core(reading, cc, kernel)
        out.at[i, "hlo_program"] = prog
        out.at[i, "hlo_op"] = name
        out.at[i, "hlo_opcode"] = instr.opcode
        out.at[i, "hlo_precision"] = precision
        out.at[i, "hlo_math"] = reading.math
        out.at[i, "hlo_tensor_core"] = tc
        out.at[i, "hlo_tensor_core_why"] = why
        out.at[i, "hlo_is_cast"] = reading.is_cast
        out.at[i, "hlo_converts"] = reading.converts
        out.at[i, "hlo_op_names"] = reading.op_names
        out.at[i, "hlo_state_part"] = reading.state_part
    return out
