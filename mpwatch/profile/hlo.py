"""A compiled XLA program's HLO, as the trace's metadata plane keeps it (``HloProto``).

:func:`parse_module` reads one ``HloProto`` (decoded by protobuf: :mod:`mpwatch.profile.protos`
describes the fields of ``xla/service/hlo.proto`` and ``xla/xla_data.proto`` it reads) into an
:class:`HloModule`: every instruction of every computation with what decides its precision and
owner: opcode, result element types, operands, the computations it calls (a fusion's fused
computation), a custom call's target, the dot/convolution precision config, and the framework op
name of its metadata. :func:`hlo_modules` gives every program of a decoded trace.

Example (needs a trace):
    >>> from mpwatch.profile import hlo, xplane  # doctest: +SKIP
    >>> mods = hlo.hlo_modules(xplane.read_xspace("host.xplane.pb"))  # doctest: +SKIP
    >>> m = mods["jit_train_step(10607)"]  # doctest: +SKIP
    >>> m.by_name["cudnn-conv-bias-activation.12"].custom_call_target  # doctest: +SKIP
    '__cudnn$convBiasActivationForward'
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from mpwatch.profile.xplane import (
    METADATA_PLANE,
    XSpace,
    XSpaceError,
    _text,
    element_type,
    hlo_message,
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


def _shape(shape: Any) -> tuple[list[str], int]:
    """(element types, flattened; elements of the first array) of a ``ShapeProto``."""
    subs = shape.tuple_shapes
    etype = element_type(shape) if shape.HasField("element_type") else ""
    if etype == "tuple" or len(subs):
        types: list[str] = []
        elements = 0
        for sub in subs:
            t, n = _shape(sub)
            types.extend(t)
            elements += n
        return types, elements
    n = 1
    for d in shape.dimensions:
        n *= max(int(d), 0)
    return [etype], n


def _instruction(msg: Any, computation: int) -> HloInstruction:
    instr = HloInstruction(
        id=msg.id if msg.HasField("id") else -1,
        name=_text(msg.name),
        opcode=_text(msg.opcode),
        op_name=_text(msg.metadata.op_name),
        custom_call_target=_text(msg.custom_call_target),
        operand_ids=tuple(msg.operand_ids),
        called_ids=tuple(msg.called_computation_ids),
        computation=computation,
    )
    if msg.HasField("shape"):
        types, elements = _shape(msg.shape)
        instr.types = tuple(types)
        instr.elements = elements
        instr.dtype = "tuple" if len(types) != 1 else types[0]
    if msg.HasField("precision_config"):
        config = msg.precision_config
        instr.operand_precision = tuple(config.operand_precision)
        if config.HasField("algorithm"):
            instr.algorithm = ALGORITHMS.get(config.algorithm, str(config.algorithm))
    return instr


def parse_module(blob: bytes | memoryview, name: str = "") -> HloModule:
    """An ``HloProto`` (the metadata plane's ``Hlo Proto`` stat) as an :class:`HloModule`;
    :class:`~mpwatch.profile.xplane.XSpaceError` when it is none."""
    proto = hlo_message(blob).hlo_module
    module = HloModule(name=name or _text(proto.name))
    if proto.HasField("entry_computation_id"):
        module.entry = proto.entry_computation_id
    for key, sequence in proto.schedule.sequences.items():  # run order per computation
        module.schedule[key] = list(sequence.instruction_ids)
    for comp in proto.computations:
        cid = comp.id if comp.HasField("id") else -len(module.computations) - 1
        ids = []
        for msg in comp.instructions:
            instr = _instruction(msg, cid)
            if instr.id < 0:
                instr.id = -(len(module.instructions) + 1) * 1000003
            module.instructions[instr.id] = instr
            ids.append(instr.id)
        module.computations[cid] = ids
        module.computation_names[cid] = _text(comp.name)
    entry_name = _text(proto.entry_computation_name)
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
            out[name] = parse_module(blob, name)
        except XSpaceError:
            continue
    return out
