"""The few protobuf messages of a profiler trace that mpwatch reads, decoded by protobuf itself.

A trace (``*.xplane.pb``) is an ``XSpace`` (``tsl/profiler/protobuf/xplane.proto``); its metadata
plane keeps each compiled program as an ``HloProto`` (``xla/service/hlo.proto``, shapes and op
metadata from ``xla/xla_data.proto``). Their generated classes ship with TensorFlow, which a JAX
user need not have, so the messages are described here: each with only the fields mpwatch reads,
under their numbers and wire types in those files (stable: protobuf never renumbers a field).
protobuf's own parser (its C implementation, ``upb``, where installed: protobuf >= 4.21) then
decodes them, skipping every field not described, as it does for any newer field. A 5 MB trace
of a JAX fit decodes in tens of milliseconds (a hand-written decoder in Python took seconds).

Enums are described as ``int32`` (the same varint on the wire): a number mpwatch does not know
stays a number. The descriptions are proto2, so a value that was on the wire can be told from an
absent one (``HasField``; an ``XStat``'s value is a oneof, as in xplane.proto).

Example:
    >>> space = messages().XSpace.FromString(b"\\x0a\\x06\\x12\\x04/a:b")
    >>> space.planes[0].name
    '/a:b'
"""

from __future__ import annotations

from functools import lru_cache
from types import SimpleNamespace
from typing import Any

from google.protobuf.message import DecodeError

__all__ = ["messages", "DecodeError", "PACKAGE"]

PACKAGE = "mpwatch.trace"

# (field name, number, type, label, message type name) per message; type: a scalar's
# FieldDescriptorProto type name, or "message"; label: "optional" or "repeated"
_I64, _U64, _I32, _STR, _BYTES, _DBL = "int64", "uint64", "int32", "string", "bytes", "double"
_OPT, _REP = "optional", "repeated"

_MESSAGES: dict[str, list[tuple[str, int, str, str, str | None]]] = {
    # xplane.proto
    "XSpace": [("planes", 1, "message", _REP, "XPlane")],
    "XPlane": [
        ("id", 1, _I64, _OPT, None),
        ("name", 2, _STR, _OPT, None),
        ("lines", 3, "message", _REP, "XLine"),
        ("event_metadata", 4, "message", _REP, "XPlane.EventMetadataEntry"),
        ("stat_metadata", 5, "message", _REP, "XPlane.StatMetadataEntry"),
        ("stats", 6, "message", _REP, "XStat"),
    ],
    "XPlane.EventMetadataEntry": [
        ("key", 1, _I64, _OPT, None),
        ("value", 2, "message", _OPT, "XEventMetadata"),
    ],
    "XPlane.StatMetadataEntry": [
        ("key", 1, _I64, _OPT, None),
        ("value", 2, "message", _OPT, "XStatMetadata"),
    ],
    "XLine": [
        ("id", 1, _I64, _OPT, None),
        ("name", 2, _STR, _OPT, None),
        ("timestamp_ns", 3, _I64, _OPT, None),
        ("events", 4, "message", _REP, "XEvent"),
        ("display_name", 11, _STR, _OPT, None),
    ],
    "XEvent": [
        ("metadata_id", 1, _I64, _OPT, None),
        ("offset_ps", 2, _I64, _OPT, None),
        ("duration_ps", 3, _I64, _OPT, None),
        ("stats", 4, "message", _REP, "XStat"),
    ],
    "XStat": [  # the value fields form the oneof "value" (see _ONEOFS)
        ("metadata_id", 1, _I64, _OPT, None),
        ("double_value", 2, _DBL, _OPT, None),
        ("uint64_value", 3, _U64, _OPT, None),
        ("int64_value", 4, _I64, _OPT, None),
        ("str_value", 5, _STR, _OPT, None),
        ("bytes_value", 6, _BYTES, _OPT, None),
        ("ref_value", 7, _U64, _OPT, None),
    ],
    "XEventMetadata": [
        ("id", 1, _I64, _OPT, None),
        ("name", 2, _STR, _OPT, None),
        ("stats", 5, "message", _REP, "XStat"),
    ],
    "XStatMetadata": [("id", 1, _I64, _OPT, None), ("name", 2, _STR, _OPT, None)],
    # hlo.proto
    "HloProto": [("hlo_module", 1, "message", _OPT, "HloModuleProto")],
    "HloModuleProto": [
        ("name", 1, _STR, _OPT, None),
        ("entry_computation_name", 2, _STR, _OPT, None),
        ("computations", 3, "message", _REP, "HloComputationProto"),
        ("entry_computation_id", 6, _I64, _OPT, None),
        ("schedule", 7, "message", _OPT, "HloScheduleProto"),
    ],
    "HloScheduleProto": [("sequences", 1, "message", _REP, "HloScheduleProto.SequencesEntry")],
    "HloScheduleProto.SequencesEntry": [
        ("key", 1, _I64, _OPT, None),
        ("value", 2, "message", _OPT, "HloScheduleProto.InstructionSequence"),
    ],
    "HloScheduleProto.InstructionSequence": [("instruction_ids", 1, _I64, _REP, None)],
    "HloComputationProto": [
        ("name", 1, _STR, _OPT, None),
        ("instructions", 2, "message", _REP, "HloInstructionProto"),
        ("id", 5, _I64, _OPT, None),
    ],
    "HloInstructionProto": [
        ("name", 1, _STR, _OPT, None),
        ("opcode", 2, _STR, _OPT, None),
        ("shape", 3, "message", _OPT, "ShapeProto"),
        ("metadata", 7, "message", _OPT, "OpMetadata"),
        ("custom_call_target", 28, _STR, _OPT, None),
        ("id", 35, _I64, _OPT, None),
        ("operand_ids", 36, _I64, _REP, None),
        ("called_computation_ids", 38, _I64, _REP, None),
        ("precision_config", 51, "message", _OPT, "PrecisionConfig"),
    ],
    # xla_data.proto
    "ShapeProto": [
        ("element_type", 2, _I32, _OPT, None),  # enum PrimitiveType
        ("dimensions", 3, _I64, _REP, None),
        ("tuple_shapes", 4, "message", _REP, "ShapeProto"),
    ],
    "OpMetadata": [("op_type", 1, _STR, _OPT, None), ("op_name", 2, _STR, _OPT, None)],
    "PrecisionConfig": [
        ("operand_precision", 1, _I32, _REP, None),  # enum Precision
        ("algorithm", 2, _I32, _OPT, None),  # enum Algorithm
    ],
}
_VALUES = ("double_value", "uint64_value", "int64_value", "str_value", "bytes_value", "ref_value")
_ONEOFS = {"XStat": ("value", set(_VALUES))}
_MAP_ENTRIES = {
    "XPlane.EventMetadataEntry",
    "XPlane.StatMetadataEntry",
    "HloScheduleProto.SequencesEntry",
}


def _file() -> Any:
    from google.protobuf import descriptor_pb2

    f = descriptor_pb2.FileDescriptorProto(name="mpwatch_trace.proto", package=PACKAGE)
    f.syntax = "proto2"
    made: dict[str, Any] = {}
    for full in _MESSAGES:  # outer messages first (dict order), nested ones inside their outer
        outer, _, inner = full.partition(".")
        if inner:
            msg = made[outer].nested_type.add(name=inner)
            if full in _MAP_ENTRIES:
                msg.options.map_entry = True
        else:
            msg = f.message_type.add(name=full)
        made[full] = msg
        oneof = _ONEOFS.get(full)
        if oneof:
            msg.oneof_decl.add(name=oneof[0])
        for name, number, kind, label, type_name in _MESSAGES[full]:
            field = msg.field.add(name=name, number=number)
            field.label = getattr(field, f"LABEL_{label.upper()}")
            if kind == "message":
                field.type = field.TYPE_MESSAGE
                field.type_name = f".{PACKAGE}.{type_name}"
            else:
                field.type = getattr(field, f"TYPE_{kind.upper()}")
            if oneof and name in oneof[1]:
                field.oneof_index = 0
    return f


@lru_cache(maxsize=1)
def messages() -> SimpleNamespace:
    """The message classes, by their proto names (``XSpace``, ``XPlane``, ``HloProto``, ...),
    built once per process in a pool of their own (never clashing with TensorFlow's)."""
    from google.protobuf import descriptor_pool, message_factory

    pool = descriptor_pool.DescriptorPool()
    pool.Add(_file())
    out = {}
    for full in _MESSAGES:
        if "." not in full:
            out[full] = message_factory.GetMessageClass(
                pool.FindMessageTypeByName(f"{PACKAGE}.{full}")
            )
    return SimpleNamespace(**out)
