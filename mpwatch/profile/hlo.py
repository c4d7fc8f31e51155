"""A compiled XLA program's HLO, as the trace's metadata plane keeps it (``HloProto``).

:func:`parse_module` reads one ``HloProto`` (the wire format directly, like
:mod:`mpwatch.profile.xplane`: field numbers of ``xla/service/hlo.proto`` and
``xla/xla_data.proto``) into an :class:`HloModule`: every instruction of every computation with
what decides its precision and owner: opcode, result element types, operands, the computations it
calls (a fusion's fused computation), a custom call's target, the dot/convolution precision
config, and the framework op name of its metadata. :func:`hlo_modules` gives every program of a
decoded trace.

Example (needs a trace):
    >>> from mpwatch.profile import hlo, xplane  # doctest: +SKIP
    >>> mods = hlo.hlo_modules(xplane.read_xspace("host.xplane.pb"))  # doctest: +SKIP
    >>> m = mods["jit_train_step(10607)"]  # doctest: +SKIP
    >>> m.by_name["cudnn-conv-bias-activation.12"].custom_call_target  # doctest: +SKIP
    '__cudnn$convBiasActivationForward'
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from mpwatch.profile.xplane import (
    ELEMENT_TYPES,
    METADATA_PLANE,
    XSpace,
    XSpaceError,
    _fields,
    _packed_ints,
    _text,
)

__all__ = ["HloInstruction", "HloModule", "parse_module", "hlo_modules", "FLOAT_TYPES"]

#: HLO element types that are floating point
FLOAT_TYPES = frozenset(
    {"f16", "bf16", "f32", "f64", "f8e5m2", "f8e4m3fn", "f8e4m3b11fnuz", "f8e5m2fnuz", "f8e4m3fnuz"}
)
#: PrecisionConfig.Algorithm numbers -> names (xla_data.proto)
ALGORITHMS = {
    0: "ALG_UNSET",
    1: "ALG_DOT_ANY_F8_ANY_F8_F32",
    2: "ALG_DOT_ANY_F8_ANY_F8_F32_FAST_ACCUM",
    3: "ALG_DOT_F16_F16_F16",
    4: "ALG_DOT_F16_F16_F32",
    5: "ALG_DOT_BF16_BF16_BF16",
    6: "ALG_DOT_BF16_BF16_F32",
    7: "ALG_DOT_BF16_BF16_F32_X3",
    8: "ALG_DOT_BF16_BF16_F32_X6",
    9: "ALG_DOT_TF32_TF32_F32",
    10: "ALG_DOT_TF32_TF32_F32_X3",
    11: "ALG_DOT_F32_F32_F32",
    12: "ALG_DOT_F64_F64_F64",
    13: "ALG_DOT_BF16_BF16_F32_X9",
}


@dataclass
class HloInstruction:
    """One HLO instruction.

    ``types``: the element types of its result (a tuple's members flattened; ``dtype`` the first,
    or ``tuple``); ``operand_ids``/``called_ids``: instruction and computation ids;
    ``operand_precision``: the precision config (0 DEFAULT, 1 HIGH, 2 HIGHEST) of a dot or
    convolution; ``algorithm``: its PrecisionConfig algorithm name (``ALG_UNSET`` when none).
    """

    id: int
    name: str
    opcode: str
    op_name: str = ""
    dtype: str = ""
    types: tuple[str, ...] = ()
    elements: int = 0
    operand_ids: tuple[int, ...] = ()
    called_ids: tuple[int, ...] = ()
    custom_call_target: str = ""
    operand_precision: tuple[int, ...] = ()
    algorithm: str = "ALG_UNSET"
    computation: int = -1


@dataclass
class HloModule:
    """A program's instructions by id and by name, its computations (id -> instruction ids), its
    entry computation's id and, for a scheduled program, each computation's instructions in the
    order they run (``schedule``)."""

    name: str
    instructions: dict[int, HloInstruction] = field(default_factory=dict)
    computations: dict[int, list[int]] = field(default_factory=dict)
    computation_names: dict[int, str] = field(default_factory=dict)
    entry: int = -1
    schedule: dict[int, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.by_name: dict[str, HloInstruction] = {}

    def index(self) -> None:
        self.by_name = {i.name: i for i in self.instructions.values()}

    def operands(self, instr: HloInstruction) -> list[HloInstruction]:
        """The instructions ``instr`` reads."""
        return [self.instructions[i] for i in instr.operand_ids if i in self.instructions]

    def inside(self, instr: HloInstruction) -> list[HloInstruction]:
        """Every instruction of the computations ``instr`` calls, nested ones included (a
        fusion's fused computation, a Triton GEMM fusion's nested one)."""
        out: list[HloInstruction] = []
        seen: set[int] = set()
        stack = list(instr.called_ids)
        while stack:
            cid = stack.pop()
            if cid in seen:
                continue
            seen.add(cid)
            for iid in self.computations.get(cid, []):
                inner = self.instructions[iid]
                out.append(inner)
                stack.extend(inner.called_ids)
        return out

    def source(self, instr: HloInstruction, depth: int = 8) -> HloInstruction:
        """The instruction a value comes from through ``copy``, ``bitcast`` and
        ``get-tuple-element`` (a parameter, a fusion, ...)."""
        while depth > 0 and instr.opcode in ("copy", "bitcast", "get-tuple-element"):
            ops = self.operands(instr)
            if not ops:
                break
            instr, depth = ops[0], depth - 1
        return instr


def _shape(buf: bytes) -> tuple[list[str], int]:
    """(element types, flattened; elements of the first array)."""
    etype, dims, subs = "", [], []
    for num, _, v in _fields(buf):
        if num == 2:
            etype = ELEMENT_TYPES.get(v, str(v))
        elif num == 3:
            dims.extend(_packed_ints(v))
        elif num == 4:
            subs.append(v)
    if etype == "tuple" or subs:
        types: list[str] = []
        elements = 0
        for sub in subs:
            t, n = _shape(sub)
            types.extend(t)
            elements += n
        return types, elements
    n = 1
    for d in dims:
        n *= max(int(d), 0)
    return [etype], n


def _instruction(buf: bytes, computation: int) -> HloInstruction:
    instr = HloInstruction(id=-1, name="", opcode="", computation=computation)
    operands: list[int] = []
    called: list[int] = []
    for num, _, v in _fields(buf):
        if num == 1:
            instr.name = _text(v)
        elif num == 2:
            instr.opcode = _text(v)
        elif num == 3:
            types, elements = _shape(v)
            instr.types = tuple(types)
            instr.elements = elements
            instr.dtype = "tuple" if len(types) != 1 else types[0]
        elif num == 7:
            for n2, _, v2 in _fields(v):
                if n2 == 2:
                    instr.op_name = _text(v2)
        elif num == 28:
            instr.custom_call_target = _text(v)
        elif num == 35:
            instr.id = v
        elif num == 36:
            operands.extend(_packed_ints(v))
        elif num == 38:
            called.extend(_packed_ints(v))
        elif num == 51:
            precision: list[int] = []
            for n2, _, v2 in _fields(v):
                if n2 == 1:
                    precision.extend(_packed_ints(v2))
                elif n2 == 2:
                    instr.algorithm = ALGORITHMS.get(v2, str(v2))
            instr.operand_precision = tuple(precision)
    instr.operand_ids = tuple(operands)
    instr.called_ids = tuple(called)
    return instr


def parse_module(blob: bytes | memoryview, name: str = "") -> HloModule:
    """An ``HloProto`` (the metadata plane's ``Hlo Proto`` stat) as an :class:`HloModule`."""
    module_buf = next((v for num, _, v in _fields(blob) if num == 1), b"")
    module = HloModule(name=name)
    entry_name = ""
    for num, _, v in _fields(module_buf):
        if num == 1 and not module.name:
            module.name = _text(v)
        elif num == 2:
            entry_name = _text(v)
        elif num == 6:
            module.entry = v
        elif num == 7:  # HloScheduleProto: computation id -> instruction ids in run order
            for n2, _, v2 in _fields(v):
                if n2 != 1:
                    continue
                key, ids = 0, []
                for n3, _, v3 in _fields(v2):
                    if n3 == 1:
                        key = v3
                    elif n3 == 2:
                        for n4, _, v4 in _fields(v3):
                            if n4 == 1:
                                ids.extend(_packed_ints(v4))
                module.schedule[key] = ids
        elif num == 3:
            cid, cname, bufs = None, "", []
            for n2, _, v2 in _fields(v):
                if n2 == 2:
                    bufs.append(v2)
                elif n2 == 5:
                    cid = v2
                elif n2 == 1:
                    cname = _text(v2)
            cid = cid if cid is not None else -len(module.computations) - 1
            ids = []
            for b in bufs:
                instr = _instruction(b, cid)
                if instr.id < 0:
                    instr.id = -(len(module.instructions) + 1) * 1000003
                module.instructions[instr.id] = instr
                ids.append(instr.id)
            module.computations[cid] = ids
            module.computation_names[cid] = cname
    if module.entry < 0 and entry_name:
        module.entry = next((c for c, n in module.computation_names.items() if n == entry_name), -1)
    module.index()
    return module


def _programs(space: XSpace) -> Iterator[tuple[str, bytes]]:
    plane = space.plane(METADATA_PLANE)
    if plane is None:
        return
    for name, stats in plane.metadata_stats.items():
        blob = stats.get("Hlo Proto")
        if isinstance(blob, bytes) and blob:
            yield name, blob


def hlo_modules(
    space: XSpace, programs: Callable[[str], bool] | None = None
) -> dict[str, HloModule]:
    """Every program of a trace (those ``programs(name)`` accepts, where given:
    :func:`mpwatch.profile.xplane.ran_programs`): ``program name (name(id)) -> HloModule``; an
    unreadable one is left out."""
    out: dict[str, HloModule] = {}
    for name, blob in _programs(space):
        if programs is not None and not programs(name):
            continue
        try:
            out[name] = parse_module(memoryview(blob), name)
        except (XSpaceError, IndexError, struct.error):
            continue
    return out
