"""GPU truth on a real trace: an H100 capture of a mixed_float16 convnet (Keras 3 on JAX).

The trace (``tests/data/h100/seed004_convnet_mixed_float16_bs128.xplane.pb``, with its README)
holds three training steps of a Conv2D 32/64/128 + BatchNormalization convnet at batch
128. Known about it: xprof's ``kernel_stats`` marks 79.5% of device time "Op is TensorCore
eligible" but only 12.5% "Kernel uses TensorCore", while the convolution kernels are float16 Tensor
Core kernels by their names (``sm80/sm90_xmma_*_f16f16_f16f32``, ``cutlass_tensorop_f16_s16816*``,
CUTLASS ``ImplicitGemmConvolution`` on ``half_t``).

The trace is copied once per module into ``<logdir>/plugins/profile/<run>/<host>.xplane.pb`` and
converted once (xprof's converter, a few seconds on 2 cores). Skipped when the file is missing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mpwatch import contract, profile
from mpwatch.profile import kernel_patterns

ROOT = Path(__file__).resolve().parents[2]
TRACE_NAME = "seed004_convnet_mixed_float16_bs128.xplane.pb"
#: a real H100 trace, shipped with the tests (536 KB; its README says how it was captured) so CI,
#: which has no GPU, runs these tests on it
TRACE = ROOT / "tests" / "data" / "h100" / TRACE_NAME
CONV_LAYERS = ("conv2d", "conv2d_1", "conv2d_2")


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    if not TRACE.is_file():
        pytest.skip(f"the H100 trace is not here: {TRACE.resolve()}")
    logdir = tmp_path_factory.mktemp("h100") / "logs"
    run = logdir / "plugins" / "profile" / "2025_01_01_00_00_00"
    run.mkdir(parents=True)
    shutil.copyfile(TRACE, run / "gpu-host.xplane.pb")
    return logdir


@pytest.fixture(scope="module")
def table(logdir):
    return profile.kernel_table(str(logdir))


@pytest.fixture(scope="module")
def result(table):
    return profile.kernel_time(table)


def test_kernel_table_columns_and_the_run_directory_left_alone(logdir, table):
    # xprof's columns, then the HLO instruction's (issue 26)
    assert list(table.columns) == profile.KERNEL_COLUMNS + profile.HLO_COLUMNS
    assert len(table) > 50
    assert (table["total_duration_us"] > 0).all()
    assert table["grid_dim"].str.match(r"^\d+,\d+,\d+$").all()
    assert table["block_dim"].str.match(r"^\d+,\d+,\d+$").all()
    assert table["xprof_tensor_core"].map(lambda v: isinstance(v, bool)).all()
    assert table["op_name"].str.contains("conv_general_dilated").any()
    # the converter ran on a copy: nothing was written beside the trace
    run = next((logdir / "plugins" / "profile").iterdir())
    assert [p.name for p in run.iterdir()] == ["gpu-host.xplane.pb"]


def test_at_least_three_quarters_of_device_time_is_float16_on_tensor_cores(result):
    s = result.summary
    f16_tc = s["tensor_core_by_precision_us"]["float16"] / s["total_us"]
    assert f16_tc >= 0.75, s
    k = result.kernels
    conv = k[k["op_name"].str.endswith("conv_general_dilated") & k["kind"].isin(["conv", "gemm"])]
    assert (conv["precision"] == "float16").all()
    assert (conv["tensor_core"] == "yes").all()


def test_every_convolution_layer_gets_forward_and_backward_time(table, result):
    layers = result.layers.set_index("layer")
    for name in CONV_LAYERS:
        row = layers.loc[name]
        assert row["forward_us"] > 0 and row["backward_us"] > 0, name
        assert row["forward_us"] + row["backward_us"] == pytest.approx(row["time_us"]), name
        # ground truth from xprof's own table: the layer's convolution kernels (op names
        # jvp(name)/conv_general_dilated forward, transpose(jvp(name))/... backward)
        conv = table[
            table["op_name"].isin(
                [
                    f"jit(train_step)/jvp({name})/conv_general_dilated",
                    f"jit(train_step)/transpose(jvp({name}))/conv_general_dilated",
                ]
            )
        ]
        fwd = conv.loc[~conv["op_name"].str.contains("transpose"), "total_duration_us"].sum()
        assert fwd > 0 and len(conv) > 2, name
        assert row["forward_us"] >= fwd - 1e-6, name
        # its convolutions are float16; its XLA fusions too where they read and write only
        # float16 (their precision from the HLO since issue 26; before, unknown)
        assert row["float16_us"] >= conv["total_duration_us"].sum() - 1e-6, name
        assert row["tensor_core_us"] > 0.8 * conv["total_duration_us"].sum(), name
        by_precision = sum(row[f"{p}_us"] for p in kernel_patterns.PRECISIONS)
        assert by_precision == pytest.approx(row["time_us"]), name
        assert row["unknown_us"] == 0, name
    # the backward pass (data and weight gradients) costs more than the forward pass
    assert (
        layers.loc[list(CONV_LAYERS), "backward_us"] > layers.loc[list(CONV_LAYERS), "forward_us"]
    ).all()
    s = result.summary
    owned = layers["time_us"].sum() + s["part_us"] + s["unattributed_us"]
    assert owned == pytest.approx(s["total_us"])


def test_nothing_unknown_is_counted_as_16bit(result):
    k = result.kernels
    s = result.summary
    assert not k.loc[k["precision"] == "unknown", "is_16bit"].any()
    sixteen = k.loc[k["precision"].isin(["float16", "bfloat16"]), "total_duration_us"].sum()
    assert s["share_16bit"] == pytest.approx(sixteen / s["total_us"])
    # XLA's fusions and copies name no type: by their names unknown, and never 16-bit; the HLO
    # instruction each runs gives its precision (issue 26); the CUDA graph's memcpy kernels are
    # its float32 copies
    xla = k[k["pattern"].isin(["xla_loop_fusion", "xla_gemm_fusion", "xla_fusion", "copy"])]
    assert len(xla) > 30
    assert (xla["name_precision"] == "unknown").all()
    assert (xla["precision_source"] == "hlo").all()
    assert not xla["precision"].eq("unknown").any()
    copies = xla[xla["kernel_name"].str.startswith("memcpy")]
    assert len(copies) and (copies["hlo_opcode"] == "copy").all()
    assert (copies["precision"] == "float32").all()


def test_the_unknown_share_is_reported(result):
    s = result.summary
    k = result.kernels
    unknown = k.loc[k["precision"] == "unknown", "total_duration_us"].sum()
    assert s["unknown_share"] == pytest.approx(unknown / s["total_us"])
    assert s["unknown_share"] == 0.0  # 20.5% by the names alone, before issue 26
    assert sum(s["by_precision_share"].values()) == pytest.approx(1.0)
    assert s["unknown_kernels"] == []  # every kernel of this trace belongs to a known family


def test_xprof_tensor_core_share_is_reported_next_to_mpwatch(result):
    s = result.summary
    assert s["xprof_tensor_core_share"] == pytest.approx(0.125, abs=0.005)
    assert s["xprof_eligible_share"] == pytest.approx(0.795, abs=0.005)
    assert s["tensor_core_share"] > 6 * s["xprof_tensor_core_share"]
    # every kernel xprof marks is a Tensor Core kernel by its name too, so the difference is
    # exactly the time xprof's name list misses
    assert s["tensor_core_missed_by_xprof_share"] == pytest.approx(
        s["tensor_core_share"] - s["xprof_tensor_core_share"]
    )
    k = result.kernels
    marked = k[k["xprof_tensor_core"].astype(bool)]
    assert (marked["name_tensor_core"] == "yes").all() and (marked["tensor_core"] == "yes").all()


def test_eligible_time_runs_on_tensor_cores(table, result):
    s = result.summary
    assert s["eligible_share"] == pytest.approx(s["xprof_eligible_share"], abs=0.01)
    assert s["eligible_not_tensor_core_us"] == 0.0  # no float32 or CUDA-core conv kernel
    # the dense layer's matmuls are XLA Triton fusions (gemm_fusion_dot_general_*): their names
    # say neither type nor Tensor Core (unknown by name); their HLO multiplies float16 operands on
    # an sm90 GPU: Tensor Cores (issue 26)
    gemm = table[table["kernel_name"].str.startswith("gemm_fusion_dot_general")]
    assert len(gemm) == 2 and (gemm["op_name_from"] == "hlo").all()
    assert (gemm["hlo_tensor_core"] == "yes").all() and (gemm["hlo_precision"] == "float16").all()
    k = result.kernels
    named = k[k["kernel_name"].str.startswith("gemm_fusion_dot_general")]
    assert (named["name_tensor_core"] == "unknown").all()
    assert s["eligible_tensor_core_unknown_us"] == 0.0


def test_layer_names_given_as_a_list(table, result):
    named = profile.kernel_time(table, list(CONV_LAYERS))
    got = named.layers.set_index("layer")
    want = result.layers.set_index("layer")
    assert set(got.index) == set(CONV_LAYERS)
    for name in CONV_LAYERS:
        assert got.loc[name, "time_us"] == pytest.approx(want.loc[name, "time_us"])


def test_payload_is_a_json_record(result, logdir):
    payload = result.payload(steps=[1, 2, 3], trace_dir=str(logdir))
    text = json.dumps(payload)
    back = json.loads(text)
    assert back["kernel_summary"]["xprof_tensor_core_share"] == pytest.approx(0.125, abs=0.005)
    assert back["kernel_layers"]["columns"] == profile.LAYER_KERNEL_COLUMNS
    layer_rows = {
        r[0]: dict(zip(back["kernel_layers"]["columns"], r)) for r in back["kernel_layers"]["data"]
    }
    assert set(CONV_LAYERS) <= set(layer_rows)
    assert back["kernels_dropped"] == 0
    assert len(back["kernels"]["data"]) == len(result.kernels)
    assert len(contract.encode_payload(payload)) < contract.MAX_RECORD_BYTES
    assert back["precisions"] == list(kernel_patterns.PRECISIONS)


def test_summarize_kernels_from_the_logdir(logdir, result):
    payload = profile.summarize_kernels(str(logdir), steps=[1, 2, 3])
    assert payload["kernel_summary"]["total_us"] == pytest.approx(result.summary["total_us"])
    assert payload["trace_dir"].endswith("2025_01_01_00_00_00")
