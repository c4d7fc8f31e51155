"""Issue 26 on XLA CPU traces captured here from real fits (TensorFlow ``jit_compile=True`` CNN,
a ViT on JAX, both mixed_float16): each XLA op's precision from the HLO instruction it runs and its
owner from the instruction's op name, checked against a truth computed here from the trace with the
protobuf classes TensorFlow ships (``xplane_pb2``, ``hlo_pb2``), not with mpwatch's reader.

The truth, by hand: every event of the host plane with ``hlo_module``/``hlo_op`` stats runs that
instruction of that program (its self time: minus the HLO events nested inside it on its thread).
A dot/convolution (the instruction or one inside the computations it calls) is 16-bit when its two
operands are float16/bfloat16; any other instruction when every float type it reads (operands of
more than one element) and writes is float16/bfloat16.

What the truth says, measured: XLA's CPU backend computes float16 dots and convolutions in float32
(its optimized HLO converts the float16 operands to float32 first), so on these traces the 16-bit
share is small (0% for the CNN, about 2% for the ViT) although the models' policy is float16: the
old "0.0% in 16-bit" was right in figure for the wrong reason (unattributed ops counted as 32), and
the old "outside layers" share (100%, 94%) was wrong: every op now has its owner.
"""

from __future__ import annotations

import glob
import os
import re
from collections import defaultdict
from pathlib import Path

import pandas as pd
import pytest
from repo_scripts import run_fit_script

from mpwatch import contract, profile
from mpwatch.profile.step_parts import PARTS

pytest.importorskip("xprof.convert.raw_to_tool_data")

HERE = Path(__file__).resolve().parent
SIXTEEN = {10, 16}  # F16, BF16
FLOATS = {10, 11, 12, 16}  # F16, F32, F64, BF16
CONV_OR_DOT = ("dot", "convolution")


def _fit(tmp: Path, backend: str) -> dict:
    facts = run_fit_script(HERE / "xla_cpu_fit.py", tmp, backend, CUDA_VISIBLE_DEVICES="-1")
    assert facts["error"] is None and facts["backend"] == backend
    logdir = tmp / "logs"
    traces = glob.glob(str(logdir / "plugins" / "profile" / "*" / "*.xplane.pb"))
    assert len(traces) == 1
    return {"logdir": str(logdir), "trace": traces[0], "facts": facts}


@pytest.fixture(scope="module", params=["tensorflow", "jax"])
def fitted(request, tmp_path_factory, read_events):
    if request.param == "jax":
        pytest.importorskip("jax")
    run = _fit(tmp_path_factory.mktemp(f"xla_cpu_{request.param}"), request.param)
    _, records = read_events(run["logdir"])
    profiles = records.get(contract.KIND_PROFILE, [])
    assert len(profiles) == 1, records.get(contract.KIND_NOTICE)
    run["payload"] = profiles[0][1]
    run["truth"] = _truth(run["trace"])
    return run


def _truth(trace: str) -> pd.DataFrame:
    """One row per XLA host event: program, instruction, self time (us), 16-bit (bool), matrix
    math (``"f32"`` a dot/convolution with float32 operands, ``"other"`` another one, ``""``
    none)."""
    try:
        from tensorflow.compiler.xla.service import hlo_pb2
        from tensorflow.tsl.profiler.protobuf import xplane_pb2
    except Exception as e:  # pragma: no cover - TensorFlow's protobufs missing
        pytest.skip(f"TensorFlow's xplane/hlo protobuf classes are not importable: {e}")
    space = xplane_pb2.XSpace()
    space.ParseFromString(Path(trace).read_bytes())
    planes = {p.name: p for p in space.planes}
    meta = planes["/host:metadata"]
    programs = {}  # program base name -> (by id, by name, computations)
    for em in meta.event_metadata.values():
        for st in em.stats:
            if meta.stat_metadata[st.metadata_id].name != "Hlo Proto":
                continue
            proto = hlo_pb2.HloProto()
            proto.ParseFromString(st.bytes_value)
            mod = proto.hlo_module
            by_id = {i.id: i for c in mod.computations for i in c.instructions}
            programs[re.sub(r"\(\d+\)$", "", em.name)] = (
                by_id,
                {i.name: i for i in by_id.values()},
                {c.id: c for c in mod.computations},
            )

    def elements(instr) -> int:
        n = 1
        for d in instr.shape.dimensions:
            n *= d
        return n

    def types(instr) -> set[int]:
        shapes = list(instr.shape.tuple_shapes) or [instr.shape]
        return {s.element_type for s in shapes}

    def judge(prog: str, name: str) -> tuple[bool, bool]:
        by_id, by_name, comps = programs[prog]
        instr = by_name[name]
        inner, stack = [instr], list(instr.called_computation_ids)
        while stack:
            for i in comps[stack.pop()].instructions:
                inner.append(i)
                stack.extend(i.called_computation_ids)
        math = next((i for i in inner if i.opcode in CONV_OR_DOT), None)
        if math is not None:
            ops = [by_id[o] for o in math.operand_ids[:2] if o in by_id]
            t = {next(iter(types(o))) for o in ops}
            return bool(t) and t <= SIXTEEN, "f32" if t == {11} else "other"
        reads = [by_id[o] for o in instr.operand_ids if o in by_id]
        sized = [o for o in reads if elements(o) > 1] or reads
        floats = set().union(types(instr), *(types(o) for o in sized)) & FLOATS
        return bool(floats) and floats <= SIXTEEN, ""

    host = planes["/host:CPU"]
    names = {k: v.name for k, v in host.stat_metadata.items()}
    rows = []
    for line in host.lines:
        evs = []
        for ev in line.events:
            st = {names[s.metadata_id]: s.str_value or names.get(s.ref_value, "") for s in ev.stats}
            if st.get("hlo_op") and st.get("hlo_module"):
                evs.append([ev.offset_ps, ev.duration_ps, ev.duration_ps, st])
        evs.sort(key=lambda e: (e[0], -e[1]))
        stack: list[list] = []
        for e in evs:
            while stack and stack[-1][0] + stack[-1][1] <= e[0]:
                stack.pop()
            if stack and e[0] + e[1] <= stack[-1][0] + stack[-1][1]:
                stack[-1][2] -= e[1]
            stack.append(e)
        for _, _, own, st in evs:
            prog = re.sub(r"\(\d+\)$", "", st["hlo_module"])
            if prog not in programs or st["hlo_op"] not in programs[prog][1]:
                rows.append((prog, st["hlo_op"], own / 1e6, False, ""))
                continue
            rows.append((prog, st["hlo_op"], own / 1e6, *judge(prog, st["hlo_op"])))
    return pd.DataFrame(rows, columns=["program", "instruction", "us", "is16", "math"])


def _owned(payload: dict) -> float:
    layers = pd.DataFrame(payload["layers"]["data"], columns=payload["layers"]["columns"])
    parts = sum(v for k, v in payload["unattributed_by_category"].items() if k in PARTS)
    return (float(layers["time_us"].sum()) + parts) / payload["total_us"]


def test_the_16bit_share_is_the_hlo_truth(fitted):
    payload, truth = fitted["payload"], fitted["truth"]
    assert payload["tool"] == "xla_host_events" and payload["source"] == "host_ops"
    xla_us = float(truth["us"].sum())
    # the record holds every XLA op of the trace (and, for TensorFlow, its input pipeline)
    assert 0.5 * payload["total_us"] <= xla_us <= 1.01 * payload["total_us"]
    share = float(truth.loc[truth["is16"], "us"].sum()) / payload["total_us"]
    assert abs(payload["share_16bit"] - share) <= 0.05, (payload["share_16bit"], share)


def test_xla_cpu_runs_the_16bit_matrix_math_in_float32(fitted):
    """Why the share is small: the dots and convolutions XLA's CPU backend ran (a good part of the
    step) have float32 operands, though the models' layers compute in float16 (its optimized HLO
    converts their float16 operands to float32)."""
    truth, payload = fitted["truth"], fitted["payload"]
    math = float(truth.loc[truth["math"] != "", "us"].sum())
    f32 = float(truth.loc[truth["math"] == "f32", "us"].sum())
    print(
        f"{fitted['facts']['backend']}: 16-bit {truth.loc[truth['is16'], 'us'].sum():.0f} us; "
        f"matrix math {math / truth['us'].sum():.1%} of {truth['us'].sum():.0f} us, "
        f"{f32 / math:.1%} of it float32; record {payload['share_16bit']:.1%} 16-bit, "
        f"owned {_owned(payload):.1%}, {payload['unattributed_by_category']}"
    )
    # a good part of the step (measured 19-29% of the XLA ops' time on 2 shared cores: the
    # share moves with the machine's load, so the floor is 10%); the claim is the next line
    assert math >= 0.1 * float(truth["us"].sum())
    assert f32 >= 0.9 * math


def test_at_least_90_percent_of_the_time_is_owned(fitted):
    payload = fitted["payload"]
    owned = _owned(payload)
    assert owned >= 0.90, (owned, payload["unattributed_by_category"])
    # what has no owner is listed by category, and is small
    assert payload["unattributed_by_category"].get("other", 0.0) <= 0.10 * payload["total_us"]


def test_the_layers_own_their_math(fitted):
    payload = fitted["payload"]
    layers = pd.DataFrame(payload["layers"]["data"], columns=payload["layers"]["columns"])
    assert layers["time_us"].sum() >= 0.5 * payload["total_us"]
    want = (
        {"conv2d", "conv2d_1", "dense"}
        if fitted["facts"]["backend"] == "tensorflow"
        else {"patches", "mlp1", "q", "k", "v"}
    )
    got = set(layers.loc[layers["time_us"] > 0, "layer"])
    assert want <= got, got


def test_the_raw_trace_read_without_a_model_has_the_same_precision(fitted):
    """``mpwatch diagnose`` on the raw trace (no model): the precision is the HLO's, not unknown."""
    payload = profile.summarize(os.path.dirname(fitted["trace"]), None, ops="auto")
    truth = fitted["truth"]
    share = float(truth.loc[truth["is16"], "us"].sum()) / payload["total_us"]
    assert payload["share_16bit"] == payload["share_16bit"]  # not NaN
    assert abs(payload["share_16bit"] - share) <= 0.05
    if fitted["facts"]["backend"] == "jax":  # JAX names say their layers without a model
        assert _owned(payload) >= 0.90, payload["unattributed_by_category"]


def test_per_program_truth_is_consistent(fitted):
    truth = fitted["truth"]
    per = defaultdict(float)
    for prog, us in zip(truth["program"], truth["us"]):
        per[prog] += us
    # the train step is most of the XLA time
    assert max(per.items(), key=lambda kv: kv[1])[0].startswith(("jit_train_step", "a_inference"))
