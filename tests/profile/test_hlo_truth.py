"""Issue 26 on the shipped H100 trace: every kernel's precision, Tensor Core use and owner from the
HLO it runs, checked against a truth computed here from the trace with the protobuf classes
TensorFlow ships (``xplane_pb2``, ``hlo_pb2``), not with mpwatch's reader.

The truth, by hand: each GPU event of the device plane runs the HLO instruction its ``hlo_op`` stat
names, or (inside a CUDA graph, ``hlo_op`` ``command_buffer_N``) the instruction its kernel is named
after (``input_reduce_fusion_4`` for ``input_reduce_fusion.4``). A convolution or matrix multiply
(a cuDNN/cuBLAS custom call, a fusion holding a ``dot``/``convolution``) with float16 operands on
the plane's compute capability 9.0 runs on Tensor Cores, except cuDNN's helper kernels (the
padding and split-K reduction kernels, told by name). Layer = the innermost ``jvp(NAME)`` of the
instruction's own op name. Memsets are not kernels (xprof's kernel table leaves them out).
"""

from __future__ import annotations

import re
import shutil
from collections import defaultdict
from pathlib import Path

import pytest
from builders import H100_TRACE, put_h100_trace

from mpwatch import profile

pytest.importorskip("xprof.convert.raw_to_tool_data")

TRACE = Path(H100_TRACE)
HELPER = re.compile(r"nhwcAddPaddingKernel|ReduceSplitK")
LAYER = re.compile(r"jvp\(([A-Za-z_]\w*)\)")
CONV_OR_DOT = ("dot", "convolution")


class _Events(list):
    copies: set[str] = set()


def _pb2():
    try:
        from tensorflow.compiler.xla.service import hlo_pb2
        from tensorflow.tsl.profiler.protobuf import xplane_pb2
    except Exception as e:  # pragma: no cover - TensorFlow's protobufs missing
        pytest.skip(f"TensorFlow's xplane/hlo protobuf classes are not importable: {e}")
    return xplane_pb2, hlo_pb2


@pytest.fixture(scope="module")
def truth():
    """Per event (memsets aside): (kernel, us, instruction or None, tensor core, layer,
    precision), from TensorFlow's protobuf classes."""
    if not TRACE.is_file():
        pytest.skip("the H100 trace is not here")
    xplane_pb2, hlo_pb2 = _pb2()
    space = xplane_pb2.XSpace()
    space.ParseFromString(TRACE.read_bytes())
    modules = {}
    for plane in space.planes:
        if plane.name != "/host:metadata":
            continue
        names = {k: v.name for k, v in plane.stat_metadata.items()}
        for em in plane.event_metadata.values():
            for st in em.stats:
                if names.get(st.metadata_id) == "Hlo Proto":
                    proto = hlo_pb2.HloProto()
                    proto.ParseFromString(st.bytes_value)
                    modules[em.name] = proto.hlo_module
    gpu = next(p for p in space.planes if p.name.startswith("/device:GPU"))
    gstats = {gpu.stat_metadata[s.metadata_id].name: s for s in gpu.stats}
    cc = (gstats["compute_cap_major"].int64_value, gstats["compute_cap_minor"].int64_value)
    assert cc == (9, 0)
    # instructions by id and by name; computations by id
    index = {}
    for key, mod in modules.items():
        by_id = {i.id: i for c in mod.computations for i in c.instructions}
        comps = {c.id: c for c in mod.computations}
        index[key] = (by_id, {i.name: i for i in by_id.values()}, comps)

    def inside(comps, instr):
        out, stack = [], list(instr.called_computation_ids)
        while stack:
            c = comps[stack.pop()]
            for i in c.instructions:
                out.append(i)
                stack.extend(i.called_computation_ids)
        return out

    def etype(instr):
        return instr.shape.element_type  # 10 F16, 11 F32, 16 BF16

    entry = next(m for k, m in modules.items() if k.startswith("jit_train_step"))
    copies = {
        i.name
        for c in entry.computations
        if c.id == entry.entry_computation_id
        for i in c.instructions
        if i.opcode == "copy"
    }
    events = _Events()
    smeta = {k: v.name for k, v in gpu.stat_metadata.items()}
    for line in gpu.lines:
        for ev in line.events:
            name = gpu.event_metadata[ev.metadata_id].name
            if name.startswith("Memset"):
                continue
            st = {}
            for s in ev.stats:
                field = s.WhichOneof("value")
                v = getattr(s, field) if field else None
                if field == "ref_value":
                    v = smeta.get(v)
                st[smeta.get(s.metadata_id)] = v
            key = f"{st.get('hlo_module')}({st.get('program_id')})"
            by_id, by_name, comps = index[key]
            instr = by_name.get(st.get("hlo_op"))
            if instr is None:
                instr = next((i for n, i in by_name.items() if re.sub(r"\W", "_", n) == name), None)
            tc, layer, precision = False, None, "unknown"
            if instr is not None:
                m = LAYER.findall(instr.metadata.op_name)
                layer = m[-1] if m and m[-1] != "compile_loss" else None
                math = [i for i in [instr, *inside(comps, instr)] if i.opcode in CONV_OR_DOT]
                if instr.opcode == "custom-call" and re.search(
                    r"cudnn\$conv|cublas", instr.custom_call_target
                ):
                    math = [instr]
                if math:
                    types = {etype(by_id[o]) for o in math[0].operand_ids[:2]}
                    precision = {frozenset({10}): "float16"}.get(frozenset(types), "other")
                    tc = precision == "float16" and cc >= (7, 0) and not HELPER.search(name)
                else:
                    precision = "known"
            events.append((name, ev.duration_ps / 1e6, instr, tc, layer, precision))
    events.copies = copies  # the entry computation's copy instructions
    return events


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    if not TRACE.is_file():
        pytest.skip("the H100 trace is not here")
    d = tmp_path_factory.mktemp("h100")
    put_h100_trace(d)
    try:
        return profile.kernel_time(profile.kernel_table(str(d)))
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_the_device_time_is_the_same(gpu, truth):
    assert gpu.total_us == pytest.approx(sum(us for _, us, *_ in truth), rel=1e-6)


def test_unknown_precision_under_3_percent(gpu, truth):
    s = gpu.summary
    assert s["unknown_share"] <= 0.03  # it was 20.5% from the kernel names alone
    # the kernels the simple mapping finds no instruction for are the CUDA graph's memcpy
    # kernels: one per copy instruction of the entry computation and step (3 steps)
    no_instr = [(name, us) for name, us, instr, *_ in truth if instr is None]
    assert {name for name, _ in no_instr} <= {"memcpy32_post", "memcpy128"}
    assert len(no_instr) == 3 * len(truth.copies)
    # mpwatch finds them along the schedule: those copies, float32
    k = gpu.kernels
    memcpy = k[k["kernel_name"].str.startswith("memcpy")]
    assert set(memcpy["hlo_op"]) == truth.copies
    assert (memcpy["precision"] == "float32").all()
    assert memcpy["total_duration_us"].sum() == pytest.approx(sum(us for _, us in no_instr))
    assert s["unknown_share"] == 0.0 and s["precision_from_hlo_share"] == pytest.approx(1.0)
    # the matrix math: float16 by its operands, as the name patterns also say (no disagreement)
    f16_math = sum(us for _, us, _, _, _, p in truth if p == "float16")
    assert gpu.kernels.loc[gpu.kernels["hlo_math"].ne(""), "total_duration_us"].sum() == (
        pytest.approx(f16_math)
    )
    assert s["precision_disagreements"] == []


def test_the_tensor_core_share_matches_the_hlo_truth(gpu, truth):
    total = gpu.total_us
    tc = sum(us for _, us, _, is_tc, *_ in truth if is_tc)
    assert abs(gpu.summary["tensor_core_share"] - tc / total) <= 0.01
    assert gpu.summary["compute_capability"] == "9.0"
    # the Triton GEMM fusions of the dense layer (names without a type) are on Tensor Cores now
    k = gpu.kernels
    triton = k[k["kernel_name"].str.startswith("gemm_fusion_dot")]
    assert len(triton) and triton["tensor_core"].eq("yes").all()
    assert triton["tensor_core_why"].str.contains("float16 operands").all()


def test_the_per_layer_table_matches_the_hlo_truth(gpu, truth):
    total = gpu.total_us
    time, on_tc = defaultdict(float), defaultdict(float)
    for _, us, _, is_tc, layer, _ in truth:
        if layer is not None:
            time[layer] += us
            on_tc[layer] += us if is_tc else 0.0
    layers = gpu.layers.set_index("layer")
    assert set(time) == set(layers.index)
    for name in time:
        assert abs(layers.loc[name, "time_us"] - time[name]) / total <= 0.01, name
        assert abs(layers.loc[name, "tensor_core_us"] - on_tc[name]) / total <= 0.01, name


def test_every_microsecond_owned(gpu, truth):
    s = gpu.summary
    assert s["owned_share"] >= 0.95
    # nothing without an owner: even the CUDA graph's copies belong to what they copy (the
    # optimizer's variables and results, the metrics' variables)
    assert s["unattributed_us"] == 0.0 and s["unowned_ops"] == []
    k = gpu.kernels
    memcpy = k[k["kernel_name"].str.startswith("memcpy")]
    assert set(memcpy["part"]) == {"optimizer update", "metrics"}
    # the step's own parts are named
    parts = s["by_part_us"]
    assert parts["optimizer update"] > 0 and parts["loss scaling"] > 0 and parts["loss"] > 0
    assert parts["metrics"] > 0 and parts["input"] > 0
    k = gpu.kernels
    cond = k[k["op_name"].eq("jit(train_step)/cond")]
    # the LossScaleOptimizer's apply-or-skip cond: the Adam update inside it, else loss scaling
    assert set(cond["part"]) == {"optimizer update", "loss scaling"}
    finite = k[k["op_name"].eq("jit(train_step)/reduce_and")]
    assert len(finite) and finite["part"].eq("loss scaling").all()
