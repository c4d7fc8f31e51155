"""Read a profiler trace (an ``XSpace`` protobuf, ``*.xplane.pb``) without TensorFlow.

TensorFlow's ``tf.profiler`` and ``jax.profiler`` write the same file. xprof's converter turns it
into tables (``mpwatch/profile/traces.py``), but two things it leaves out are in the file itself:

- **XLA's CPU ops** (``jax.profiler`` on a CPU): the host plane holds one event per HLO
  instruction the XLA CPU runtime ran (its ``hlo_module`` and ``hlo_op`` stats), and xprof's op
  table has no rows for them.
- **HLO metadata**: the ``/host:metadata`` plane holds each compiled program's ``HloProto``, whose
  instructions carry the framework op name they came from (``jit(train_step)/jvp(conv2d)/...``).
  GPU kernels that XLA launched from a CUDA graph reach xprof's kernel table with the op name
  ``XlaModule``; their kernel name is the HLO instruction's name, which the metadata maps back to
  an op (and so to a layer).

protobuf decodes the file (:mod:`mpwatch.profile.protos` describes the fields of ``xplane.proto``
and ``xla/service/hlo.proto`` that mpwatch reads): no generated classes, so no TensorFlow and no
xprof import; fields not described are skipped, as protobuf skips any unknown field.

Example:
    >>> space = read_xspace("logs/run1/plugins/profile/2025_01_01/host.xplane.pb")  # doctest: +SKIP
    >>> [p.name for p in space.planes]  # doctest: +SKIP
    ['/host:metadata', '/host:CPU', 'Task Environment']
    >>> ops = hlo_ops(space)  # doctest: +SKIP
    >>> ops["jit_train_step"]["conv_general_dilated.0"].op_name  # doctest: +SKIP
    'jit(train_step)/jvp(conv2d)/conv_general_dilated'
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from mpwatch.profile import protos

__all__ = [
    "XSpaceError",
    "XEvent",
    "XLine",
    "XPlane",
    "XSpace",
    "HloOp",
    "read_xspace",
    "parse_xspace",
    "metadata_and_devices",
    "metadata_and_host",
    "hlo_ops",
    "module_base",
    "kernel_modules",
    "xla_host_events",
    "ELEMENT_TYPES",
]

METADATA_PLANE = "/host:metadata"
HOST_PLANE = "/host:CPU"
DEVICE_PLANE_PREFIX = "/device:"

#: xla.PrimitiveType numbers -> HLO type names (xla/xla_data.proto)
ELEMENT_TYPES = {
    1: "pred",
    2: "s8",
    3: "s16",
    4: "s32",
    5: "s64",
    6: "u8",
    7: "u16",
    8: "u32",
    9: "u64",
    10: "f16",
    11: "f32",
    12: "f64",
    13: "tuple",
    14: "opaque",
    15: "c64",
    16: "bf16",
    17: "token",
    18: "c128",
    19: "f8e5m2",
    20: "f8e4m3fn",
    21: "s4",
    22: "u4",
    23: "f8e4m3b11fnuz",
    24: "f8e5m2fnuz",
    25: "f8e4m3fnuz",
}


class XSpaceError(ValueError):
    """The file is not a readable XSpace (truncated, or not a protobuf)."""


# --- text ----------------------------------------------------------------------------------------
def _text(value: Any) -> str:
    """A string field's value: protobuf gives a ``str``, or the raw ``bytes`` where they are no
    valid UTF-8 (kept readable, as the trace's other text)."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", errors="replace")
    return ""


# --- XSpace --------------------------------------------------------------------------------------
@dataclass
class XEvent:
    """One event of a line: its metadata's name, start and duration (picoseconds), stats by name."""

    name: str
    offset_ps: int
    duration_ps: int
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass
class XLine:
    """A timeline (a thread, a GPU stream) of a plane."""

    name: str
    timestamp_ns: int
    events: list[XEvent] = field(default_factory=list)


@dataclass
class XPlane:
    """A plane: ``/host:CPU``, ``/device:GPU:0``, ``/host:metadata``, ...

    ``metadata_stats``: event metadata name -> its stats (the metadata plane keeps each compiled
    program's ``Hlo Proto`` there). ``stats``: the plane's own (a GPU plane's
    ``compute_cap_major``/``compute_cap_minor``, ``gpu_device_name``, ...).
    """

    name: str
    lines: list[XLine] = field(default_factory=list)
    metadata_stats: dict[str, dict[str, Any]] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass
class XSpace:
    """The planes of a trace."""

    planes: list[XPlane] = field(default_factory=list)

    def plane(self, name: str) -> XPlane | None:
        """The plane called ``name``, or None."""
        return next((p for p in self.planes if p.name == name), None)

    @property
    def device_planes(self) -> list[XPlane]:
        """The ``/device:...`` planes (GPUs)."""
        return [p for p in self.planes if p.name.startswith(DEVICE_PLANE_PREFIX)]


def _stat_value(stat: Any, stat_names: dict[int, str]) -> Any:
    kind = stat.WhichOneof("value")
    if kind is None:
        return None
    if kind == "ref_value":
        return stat_names.get(stat.ref_value, str(stat.ref_value))
    if kind == "str_value":
        return _text(stat.str_value)
    return getattr(stat, kind)


def _stats(stats: Any, stat_names: dict[int, str]) -> dict[str, Any]:
    return {
        stat_names.get(s.metadata_id, str(s.metadata_id)): _stat_value(s, stat_names) for s in stats
    }


def _plane(msg: Any) -> XPlane:
    stat_names = {k: _text(v.name) for k, v in msg.stat_metadata.items()}
    event_meta = msg.event_metadata
    names = {k: _text(v.name) for k, v in event_meta.items()}
    plane = XPlane(name=_text(msg.name))
    plane.stats = _stats(msg.stats, stat_names)
    for key, meta in event_meta.items():
        if len(meta.stats):
            plane.metadata_stats[names[key]] = _stats(meta.stats, stat_names)
    for lmsg in msg.lines:
        line = XLine(
            name=_text(lmsg.name) or _text(lmsg.display_name), timestamp_ns=lmsg.timestamp_ns
        )
        line.events = [
            XEvent(
                names.get(e.metadata_id, ""),
                e.offset_ps,
                e.duration_ps,
                _stats(e.stats, stat_names) if len(e.stats) else {},
            )
            for e in lmsg.events
        ]
        plane.lines.append(line)
    return plane


PlaneFilter = Callable[[str], bool]


def parse_xspace(data: bytes, planes: PlaneFilter | None = None) -> XSpace:
    """Decode an XSpace (protobuf's parser: :mod:`mpwatch.profile.protos`). ``planes(name)`` says
    which planes to decode into events and stats (default: all); the others keep only their name.
    Raises :class:`XSpaceError` when ``data`` is no XSpace."""
    try:
        msg = protos.messages().XSpace.FromString(bytes(data))
    except protos.DecodeError as e:
        raise XSpaceError(f"not a readable profiler trace (XSpace): {e}") from e
    space = XSpace()
    for p in msg.planes:
        if planes is None or planes(_text(p.name)):
            space.planes.append(_plane(p))
        else:
            space.planes.append(XPlane(name=_text(p.name)))
    return space


def metadata_and_devices(name: str) -> bool:
    """A plane filter: the metadata plane (HLO) and the device planes (GPU kernels)."""
    return name == METADATA_PLANE or name.startswith(DEVICE_PLANE_PREFIX)


def metadata_and_host(name: str) -> bool:
    """A plane filter: the metadata plane (HLO) and the host plane (XLA's CPU ops)."""
    return name in (METADATA_PLANE, HOST_PLANE)


def read_xspace(path: str | os.PathLike[str], planes: PlaneFilter | None = None) -> XSpace:
    """:func:`parse_xspace` of a file."""
    with open(path, "rb") as f:
        data = f.read()
    return parse_xspace(data, planes)


# --- HLO metadata ---------------------------------------------------------------------------------
@dataclass
class HloOp:
    """One HLO instruction of a compiled program.

    ``op_name``: the framework op it came from (``jit(train_step)/jvp(conv2d)/...``; ``""`` where
    XLA made it); ``opcode``: HLO's (``fusion``, ``convolution``, ``dot``, ...); ``dtype``: the HLO
    type of its result (``f16``, ``f32``; ``tuple`` for several); ``fused_op_names``: for a fusion,
    the op names of the instructions inside it (what it computes).
    """

    name: str
    opcode: str
    op_name: str
    dtype: str
    fused_op_names: tuple[str, ...] = ()


def hlo_message(blob: bytes) -> Any:
    """An ``HloProto`` (a metadata plane's ``Hlo Proto`` stat) decoded by protobuf
    (:mod:`mpwatch.profile.protos`); :class:`XSpaceError` when it is none."""
    try:
        return protos.messages().HloProto.FromString(bytes(blob))
    except protos.DecodeError as e:
        raise XSpaceError(f"not a readable HLO program: {e}") from e


def element_type(shape: Any) -> str:
    """The HLO type name of a ``ShapeProto``'s element type (``f16``, ``tuple``, ...)."""
    return ELEMENT_TYPES.get(shape.element_type, str(shape.element_type))


def _hlo_module(blob: bytes) -> dict[str, HloOp]:
    module = hlo_message(blob).hlo_module
    computations: dict[int, list[tuple[str, str, str, str, Any]]] = {}
    for comp in module.computations:
        cid = comp.id if comp.HasField("id") else -len(computations) - 1
        computations[cid] = [
            (
                _text(i.name),
                _text(i.opcode),
                _text(i.metadata.op_name),
                element_type(i.shape) if i.shape.HasField("element_type") else "",
                i.called_computation_ids,
            )
            for i in comp.instructions
        ]
    out: dict[str, HloOp] = {}
    for instrs in computations.values():
        for name, opcode, op_name, dtype, called in instrs:
            fused: list[str] = []
            if opcode == "fusion":
                seen = set()
                stack = list(called)
                while stack:
                    cid = stack.pop()
                    if cid in seen:
                        continue
                    seen.add(cid)
                    for _, _, inner_op, _, inner_called in computations.get(cid, []):
                        if inner_op:
                            fused.append(inner_op)
                        stack.extend(inner_called)
            out[name] = HloOp(name, opcode, op_name, dtype, tuple(dict.fromkeys(fused)))
    return out


_PROGRAM_ID = re.compile(r"^(.*)\((\d+)\)$")


def module_base(name: str) -> str:
    """A program's name without its id: ``jit_train_step(10607)`` -> ``jit_train_step``.

    >>> module_base("jit_train_step(10607)"), module_base("jit_f")
    ('jit_train_step', 'jit_f')
    """
    m = _PROGRAM_ID.match(name)
    return m.group(1) if m else name


def ran_programs(modules: Iterable[str]) -> Callable[[str], bool]:
    """A program filter: whether a program of the metadata plane (``name(id)``) is one of
    ``modules`` (the programs events ran, with or without their id) or has the base name of one
    (as :class:`mpwatch.profile.traces.HloIndex` looks them up). A trace's metadata plane holds
    every program the process compiled (74 in a short JAX fit with mpwatch): parsing only those
    that ran saves most of the conversion's HLO parsing."""
    names = set(modules)
    bases = {module_base(m) for m in names}
    return lambda key: key in names or module_base(key) in bases


def hlo_ops(
    space: XSpace, programs: Callable[[str], bool] | None = None
) -> dict[str, dict[str, HloOp]]:
    """Compiled programs of the trace: ``program name -> instruction name -> HloOp``; only
    those ``programs(name)`` accepts where given (:func:`ran_programs`).

    Program names as the metadata plane has them (``jit_train_step(10607)``, name and program
    id); :func:`module_base` strips the id.
    """
    plane = space.plane(METADATA_PLANE)
    if plane is None:
        return {}
    out: dict[str, dict[str, HloOp]] = {}
    for name, stats in plane.metadata_stats.items():
        if programs is not None and not programs(name):
            continue
        blob = stats.get("Hlo Proto")
        if isinstance(blob, bytes) and blob:
            try:
                out[name] = _hlo_module(blob)
            except XSpaceError:
                continue  # one unreadable program: leave it out
    return out


def kernel_modules(space: XSpace) -> dict[str, dict[str, int]]:
    """GPU kernel name -> {program (``name(id)`` or name) -> launches}, from the device planes'
    events (their ``hlo_module`` and ``program_id`` stats)."""
    out: dict[str, dict[str, int]] = {}
    for plane in space.device_planes:
        for line in plane.lines:
            for ev in line.events:
                module = ev.stats.get("hlo_module")
                if not module:
                    continue
                pid = ev.stats.get("program_id")
                key = f"{module}({pid})" if pid is not None else str(module)
                per = out.setdefault(ev.name, {})
                per[key] = per.get(key, 0) + 1
    return out


@dataclass
class XlaHostEvent:
    """One HLO instruction run by the XLA CPU runtime: program, instruction, times (ps)."""

    module: str
    hlo_op: str
    duration_ps: int
    self_ps: int


def xla_host_events(space: XSpace) -> list[XlaHostEvent]:
    """Events of the host plane that carry ``hlo_module`` and ``hlo_op`` stats (XLA's CPU thunks),
    with their self time (minus nested HLO events of the same thread)."""
    plane = space.plane(HOST_PLANE)
    if plane is None:
        return []
    out: list[XlaHostEvent] = []
    for line in plane.lines:
        evs = sorted(
            (e for e in line.events if e.stats.get("hlo_op") and e.stats.get("hlo_module")),
            key=lambda e: (e.offset_ps, -e.duration_ps),
        )
        stack: list[tuple[int, XlaHostEvent]] = []  # (end, event)
        for e in evs:
            while stack and stack[-1][0] <= e.offset_ps:
                stack.pop()
            item = XlaHostEvent(
                str(e.stats["hlo_module"]), str(e.stats["hlo_op"]), e.duration_ps, e.duration_ps
            )
            if stack and e.offset_ps + e.duration_ps <= stack[-1][0]:
                stack[-1][1].self_ps -= e.duration_ps
            stack.append((e.offset_ps + e.duration_ps, item))
            out.append(item)
    return out
