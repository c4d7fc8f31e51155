"""mpwatch's trace reader (protobuf's parser over the messages :mod:`mpwatch.profile.protos`
describes) against the protobuf classes TensorFlow ships (``xplane_pb2``, ``hlo_pb2``,
``xla_data_pb2``): the same field numbers and wire types, and the same values read from traces
those classes wrote and from the shipped H100 trace."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from builders import H100_TRACE

from mpwatch.profile import hlo, protos, xplane

TRACE = Path(H100_TRACE)


def _pb2():
    try:
        from tensorflow.compiler.xla import xla_data_pb2
        from tensorflow.compiler.xla.service import hlo_pb2
        from tensorflow.tsl.profiler.protobuf import xplane_pb2
    except Exception as e:  # pragma: no cover - TensorFlow's protobufs missing
        pytest.skip(f"TensorFlow's xplane/hlo protobuf classes are not importable: {e}")
    return xplane_pb2, hlo_pb2, xla_data_pb2


# protobuf's wire type of each field type (varint 0, 64-bit 1, length-delimited 2)
_WIRE = {"int64": 0, "uint64": 0, "int32": 0, "enum": 0, "double": 1, "string": 2, "bytes": 2}


def _wire(field) -> int:
    if field.message_type is not None:
        return 2
    names = {v: k for k, v in vars(type(field)).items() if k.startswith("TYPE_")}
    return _WIRE[names[field.type][5:].lower()]


def _repeated(field) -> bool:
    if hasattr(field, "is_repeated"):  # protobuf >= 6 (``label`` is gone in 7)
        return bool(field.is_repeated)
    return field.label == field.LABEL_REPEATED


def test_every_field_has_the_number_and_wire_type_of_the_real_proto():
    xplane_pb2, hlo_pb2, xla_data_pb2 = _pb2()
    real = {}
    for module in (xplane_pb2, hlo_pb2, xla_data_pb2):
        for name, desc in module.DESCRIPTOR.message_types_by_name.items():
            real[name] = desc
            for nested in desc.nested_types:
                real[f"{name}.{nested.name}"] = nested
    ours = protos.messages()
    checked = 0
    for name in protos._MESSAGES:
        outer = getattr(ours, name.split(".")[0]).DESCRIPTOR
        desc = outer if "." not in name else outer.nested_types_by_name[name.split(".")[1]]
        assert name in real, name
        for field in desc.fields:
            theirs = real[name].fields_by_name[field.name]
            assert field.number == theirs.number, (name, field.name)
            assert _wire(field) == _wire(theirs), (name, field.name)
            assert _repeated(field) == _repeated(theirs), (name, field.name)
            if field.message_type is not None:
                assert field.message_type.name == theirs.message_type.name, (name, field.name)
            checked += 1
    assert checked >= 50


def _space_written_by_tensorflow(xplane_pb2, hlo_pb2):
    """An XSpace with a stat of every value kind, on a plane's events, its metadata and itself,
    and an HLO program, serialized by TensorFlow's classes."""
    space = xplane_pb2.XSpace()
    plane = space.planes.add(id=1, name="/host:metadata")
    for i, sname in enumerate(["d", "u", "i", "s", "b", "r", "Hlo Proto"], start=1):
        plane.stat_metadata[i].id = i
        plane.stat_metadata[i].name = sname
    plane.event_metadata[7].id = 7
    plane.event_metadata[7].name = "jit_f(3)"
    proto = hlo_pb2.HloProto()
    mod = proto.hlo_module
    mod.name, mod.entry_computation_name, mod.entry_computation_id = "jit_f", "main.2", 2
    fused = mod.computations.add(name="fused", id=1)
    inner = fused.instructions.add(name="multiply.1", opcode="multiply", id=10)
    inner.metadata.op_name = "jit(f)/mul"
    inner.shape.element_type = 16  # bf16
    inner.shape.dimensions.extend([4, 8])
    main = mod.computations.add(name="main.2", id=2)
    p = main.instructions.add(name="p.0", opcode="parameter", id=20)
    p.shape.element_type = 11
    p.shape.dimensions.extend([4, 8])
    f = main.instructions.add(name="fusion.3", opcode="fusion", id=21)
    f.operand_ids.extend([20])
    f.called_computation_ids.extend([1])
    f.shape.element_type = 13
    f.shape.tuple_shapes.add(element_type=16, dimensions=[4, 8])
    f.shape.tuple_shapes.add(element_type=11, dimensions=[2])
    d = main.instructions.add(name="dot.4", opcode="dot", id=22)
    d.operand_ids.extend([20, 20])
    d.precision_config.operand_precision.extend([0, 2])
    d.precision_config.algorithm = 6
    d.shape.element_type = 11
    c = main.instructions.add(name="custom-call.5", opcode="custom-call", id=23)
    c.custom_call_target = "__cublas$gemm"
    mod.schedule.sequences[2].instruction_ids.extend([20, 21, 22, 23])
    plane.event_metadata[7].stats.add(metadata_id=7, bytes_value=proto.SerializeToString())
    plane.stats.add(metadata_id=3, int64_value=-5)
    line = plane.lines.add(id=1, name="", display_name="main thread", timestamp_ns=-12)
    ev = line.events.add(metadata_id=7, offset_ps=2**40, duration_ps=-3)
    ev.stats.add(metadata_id=1, double_value=0.0)  # a zero that was written: present
    ev.stats.add(metadata_id=2, uint64_value=2**64 - 1)
    ev.stats.add(metadata_id=3, int64_value=-(2**63))
    ev.stats.add(metadata_id=4, str_value="jit(f)/mul ü")
    ev.stats.add(metadata_id=5, bytes_value=b"\x00\xff")
    ev.stats.add(metadata_id=6, ref_value=4)  # the name of stat metadata 4
    ev.stats.add(metadata_id=9)  # no value, unknown metadata
    line.events.add(metadata_id=99, offset_ps=1, duration_ps=2)  # unknown event metadata
    return space.SerializeToString()


def test_values_written_by_tensorflows_classes_read_back_exactly():
    xplane_pb2, hlo_pb2, _ = _pb2()
    space = xplane.parse_xspace(_space_written_by_tensorflow(xplane_pb2, hlo_pb2))
    (plane,) = space.planes
    assert plane.name == "/host:metadata" and plane.stats == {"i": -5}
    (line,) = plane.lines
    assert line.name == "main thread" and line.timestamp_ns == -12
    ev, unknown = line.events
    assert (ev.name, ev.offset_ps, ev.duration_ps) == ("jit_f(3)", 2**40, -3)
    assert ev.stats == {
        "d": 0.0,
        "u": 2**64 - 1,
        "i": -(2**63),
        "s": "jit(f)/mul ü",
        "b": b"\x00\xff",
        "r": "s",
        "9": None,
    }
    assert math.copysign(1, ev.stats["d"]) == 1
    assert (unknown.name, unknown.stats) == ("", {})
    ops = xplane.hlo_ops(space)["jit_f(3)"]
    assert ops["fusion.3"].fused_op_names == ("jit(f)/mul",)
    assert ops["multiply.1"].dtype == "bf16" and ops["custom-call.5"].dtype == ""
    (module,) = hlo.hlo_modules(space).values()
    assert module.name == "jit_f(3)" and module.entry == 2
    assert module.computations == {1: [10], 2: [20, 21, 22, 23]}
    assert module.computation_names == {1: "fused", 2: "main.2"}
    assert module.schedule == {2: [20, 21, 22, 23]}
    fusion = module.by_name["fusion.3"]
    assert (fusion.types, fusion.dtype, fusion.elements) == (("bf16", "f32"), "tuple", 34)
    assert fusion.operand_ids == (20,) and fusion.called_ids == (1,)
    assert [i.name for i in module.inside(fusion)] == ["multiply.1"]
    dot = module.by_name["dot.4"]
    assert dot.operand_precision == (0, 2) and dot.algorithm == "ALG_DOT_BF16_BF16_F32"
    assert module.by_name["custom-call.5"].custom_call_target == "__cublas$gemm"
    assert module.by_name["p.0"].elements == 32 and module.by_name["p.0"].dtype == "f32"


def test_text_that_is_no_utf8_stays_readable():
    # a name field holding bytes that are no UTF-8 (protobuf hands them over as bytes)
    raw = b"\x0a\x08\x12\x06/h\xff\xfe:x"  # XSpace.planes[0].name
    (plane,) = xplane.parse_xspace(raw).planes
    assert plane.name == "/h\ufffd\ufffd:x"


@pytest.mark.parametrize(
    "data",
    [b"\x0a\x10\x12\x04/a:b", b"\xff\xff\xff", b"\x0a"],
    ids=["truncated", "not a protobuf", "cut in the length"],
)
def test_a_file_that_is_no_xspace_is_a_clear_error(tmp_path, data):
    path = tmp_path / "bad.xplane.pb"
    path.write_bytes(data)
    with pytest.raises(xplane.XSpaceError, match="not a readable profiler trace"):
        xplane.read_xspace(path)


def test_an_unreadable_program_is_left_out():
    space = xplane.XSpace([xplane.XPlane(name=xplane.METADATA_PLANE)])
    space.planes[0].metadata_stats = {"jit_bad(1)": {"Hlo Proto": b"\x0a\x10\x12"}}
    assert xplane.hlo_ops(space) == {} and hlo.hlo_modules(space) == {}


def test_the_h100_trace_reads_as_tensorflows_classes_read_it():
    if not TRACE.is_file():
        pytest.skip("the H100 trace is not here")
    xplane_pb2, hlo_pb2, _ = _pb2()
    data = TRACE.read_bytes()
    truth = xplane_pb2.XSpace.FromString(data)
    space = xplane.parse_xspace(data)
    assert [p.name for p in space.planes] == [p.name for p in truth.planes]
    events = 0
    for ours, theirs in zip(space.planes, truth.planes):
        names = {k: v.name for k, v in theirs.stat_metadata.items()}

        def name(i, names=names):  # a stat whose metadata the plane lacks: by its number
            return names.get(i, str(i))

        def value(stat, name=name):
            kind = stat.WhichOneof("value")
            if kind == "ref_value":
                return name(stat.ref_value)
            return None if kind is None else getattr(stat, kind)

        assert ours.stats == {name(s.metadata_id): value(s) for s in theirs.stats}
        for lo, lt in zip(ours.lines, theirs.lines, strict=True):
            assert lo.name == (lt.name or lt.display_name)
            for eo, et in zip(lo.events, lt.events, strict=True):
                assert eo.name == theirs.event_metadata[et.metadata_id].name
                assert (eo.offset_ps, eo.duration_ps) == (et.offset_ps, et.duration_ps)
                assert eo.stats == {name(s.metadata_id): value(s) for s in et.stats}
                events += 1
    assert events > 500
    modules = hlo.hlo_modules(space)
    assert modules
    for key, module in modules.items():
        blob = space.plane(xplane.METADATA_PLANE).metadata_stats[key]["Hlo Proto"]
        real = hlo_pb2.HloProto.FromString(blob).hlo_module
        instrs = [i for c in real.computations for i in c.instructions]
        assert len(module.instructions) == len(instrs)
        for i in instrs:
            mine = module.instructions[i.id]
            assert (mine.name, mine.opcode, mine.op_name) == (i.name, i.opcode, i.metadata.op_name)
            assert mine.operand_ids == tuple(i.operand_ids)
            assert mine.called_ids == tuple(i.called_computation_ids)
            assert mine.custom_call_target == i.custom_call_target
