"""Builders of logdirs for the reader, advisor, report and CLI tests, written with
``RunWriter`` (the contract's only writer; no training). Each builder returns the truth it
wrote, so tests check the reader against what was written, not against the reader's own output."""

from __future__ import annotations

import math
import os

import numpy as np

from mpwatch import contract
from mpwatch.record.writer import RunWriter

# the contract's column names (mpwatch/contract.py)
LAYER_COLUMNS = contract.LAYERS_COLUMNS
PROBE_LAYER_COLUMNS = contract.PROBE_LAYER_COLUMNS
PROBE_VARIABLE_COLUMNS = contract.PROBE_VARIABLE_COLUMNS



def run_info(policy: str = "mixed_float16", batch_size: int | None = 30, tc: bool = True) -> dict:
    compute = policy.replace("mixed_", "")
    return {
        "policy": policy,
        "compute_dtype": compute,
        "variable_dtype": "float32",
        "loss_scale": {
            "kind": "dynamic" if policy == "mixed_float16" else "none",
            "reason": None if policy == "mixed_float16" else f"{policy} has no loss scale",
            "initial": 32768.0 if policy == "mixed_float16" else None,
            "growth_interval": 2000 if policy == "mixed_float16" else None,
        },
        "model": {"name": "cnn", "class": "Sequential", "kind": "sequential", "params": 12345},
        "optimizer": "Adam",
        "strategy": "default",
        "num_replicas": 1,
        "steps_per_execution": 1,
        "batch_size": batch_size,
        "log_every": 10,
        "device": {
            "type": "GPU" if tc else "CPU",
            "name": "NVIDIA A100" if tc else "cpu",
            "compute_capability": "8.0" if tc else None,
            "tensor_cores": tc,
        },
        "versions": {"mpwatch": "0", "tensorflow": "2.21", "keras": "3"},
    }


def layer_rows(policy: str = "mixed_float16", output_dtype: str | None = None) -> list[list]:
    c = policy.replace("mixed_", "")
    out = output_dtype or c
    return [
        ["conv2d", "conv2d", "Conv2D", 1, policy, c, "float32", c, c, 840, 840,
         {"filters": 30, "input_channels": 3}, False, False, None],
        ["dense", "dense", "Dense", 1, policy, c, "float32", c, c, 4160, 4160,
         {"units": 64, "kernel_input_dim": 64}, True, False, None],
        ["layer_norm", "layer_norm", "LayerNormalization", 1, policy, c, "float32", c,
         "float32" if c != "float32" else c, 128, 128, {}, None, False,
         "normalises in float32 inside" if c != "float32" else None],
        ["predictions", "predictions", "Dense", 1, policy, c if out != "float32" else "float32",
         "float32", out, out, 650, 650, {"units": 10, "kernel_input_dim": 64}, False, True, None],
    ]  # fmt: skip


def probe_payload(step: int, scale: float, mode: str = "float16") -> dict:
    layers = [
        ["conv2d", 800, 8, 0.01, 1e-3, 2e-3, 20000.0, math.log2(65504 / 20000), 0.0, False],
        ["dense", 4000, 320, 0.08, 2e-3, 3e-3, 30.0, math.log2(65504 / 30), 0.0, False],
        ["layer_norm", 100, 0, 0.0, 1e-4, 0.5, 3.0, math.log2(65504 / 3), 0.0, False],
        ["predictions", 600, 0, 0.0, 1e-3, 0.03, 1.0, math.log2(65504), 0.0, False],
    ]
    variables = [
        ["conv2d/kernel", "conv2d", 810, 800, 8, 0.01, 1e-3],
        ["dense/kernel", "dense", 4096, 4000, 320, 0.08, 2e-3],
    ]
    return {
        "mode": mode,
        "loss_scale": scale,
        "reference": "float32_twin",
        "reference_note": None,
        "variables": contract.table(PROBE_VARIABLE_COLUMNS, variables),
        "layers": contract.table(PROBE_LAYER_COLUMNS, layers),
        "model": {
            "ref_nonzero": 5500,
            "underflow_count": 328,
            "underflow_fraction": 328 / 5500,
            "grad_rel_error": 2e-3,
            "max_abs_activation": 20000.0,
            "first_nonfinite_layer": None,
        },
        "histogram": {
            "edges_log2": list(range(-40, -9)),
            "counts": [int(x) for x in np.arange(30) * 3 + step % 7],
            "zeros": 4,
            "window_log2": [-24 - math.log2(scale), math.log2(65504) - math.log2(scale)],
        },
        "sweep": contract.table(
            ["scale_log2", "scale", "predicted_underflow_fraction", "predicted_overflow_fraction"],
            [[k, 2.0**k, max(0.0, 0.1 - 0.005 * k), 0.0 if k < 20 else 0.5] for k in range(25)],
        ),
        "recommended_scale": 131072.0,
    }


def profile_payload() -> dict:
    return {
        "steps": [5, 8],
        "device": "GPU",
        "total_us": 10000.0,
        "unattributed_us": 500.0,
        "cast_us": 2000.0,
        "cast_share": 0.2,
        "share_16bit": 0.3,
        "layers": contract.table(
            ["layer", "time_us", "time_16bit_us", "time_32bit_us", "ops", "share"],
            [
                ["conv2d", 5000.0, 1000.0, 4000.0, 12, 0.5],
                ["dense", 2500.0, 2000.0, 500.0, 4, 0.25],
            ],
        ),
        "op_types": contract.table(
            ["op_type", "time_us", "bits", "count", "kept_float32_by_amp"],
            [["Conv2D", 5000.0, 16, 10, False], ["Cast", 2000.0, 32, 40, False]],
        ),
        "trace_dir": "plugins/profile/x",
    }


def write_mixed_run(path: str, steps: int = 400, step_time: float = 10.0) -> dict:
    """A mixed_float16 run with the problems the advisor names (see the test_advisor tests)."""
    w = RunWriter(path)
    truth: dict = {"steps": steps}
    w.record(contract.KIND_RUN_INFO, 0, run_info())
    w.record(contract.KIND_LAYERS, 1, {"layers": contract.table(LAYER_COLUMNS, layer_rows())})
    scale = np.where(np.arange(1, steps + 1) <= 5, 2.0 ** (16 - np.arange(1, steps + 1)), 1024.0)
    skipped = np.zeros(steps)
    skipped[:5] = 1
    skipped[np.arange(1, steps + 1) % 20 == 0] = 1  # 5% after warm-up
    w.scalar_series(contract.LOSS_SCALE, list(range(1, steps + 1)), list(scale))
    w.scalar_series(contract.STEP_SKIPPED, list(range(1, steps + 1)), list(skipped))
    loss = {}
    for s in range(10, steps + 1, 10):
        loss[s] = 2.0 / math.sqrt(s)
        w.scalars(
            s,
            {
                contract.TRAIN_LOSS: loss[s],
                contract.STEP_TIME_MS: step_time,
                contract.PEAK_MEMORY_MB: 500.0,
                contract.GRAD_SUBNORMAL_FRACTION: 0.01,
                contract.SKIPPED_STEPS_TOTAL: float(skipped[:s].sum()),
            },
        )
    for s in (steps // 2, steps):
        w.record(contract.KIND_PROBE, s, probe_payload(s, 1024.0))
    w.record(
        contract.KIND_GRAD_VARIABLES,
        steps,
        {
            "loss_scale": 1024.0,
            "variables": contract.table(
                ["variable", "layer", "size", "zero_fraction", "subnormal_fraction",
                 "nonfinite_count", "max_abs", "headroom_bits"],
                [["dense/kernel", "dense", 4096, 0.1, 0.01, 0, 3.0, 14.4]],
            ),
        },
    )  # fmt: skip
    w.record(contract.KIND_PROFILE, 8, profile_payload())
    w.record(contract.KIND_NOTICE, 3, {"part": "memory", "level": "info", "message": "CPU RSS"})
    w.close()
    truth.update(scale=scale, skipped=skipped, loss=loss)
    return truth


def write_float32_run(path: str, steps: int = 400, step_time: float = 20.0) -> None:
    w = RunWriter(path)
    w.record(contract.KIND_RUN_INFO, 0, run_info("float32", batch_size=32))
    w.record(
        contract.KIND_LAYERS, 1, {"layers": contract.table(LAYER_COLUMNS, layer_rows("float32"))}
    )
    for s in range(10, steps + 1, 10):
        w.scalars(
            s,
            {
                contract.TRAIN_LOSS: 2.0 / math.sqrt(s) * 1.01,
                contract.STEP_TIME_MS: step_time,
                contract.PEAK_MEMORY_MB: 900.0,
            },
        )
    w.close()


def write_plain_scalars(path: str, tag: str = "epoch_loss", n: int = 3) -> None:
    """A run with only a non-mpwatch scalar."""
    w = RunWriter(path)
    w.scalar_series(tag, list(range(n)), [1.0 / (i + 1) for i in range(n)])
    w.close()


def event_files(path: str) -> list[str]:
    return sorted(os.path.join(path, f) for f in os.listdir(path) if "tfevents" in f)
