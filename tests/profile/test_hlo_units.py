"""The HLO's reading of a kernel on constructed programs (no trace): precision and Tensor Core use
by operand types, precision config and compute capability; a CUDA graph's kernels along the
schedule (library calls, reused fusion kernels, copies, helpers); the named parts of the step and
every kernel's owner."""

from __future__ import annotations

import pandas as pd
import pytest

from mpwatch.profile.hlo import HloInstruction, HloModule
from mpwatch.profile.hlo_events import align_run
from mpwatch.profile.hlo_kernels import _tensor_core, compute_capability, read_instruction
from mpwatch.profile.kernel_truth import agree, kernel_owners, merge_hlo
from mpwatch.profile.step_parts import step_part


def _module(instrs, schedule=None, fused=None):
    """A program: ``instrs`` in the entry computation (id 1); ``fused``: computation id ->
    instructions."""
    m = HloModule(name="jit_f(1)", entry=1)
    for cid, group in [(1, instrs), *(fused or {}).items()]:
        m.computations[cid] = [i.id for i in group]
        for i in group:
            i.computation = cid
            m.instructions[i.id] = i
    if schedule is not None:
        m.schedule[1] = [m.instructions[i].id if isinstance(i, int) else i for i in schedule]
    m.index()
    return m


def _i(id_, name, opcode, dtype, ops=(), elements=1024, **kw):
    return HloInstruction(
        id=id_,
        name=name,
        opcode=opcode,
        dtype=dtype,
        types=(dtype,),
        elements=elements,
        operand_ids=tuple(ops),
        **kw,
    )


def _reading(m, name, cc, kernel="k"):
    return _tensor_core(read_instruction(m, m.by_name[name]), cc, kernel)


def test_a_cublas_call_by_its_operands_and_the_device():
    a, b = _i(1, "a", "parameter", "bf16"), _i(2, "b", "parameter", "bf16")
    call = _i(3, "gemm", "custom-call", "bf16", (1, 2), custom_call_target="__cublas$lt$matmul")
    m = _module([a, b, call])
    assert _reading(m, "gemm", (9, 0)) == (
        "bfloat16",
        "yes",
        "bfloat16 operands on compute capability 9.0",
    )
    p, tc, why = _reading(m, "gemm", (7, 5))  # Turing: float16 Tensor Cores, no bfloat16
    assert (p, tc) == ("bfloat16", "no") and "8.0" in why
    assert _reading(m, "gemm", None)[1] == "unknown"


def test_float32_dots_at_tf32_where_the_precision_config_allows():
    a, b = _i(1, "a", "parameter", "f32"), _i(2, "b", "parameter", "f32")
    default = _i(3, "d", "dot", "f32", (1, 2), operand_precision=(0, 0))
    highest = _i(4, "h", "dot", "f32", (1, 2), operand_precision=(2, 2))
    alg = _i(5, "g", "dot", "f32", (1, 2), algorithm="ALG_DOT_F32_F32_F32")
    m = _module([a, b, default, highest, alg])
    assert _reading(m, "d", (8, 0))[:2] == ("tf32", "yes")
    assert _reading(m, "d", (7, 0))[:2] == ("float32", "no")  # Volta: no TF32
    assert _reading(m, "h", (9, 0))[:2] == ("float32", "no")
    assert "not allowed" in _reading(m, "h", (9, 0))[2]
    assert _reading(m, "g", (9, 0))[:2] == ("float32", "no")


def test_a_triton_gemm_fusion_by_the_dot_inside_and_helpers_of_a_library_call():
    x, w = _i(1, "x", "parameter", "f16"), _i(2, "w", "parameter", "f16")
    p0, p1 = _i(10, "p0", "parameter", "f16"), _i(11, "p1", "parameter", "f16")
    dot = _i(12, "dot.1", "dot", "f32", (10, 11))
    fusion = _i(3, "gemm_fusion_dot.1", "fusion", "f32", (1, 2), called_ids=(2,))
    m = _module([x, w, fusion], fused={2: [p0, p1, dot]})
    assert _reading(m, "gemm_fusion_dot.1", (8, 0))[:2] == ("float16", "yes")
    # a split-K reduction kernel of the same call: no Tensor Cores, and says why
    p, tc, why = _reading(
        m, "gemm_fusion_dot.1", (8, 0), "void cublasLt::splitKreduce_kernel<32, 16, int, float>"
    )
    assert tc == "no" and why.startswith("helper kernel")


def test_elementwise_fusions_by_what_they_read_and_write_and_casts():
    x16, x32 = _i(1, "x16", "parameter", "f16"), _i(2, "x32", "parameter", "f32")
    scale = _i(3, "scale", "parameter", "f32", elements=1)
    q0, q1 = _i(20, "q0", "parameter", "f16"), _i(21, "q1", "parameter", "f32", elements=1)
    mul = _i(22, "m", "multiply", "f16", (20, 21))
    only16 = _i(4, "f16_fusion", "fusion", "f16", (1, 3), called_ids=(2,))  # scalar aside
    mixed = _i(5, "mixed_fusion", "fusion", "f32", (1,), called_ids=(2,))
    c0 = _i(30, "c0", "parameter", "f32")
    conv = _i(31, "c", "convert", "f16", (30,))
    cast = _i(6, "wrapped_convert", "fusion", "f16", (2,), called_ids=(3,))
    pred = _i(7, "all_finite", "fusion", "pred", (8,), elements=1)
    ints = _i(8, "i", "parameter", "s32")
    m = _module(
        [x16, x32, scale, only16, mixed, cast, pred, ints],
        fused={2: [q0, q1, mul], 3: [c0, conv]},
    )
    assert read_instruction(m, m.by_name["f16_fusion"]).precision == "float16"
    assert read_instruction(m, m.by_name["mixed_fusion"]).precision == "mixed"
    r = read_instruction(m, m.by_name["wrapped_convert"])
    assert r.precision == "mixed" and r.is_cast and r.converts == 1
    assert read_instruction(m, m.by_name["all_finite"]).precision == "integer"
    assert _reading(m, "f16_fusion", (9, 0))[1:] == ("no", "no matrix math")


def test_a_command_buffers_kernels_along_the_schedule():
    ins = [
        _i(1, "p", "parameter", "f16"),
        _i(2, "loop_add_fusion", "fusion", "f16"),
        _i(3, "cublas-gemm.1", "custom-call", "f16", custom_call_target="__cublas$gemm"),
        _i(4, "gte", "get-tuple-element", "f16"),
        _i(5, "input_reduce_fusion", "fusion", "f32"),
        _i(6, "input_reduce_fusion.1", "fusion", "f32"),  # its kernel reuses the one above
        _i(7, "copy.1", "copy", "f32"),
        _i(8, "cudnn$fmha", "custom-call", "f16", custom_call_target="__cudnn$fmhaSoftmax"),
    ]
    m = _module(ins, schedule=[1, 2, 3, 4, 5, 6, 7, 8])
    table = {
        "loop_add_fusion": ins[1],
        "input_reduce_fusion": ins[4],
        "input_reduce_fusion_1": ins[5],
    }
    names = [
        "loop_add_fusion",
        "nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTN",
        "void cublasLt::splitKreduce_kernel<32, 16, int, float, __half>(int)",
        "input_reduce_fusion",
        "input_reduce_fusion",  # reused for input_reduce_fusion.1
        "memcpy32_post",
        "cudnn_generated_fort_native_sdpa_sm90_knob_7_64x128x64_4x1x1_kernel0_0",
    ]
    got = [i.name if i is not None else None for i in align_run(names, m, table)]
    assert got == [
        "loop_add_fusion",
        "cublas-gemm.1",
        "cublas-gemm.1",
        "input_reduce_fusion",
        "input_reduce_fusion.1",
        "copy.1",
        "cudnn$fmha",
    ]
    # a run that starts with library kernels: found backwards from its first named kernel
    got = align_run(["Memset 3", "nvjet_hsh_64x8", "input_reduce_fusion"], m, table)
    assert [i.name for i in got] == ["cublas-gemm.1", "cublas-gemm.1", "input_reduce_fusion"]


def test_the_compute_capability_from_kernel_names_without_plane_stats():
    assert compute_capability([], ["sm80_xmma_gemm", "sm90_xmma_fprop", "loop_fusion"]) == (
        (9, 0),
        "kernel names",
    )
    assert compute_capability([], ["loop_fusion"]) == (None, "")


@pytest.mark.parametrize(
    "name, part",
    [
        ("jit(train_step)/cond/branch_1_fun/adam/sqrt", "optimizer update"),
        ("StatefulPartitionedCall/adam/ReadVariableOp", "optimizer update"),
        ("jit(train_step)/cond", "loss scaling"),
        ("jit(train_step)/is_finite", "loss scaling"),
        ("jit(train_step)/jvp(compile_loss)/sparse_categorical_crossentropy/neg", "loss"),
        ("StatefulPartitionedCall/compile_metrics/accuracy/Sum", "metrics"),
        ("jit(train_step)/jvp()/convert_element_type", "input"),
        ("IteratorGetNext", "input"),
        ("jit(train_step)/jvp(dense)/cond/select_n", None),  # a layer's own cond
        ("jit(train_step)/jvp(dense)/dot_general", None),
        ("", None),
    ],
)
def test_named_parts_of_the_step(name, part):
    assert step_part(name) == part


def test_owners_from_own_and_fused_op_names():
    cond = "jit(train_step)/cond"
    adam = "jit(train_step)/cond/branch_1_fun/adam/mul"
    bn = "jit(train_step)/jvp(batch_normalization)/mul"
    df = pd.DataFrame(
        {
            "op_name": [
                cond,
                cond,
                "XlaModule",
                "jit(train_step)/transpose(jvp())/convert",
                bn,
                "",
            ],
            "hlo_op_names": [
                (cond, adam),
                (cond, "jit(train_step)/cond/branch_1_fun/eq"),
                ("", adam, bn),
                ("jit(train_step)/jvp(compile_loss)/x", "jit(train_step)/jvp(compile_loss)/y", bn),
                (bn, adam),
                (),
            ],
            "hlo_state_part": ["", "", "", "", "", "metrics"],
        }
    )
    got = kernel_owners(df, ["batch_normalization"])
    assert [p if isinstance(p, str) else None for p in got["part"]] == [
        "optimizer update",  # the loss scaling's cond around Adam's update
        "loss scaling",
        "optimizer update",
        "loss",  # the model's own level: most of what is fused in
        None,  # its own op name is a layer's
        "metrics",  # from the train step's argument it reads
    ]
    assert got["layer"].tolist()[4] == "batch_normalization"


def test_the_hlo_decides_and_the_name_corroborates():
    df = pd.DataFrame(
        {
            "precision": ["float16", "unknown", "float32"],
            "tensor_core": ["yes", "unknown", "no"],
            "evidence": ["name", "", "name"],
            "hlo_precision": ["float16", "mixed", "float16"],
            "hlo_tensor_core": ["yes", "no", "no"],
            "hlo_tensor_core_why": ["float16 operands", "no matrix math", "no matrix math"],
            "hlo_is_cast": [False, True, False],
        }
    )
    got = merge_hlo(df)
    assert got["precision"].tolist() == ["float16", "mixed", "float16"]
    assert got["precision_source"].tolist() == ["hlo", "hlo", "hlo"]
    assert got["precision_disagrees"].tolist() == [False, False, True]
    assert got["is_cast"].tolist() == [False, True, False]
    assert agree("float32", "tf32") and not agree("bfloat16", "float16")


def test_a_loop_bodys_kernels_along_its_own_schedule():
    body = [
        _i(20, "loop_mul_fusion", "fusion", "f16"),
        _i(21, "cublas-gemm.7", "custom-call", "f16", custom_call_target="__cublas$gemm"),
    ]
    m = _module([_i(1, "while", "while", "f16")], schedule=[1], fused={2: body})
    m.schedule[2] = [20, 21]
    table = {"loop_mul_fusion": body[0]}
    got = align_run(["loop_mul_fusion", "nvjet_hsh_64x8"], m, table)
    assert [i.name for i in got] == ["loop_mul_fusion", "cublas-gemm.7"]


def test_a_cudnn_fusion_is_a_library_call_and_loops_launch_nothing_themselves():
    ins = [
        _i(1, "loop_add_fusion", "fusion", "f16"),
        _i(2, "while.3", "while", "f16"),  # its body launches the kernels, not it
        _i(3, "cudnn-fusion.2", "fusion", "f16", called_ids=(2,)),  # cuDNN's GEMM fusion
        _i(4, "loop_mul_fusion", "fusion", "f16"),
    ]
    inner = [_i(10, "p0", "parameter", "f16"), _i(11, "dot.9", "dot", "f16", (10, 10))]
    m = _module(ins, schedule=[1, 2, 3, 4], fused={2: inner})
    table = {"loop_add_fusion": ins[0], "loop_mul_fusion": ins[3]}
    names = ["loop_add_fusion", "cudnn_generated_fort_native_gemm_kernel", "loop_mul_fusion"]
    got = align_run(names, m, table)
    assert [i.name for i in got] == ["loop_add_fusion", "cudnn-fusion.2", "loop_mul_fusion"]


def test_a_cuda_core_kernel_for_16bit_operands_is_not_on_tensor_cores():
    """The HLO says float16 matrix math a Tensor Core could run; the library ran a SIMT kernel
    (its name says so): not on Tensor Cores, and why."""
    a, b = _i(1, "a", "parameter", "f16"), _i(2, "b", "parameter", "f16")
    call = _i(3, "gemm", "custom-call", "f16", (1, 2), custom_call_target="__cublas$gemm")
    m = _module([a, b, call])
    p, tc, why = _reading(m, "gemm", (8, 0), "cutlass_80_simt_hgemm_128x128_8x2_nn_align1")
    assert (p, tc) == ("float16", "no") and "CUDA-core" in why


def test_a_kernel_xprof_names_no_op_takes_what_is_fused_into_it():
    bn = "jit(train_step)/jvp(batch_normalization)/mul"
    df = pd.DataFrame(
        {"op_name": ["XlaModule"], "hlo_op_names": [(bn, bn)], "hlo_state_part": [""]}
    )
    got = kernel_owners(df, None)
    assert got["layer"].tolist() == ["batch_normalization"]
