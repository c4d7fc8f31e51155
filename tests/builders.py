"""Builders of logdirs for the reader, advisor, report and CLI tests, written with
``RunWriter`` (the contract's only writer; no training). Each builder returns the truth it
wrote, so tests check the reader against what was written, not against the reader's own output."""

from __future__ import annotations

import math
import os

import numpy as np
import pandas as pd

from mpwatch import contract
from mpwatch.read.run import Run
from mpwatch.record.runtime.writer import RunWriter

# the contract's column names (mpwatch/contract/)
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
        ["conv2d/kernel", "conv2d", 810, 800, 8, 0.01, 1e-3, 0.25],
        ["dense/kernel", "dense", 4096, 4000, 320, 0.08, 2e-3, 0.03],
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
    """A mixed_float16 run with the problems the judge names (see the tests in tests/judge)."""
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


def write_clean_run(path: str) -> None:
    """A healthy mixed_float16 run on an A100 (info findings only: no error, no warning)."""
    w = RunWriter(path)
    device = {"type": "GPU", "name": "NVIDIA A100", "compute_capability": "8.0",
              "tensor_cores": True}  # fmt: skip
    w.record(contract.KIND_RUN_INFO, 0, {"policy": "mixed_float16", "compute_dtype": "float16",
                                        "batch_size": 64, "device": device})  # fmt: skip
    w.scalar_series(contract.LOSS_SCALE, list(range(1, 51)), [32768.0] * 50)
    w.scalar_series(contract.STEP_SKIPPED, list(range(1, 51)), [0.0] * 50)
    w.close()


def write_plain_scalars(path: str, tag: str = "epoch_loss", n: int = 3) -> None:
    """A run with only a non-mpwatch scalar."""
    w = RunWriter(path)
    w.scalar_series(tag, list(range(n)), [1.0 / (i + 1) for i in range(n)])
    w.close()


def event_files(path: str) -> list[str]:
    return sorted(os.path.join(path, f) for f in os.listdir(path) if "tfevents" in f)


# --- constructed Runs for the judge's rule tests (pure pandas: no event files) -------------------
def make_run(name="run", policy="mixed_float16", layers=None, scalars=None, probes=None,
             profile=None, info=None, notices=None) -> Run:  # fmt: skip
    """A Run built in memory: ``scalars`` tag -> {step: value}; ``probes`` step -> (model row,
    [probe layer rows]) (see :func:`model_row`, :func:`probe_layer`)."""
    run = Run(name=name, path=f"/logs/{name}")
    run.info = info if info is not None else run_info(policy)
    rows = layers if layers is not None else layer_rows(policy)
    # rows as a layers record writes them now (with the graph columns), or as older ones did
    full = LAYER_COLUMNS + contract.LAYERS_GRAPH_COLUMNS
    lt = pd.DataFrame(rows, columns=full if rows and len(rows[0]) == len(full) else LAYER_COLUMNS)
    run.layers = lt
    if scalars:
        steps = sorted({s for ser in scalars.values() for s in ser})
        df = pd.DataFrame(index=pd.Index(steps, dtype="int64", name="step"))
        for tag, ser in scalars.items():
            df[tag] = pd.Series(ser, dtype="float64")
        run.scalars = df
    if probes:
        rows, models = [], []
        for step, (model, layer_rows_) in probes.items():
            for r in layer_rows_:
                rows.append([step, *r])
            models.append({"step": step, **model})
        run.probe_layers = pd.DataFrame(rows, columns=["step", *PROBE_LAYER_COLUMNS])
        run.probe_model = pd.DataFrame(models)
        run.records[contract.KIND_PROBE] = [(s, {}) for s in probes]
    run.profile = profile
    run.notices = notices or []
    return run


def graph_row(name, cls="Dense", *, inputs=None, act=None, width=None, dims=None, out=False,
              dtype="float16", params=10) -> list:  # fmt: skip
    """One layer-table row as the recorder writes it now: :data:`LAYER_COLUMNS` then the graph
    columns (``activation``, ``output_width``, ``inputs``: the names feeding it, None unknown).
    ``dtype`` is its compute and output dtype under mixed_float16."""
    dims = dict(dims or {})
    aligned = all(v % 8 == 0 for v in dims.values()) if dims else None
    pol = "float32" if dtype == "float32" else "mixed_float16"
    return [name, f"m/{name}", cls, 1, pol, dtype, "float32", dtype, dtype, params, params, dims,
            aligned, out, None, act, width, inputs]  # fmt: skip


def probe_layer(name, uf=0.0, rel=1e-4, mx=10.0, nonfinite=False) -> list:
    """One row of a probe's layers table."""
    head = math.log2(65504 / mx) if mx and math.isfinite(mx) and mx > 0 else float("-inf")
    return [name, 1000, int(uf * 1000), uf, 1e-3, rel, mx, head, 0.0, nonfinite]


def model_row(uf=0.0, scale=32768.0, rec=32768.0, mode="float16", mx=10.0, first=None) -> dict:
    """A probe's model-wide row."""
    return {"ref_nonzero": 1000, "underflow_count": int(uf * 1000), "underflow_fraction": uf,
            "grad_rel_error": 1e-3, "max_abs_activation": mx, "first_nonfinite_layer": first,
            "loss_scale": scale, "recommended_scale": rec, "mode": mode,
            "reference": "float32_twin"}  # fmt: skip


def healthy_layers() -> list[list]:
    """layer_rows("mixed_float16") with nothing to advise: predictions computes and outputs in
    float32, conv2d's filters aligned (its 3 input channels are not the user's to change)."""
    rows = [
        r[:7] + ["float32", "float32"] + r[9:] if r[0] == "predictions" else r
        for r in layer_rows("mixed_float16")
    ]
    rows[3][5] = "float32"
    rows[3][4] = "float32"
    rows[0][11] = {"filters": 32, "input_channels": 3}
    rows[0][12] = False
    return rows


def healthy_run(**kw) -> Run:
    """A mixed_float16 run with nothing to fix (batch 64, scale 2^15, no skips, a clean probe)."""
    info = run_info("mixed_float16", batch_size=64)
    steps = range(1, 1001)
    scalars = {
        contract.LOSS_SCALE: {s: 32768.0 for s in steps},
        contract.STEP_SKIPPED: {s: 0.0 for s in steps},
    }
    probes = {500: (model_row(0.001), [probe_layer("conv2d"), probe_layer("dense")])}
    return make_run(layers=healthy_layers(), info=info, scalars=scalars, probes=probes, **kw)


def perf_scalars(step_ms, loss_factor, mem) -> dict:
    """Step time, peak memory and a falling training loss at steps 10..200."""
    steps = range(10, 201, 10)
    return {contract.STEP_TIME_MS: {s: step_ms for s in steps},
            contract.PEAK_MEMORY_MB: {s: mem for s in steps},
            contract.TRAIN_LOSS: {s: loss_factor / s for s in steps}}  # fmt: skip


def findings_of(findings, rule) -> list:
    """The findings of one rule, in order."""
    return [f for f in findings if f.rule == rule]


def assert_findings(found, expected) -> None:
    """``found`` (Findings) matches ``expected`` (one dict per finding, in order).

    Keys of an expected dict: a Finding attribute (equal; a bool: identical), ``data`` (a dict:
    each key equal in ``Finding.data``), ``title_has`` / ``evidence_has`` / ``fix_has`` (a
    substring, or a tuple of them). Every finding must also carry the rule's why and source.
    """
    got = [(f.rule, f.severity, f.layer, f.title) for f in found]
    assert len(found) == len(expected), f"expected {len(expected)} findings, got {got}"
    for i, (f, exp) in enumerate(zip(found, expected)):
        assert f.why and f.source, f"finding {i} lacks why or source: {f}"
        for key, want in exp.items():
            if key.endswith("_has"):
                text = getattr(f, key[: -len("_has")])
                for part in (want,) if isinstance(want, str) else want:
                    assert part in text, f"finding {i}: {part!r} not in {key[:-4]} {text!r}"
            elif key == "data":
                for k, v in want.items():
                    ok = f.data.get(k) is v if isinstance(v, bool) else f.data.get(k) == v
                    assert ok, f"finding {i}: data[{k!r}] = {f.data.get(k)!r}, expected {v!r}"
            else:
                have = getattr(f, key)
                ok = have is want if isinstance(want, bool) else have == want
                assert ok, f"finding {i}: {key} = {have!r}, expected {want!r}"


# --- decoded data for Run accessors (tests/read/test_run_accessors.py): no event files -----------
def skip_scalars(
    flags: dict[int, float] | None = None, totals: dict[int, float] | None = None
) -> dict:
    """``run_from_records`` scalars: the per-step skip flag and/or the cumulative skip total."""
    out = {}
    if flags is not None:
        out[contract.STEP_SKIPPED] = (list(flags), list(flags.values()))
    if totals is not None:
        out[contract.SKIPPED_STEPS_TOTAL] = (list(totals), list(totals.values()))
    return out


def probe_records(steps_modes: list[tuple[int, str]]) -> list[tuple[int, dict]]:
    """``probe`` records at these (step, mode)s, each told apart by its loss scale (the step) and
    its variable names (``"s{step}/..."``); bfloat16 probes have no sweep, as the probe writes."""
    out = []
    for step, mode in steps_modes:
        p = probe_payload(step, float(step), mode)
        p["variables"]["data"] = [[f"s{step}/{r[0]}", *r[1:]] for r in p["variables"]["data"]]
        if mode == "bfloat16":
            p["sweep"]["data"], p["loss_scale"], p["recommended_scale"] = [], None, None
        out.append((step, p))
    return out


# --- loss-scale evidence (tests/judge/test_rule_loss_scale.py and neighbours) --------------------
# Everything here is numpy arithmetic on gradient samples the tests choose, independent of
# mpwatch's own math: float16 rounding is numpy's float16, the dynamic scale is Keras' documented
# rule (checked against keras.optimizers.LossScaleOptimizer in tests/judge/test_apply.py).
SWEEP_KS = tuple(range(-8, 41))


def log_uniform(lo_log2: float, hi_log2: float, n: int = 20000, seed: int = 0) -> np.ndarray:
    """|gradients| log-uniform on [2**lo, 2**hi), float32, random signs."""
    rng = np.random.default_rng(seed)
    g = 2.0 ** rng.uniform(lo_log2, hi_log2, size=n)
    return (g * rng.choice([-1.0, 1.0], size=n)).astype(np.float32)


def f16_lost(g: np.ndarray, scale: float) -> float:
    """Measured underflow: among nonzero g, the share whose g*scale is 0 in numpy's float16."""
    g = np.asarray(g, np.float64)
    nz = g != 0
    return float(((g * scale).astype(np.float16) == 0)[nz].mean()) if nz.any() else 0.0


def predicted(g: np.ndarray, k: float) -> tuple[float, float]:
    """(underflow, overflow) the sweep's definition gives at 2**k: shares of nonzero |g| with
    |g|*2**k < 2**-24, and >= 2**16."""
    a = np.abs(np.asarray(g, np.float64))
    a = a[a > 0]
    return float(np.mean(a * 2.0**k < 2.0**-24)), float(np.mean(a * 2.0**k >= 2.0**16))


def margin_scale(g: np.ndarray, margin_bits: int = 4) -> float:
    """The largest 2**k in SWEEP_KS with max|g| * 2**k <= 65504 / 2**margin_bits."""
    m = float(np.max(np.abs(g)))
    ok = [k for k in SWEEP_KS if m * 2.0**k <= 65504.0 / 2**margin_bits]
    return 2.0 ** max(ok)


def grad_probe(step: int, layers: dict[str, np.ndarray], scale: float, mode: str = "float16",
               reliable: bool | None = None) -> dict:  # fmt: skip
    """A probe of gradient samples by layer at ``scale``: the model row, the layer rows, the sweep
    rows and the histogram, computed here with numpy (``np.frexp`` gives floor(log2|g|))."""
    g = np.concatenate([np.asarray(v, np.float32).ravel() for v in layers.values()])
    nz = g[g != 0]
    e = np.frexp(np.abs(nz).astype(np.float64))[1] - 1
    lo, hi = int(e.min()), int(e.max()) + 1
    counts = np.bincount(e - lo, minlength=hi - lo)
    lost = f16_lost(g, scale)
    model = model_row(uf=lost, scale=scale, rec=margin_scale(g), mode=mode)
    model.update(ref_nonzero=int(len(nz)), underflow_count=int(round(lost * len(nz))),
                 max_abs_ref_grad=float(np.max(np.abs(g))), margin_bits=4.0)  # fmt: skip
    if reliable is not None:
        model["reliable"] = reliable
    rows = [probe_layer(name, uf=f16_lost(v, scale)) for name, v in layers.items()]
    sweep = [[k, 2.0**k, *predicted(g, k)] for k in SWEEP_KS]
    hist = {"edges_log2": list(range(lo, hi + 1)), "counts": counts.tolist(), "zeros": 0,
            "window_log2": [-24 - math.log2(scale), math.log2(65504) - math.log2(scale)],
            "source": "reference"}  # fmt: skip
    return {"step": step, "model": model, "layers": rows, "sweep": sweep, "histogram": hist}


def keras_scale_history(
    steps: int, overflows_at, initial: float = 2.0**15, growth: int = 2000
) -> tuple[dict[int, float], dict[int, float]]:
    """Keras' dynamic rule, step by step: ``overflows_at(step, scale)`` says whether the step's
    gradients overflow at the scale it runs at. Returns ({step: scale after it} with step 0 the
    initial scale, {step: 1.0 skipped / 0.0}) as mpwatch records them."""
    scale, counter = float(initial), 0
    scales, skipped = {0: scale}, {}
    for s in range(1, steps + 1):
        if overflows_at(s, scale):
            scale, counter = scale / 2.0, 0
            skipped[s] = 1.0
        else:
            counter += 1
            if counter == growth:
                scale, counter = scale * 2.0, 0
            skipped[s] = 0.0
        scales[s] = scale
    return scales, skipped


def scale_run(probes: list[dict], scales: dict[int, float], skipped: dict[int, float],
              initial: float = 2.0**15, growth: int = 2000, info: dict | None = None,
              layers=None) -> Run:  # fmt: skip
    """A mixed_float16 Run with this scale history and these probes (:func:`grad_probe`)."""
    info = info if info is not None else run_info("mixed_float16")
    info["loss_scale"] = dict(info["loss_scale"], initial=initial, growth_interval=growth)
    run = make_run(
        info=info,
        layers=layers,
        scalars={contract.LOSS_SCALE: scales, contract.STEP_SKIPPED: skipped},
        probes={p["step"]: (p["model"], p["layers"]) for p in probes},
    )
    run.sweeps = pd.DataFrame(
        [[p["step"], *r] for p in probes for r in p["sweep"]],
        columns=["step", *contract.PROBE_SWEEP_COLUMNS],
    )
    run.histograms = {p["step"]: p["histogram"] for p in probes}
    return run


# --- the real H100 trace (tests/data/h100) ------------------------------------------------------
H100_TRACE = os.path.join(
    os.path.dirname(os.path.abspath(__file__)),
    "data",
    "h100",
    "seed004_convnet_mixed_float16_bs128.xplane.pb",
)


def put_h100_trace(logdir) -> str:
    """Copy the H100 trace where a profiler run leaves it: ``LOGDIR/plugins/profile/RUN/``;
    returns that run directory."""
    import shutil

    run = os.path.join(str(logdir), "plugins", "profile", "2025_01_01_00_00_00")
    os.makedirs(run)
    shutil.copyfile(H100_TRACE, os.path.join(run, "gpu-host.xplane.pb"))
    return run


def xprof_kernel_stats(trace: str = H100_TRACE) -> pd.DataFrame:
    """xprof's own ``kernel_stats`` table of a trace, straight from its converter (run on a copy:
    the converter writes a cache file beside the trace): the independent ground truth."""
    import json
    import shutil
    import tempfile

    from xprof.convert import raw_to_tool_data

    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "h.xplane.pb")
        shutil.copyfile(trace, copy)
        data, _ = raw_to_tool_data.xspace_to_tool_data([copy], "kernel_stats", {})
    table = json.loads(data)
    cols = [c["id"] for c in table["cols"]]
    df = pd.DataFrame([[c.get("v") for c in r["c"]] for r in table["rows"]], columns=cols)
    df["total_duration_us"] = pd.to_numeric(df["total_duration_us"])
    return df
