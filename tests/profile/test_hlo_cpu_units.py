"""An XLA CPU op's reading on constructed programs (no trace): precision from the HLO (float16
operands upcast to float32 by XLA's CPU backend are float32 math; a fusion that only converts is a
cast) and its owner op name (its own, its fused ones', its neighbours' for one XLA made without)."""

from __future__ import annotations

from test_hlo_units import _i, _module

from mpwatch.profile.hlo_cpu import CpuHlo, owner_op_name


def test_the_owner_op_name_prefers_its_own_then_the_optimizer_then_the_common_scope():
    assert owner_op_name("a/jvp(d)/mul", ["a/adam/sqrt"]) == "a/jvp(d)/mul"
    assert owner_op_name("", ["a/jvp(d)/mul", "a/adam/sqrt"]) == "a/adam/sqrt"
    assert owner_op_name("", ["a/jvp(e)/neg", "a/jvp(d)/mul", "a/jvp(d)/add"]) == "a/jvp(d)/mul"
    assert owner_op_name("", []) == ""


def test_upcast_matrix_math_is_float32_and_a_convert_fusion_is_a_cast():
    x = _i(1, "x", "parameter", "f16", op_name="data[0]")
    w = _i(2, "w", "parameter", "f32")  # a float32 variable (XLA folded its float16 rounding)
    # a fusion converting both to float32 (XLA's CPU backend), then the dot in float32
    p0 = _i(10, "p0", "parameter", "f16")
    cv = _i(11, "convert.1", "convert", "f32", (10,))
    up = _i(3, "convert_fusion", "fusion", "f32", (1,), called_ids=(5,))
    dot = _i(4, "dot.1", "dot", "f32", (3, 2), op_name="jit(train_step)/jvp(dense)/dot_general")
    # a convolution XLA made with no op name: its user names it
    conv = _i(6, "convolution.8", "convolution", "f32", (3, 2))
    user = _i(7, "add.1", "add", "f32", (6,), op_name="jit(train_step)/transpose(jvp(conv2d))/add")
    m = _module([x, w, up, dot, conv, user], fused={5: [p0, cv]})
    hlo = CpuHlo({"jit_train_step(1)": m})
    reading, owner, opcode = hlo.reading("jit_train_step", "dot.1")
    assert (reading.precision, reading.math, opcode) == ("float32", "dot", "dot")
    assert owner == "jit(train_step)/jvp(dense)/dot_general"
    reading, owner, _ = hlo.reading("jit_train_step", "convert_fusion")
    assert reading.is_cast and reading.precision == "mixed"
    reading, owner, _ = hlo.reading("jit_train_step", "convolution.8")
    assert reading.math == "conv" and owner == "jit(train_step)/transpose(jvp(conv2d))/add"
    assert hlo.reading("jit_train_step", "nothing") is None


def test_only_the_programs_that_ran_are_parsed():
    """A trace's metadata plane holds every program the process compiled; the op table needs
    those its events ran, named with their id or without (then every program of that name)."""
    from mpwatch.profile.xplane import ran_programs

    ran = ran_programs(["jit_train_step(12)", "jit_fn"])
    assert ran("jit_train_step(12)")
    assert ran("jit_train_step(40)")  # the same name: HloIndex looks it up by name too
    assert ran("jit_fn(7)") and ran("jit_fn")
    assert not ran("jit__device(3)") and not ran("jit_train_step_2(12)")
    assert not ran_programs([])("jit_train_step(12)")
