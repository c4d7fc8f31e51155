"""How fast does ``mpwatch.load_run`` read a long run, against tbparse and TensorBoard?

Builds a synthetic logdir: ``--steps`` steps of scalars (default 1,000,000: the loss scale and the
skipped-step flag at every step, the gradient-health, step-time, memory and loss scalars every
``--log-every`` steps) and ``--probes`` probe records of a ``--layers``-layer model (1,000 of a
200-layer model by default), plus run_info and a layers table. The events are byte-for-byte what
``tf.summary.scalar`` / :class:`mpwatch.RunWriter` write (checked in tests), written
directly (vectorized) because writing a million steps through TensorFlow takes minutes.

Then times, on the same logdir:

- ``mpwatch.load_run`` (everything: scalars and every record decoded into tables);
- tbparse's ``SummaryReader(logdir, extra_columns={"wall_time"}).tensors`` + ``.scalars``
  (tbparse reads all events too);
- TensorBoard's ``EventAccumulator`` with ``size_guidance`` 0 (keep everything) + ``Reload()``.

and prints the times and the ratios. Goal: load_run at least 10x faster than tbparse.

    python benchmarks/reader.py                     # 1,000,000 steps (a few minutes for tbparse)
    python benchmarks/reader.py --steps 100000      # quicker
    python benchmarks/reader.py --skip-tbparse --skip-accumulator   # load_run only
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from mpwatch import contract  # noqa: E402
from mpwatch.read.tfrecord import _masked_crc32c_rows  # noqa: E402
from mpwatch.wire import put_varint as _varint  # noqa: E402

SCALARS_METADATA = bytes.fromhex("4a0b0a090a077363616c617273")  # plugin_name "scalars"


def scalar_events(tag: str, steps: np.ndarray, values: np.ndarray, wall0: float) -> list:
    """Framed TFRecords of TF2 scalar events (as tf.summary.scalar writes them), vectorized.
    Returns [(keys_step, matrix of framed records)] grouped by step-varint width."""
    tb = tag.encode()
    out = []
    steps = np.asarray(steps, dtype=np.int64)
    values = np.asarray(values, dtype=np.float32)
    width = np.ones(len(steps), dtype=np.int64)
    for k in range(1, 10):
        width += steps >= (1 << (7 * k))
    width[steps == 0] = 0
    for w in np.unique(width):
        sel = np.nonzero(width == w)[0]
        st = steps[sel]
        tensor = bytes.fromhex("080112002204")  # DT_FLOAT, scalar shape, tensor_content 4 bytes
        value = b"\x0a" + _varint(len(tb)) + tb + b"\x42\x0a" + tensor
        value_len = len(value) + 4 + len(SCALARS_METADATA)
        summ = b"\x0a" + _varint(value_len)
        summ_len = len(summ) + value_len
        head = b"\x09"  # then wall time
        step_part_len = (1 + int(w)) if w else 0
        data_len = 1 + 8 + step_part_len + 1 + len(_varint(summ_len)) + summ_len
        n = len(sel)
        mat = np.zeros((n, 12 + data_len + 4), dtype=np.uint8)
        mat[:, 0:8] = np.frombuffer(struct.pack("<Q", data_len), dtype=np.uint8)
        lcrc = _masked_crc32c_rows(mat[:1, 0:8])[0]
        mat[:, 8:12] = np.frombuffer(struct.pack("<I", int(lcrc)), dtype=np.uint8)
        p = 12
        mat[:, p] = head[0]
        p += 1
        wall = (wall0 + st.astype(np.float64) * 0.01).astype("<f8")
        mat[:, p : p + 8] = wall.view(np.uint8).reshape(n, 8)
        p += 8
        if w:
            mat[:, p] = 0x10
            p += 1
            s = st.copy()
            for k in range(int(w)):
                byte = (s & 0x7F).astype(np.uint8)
                if k < w - 1:
                    byte |= 0x80
                mat[:, p + k] = byte
                s >>= 7
            p += int(w)
        rest = b"\x2a" + _varint(summ_len) + summ + value
        mat[:, p : p + len(rest)] = np.frombuffer(rest, dtype=np.uint8)
        p += len(rest)
        mat[:, p : p + 4] = values[sel].astype("<f4").view(np.uint8).reshape(n, 4)
        p += 4
        mat[:, p : p + len(SCALARS_METADATA)] = np.frombuffer(SCALARS_METADATA, dtype=np.uint8)
        p += len(SCALARS_METADATA)
        assert p == 12 + data_len
        crc = _masked_crc32c_rows(mat[:, 12 : 12 + data_len])
        mat[:, p : p + 4] = crc.astype("<u4").view(np.uint8).reshape(n, 4)
        out.append((st, mat))
    return out


def record_event(kind: str, step: int, payload: dict, wall: float) -> bytes:
    """One framed mpwatch record event, as RunWriter.record writes it."""
    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2

    blob = contract.encode_payload(payload)
    md = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name=contract.PLUGIN_NAME, content=contract.metadata_content(kind)
        ),
        data_class=summary_pb2.DATA_CLASS_TENSOR,
        summary_description=f"mpwatch {kind} record",
    )
    t = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[blob])
    ev = event_pb2.Event(wall_time=wall, step=step)
    ev.summary.value.add(tag=contract.record_tag(kind), tensor=t, metadata=md)
    return frame(ev.SerializeToString())


def frame(data: bytes) -> bytes:
    from mpwatch.wire import frame_record

    return frame_record(data)


def file_version_event(wall: float) -> bytes:
    from tensorboard.compat.proto import event_pb2

    return frame(event_pb2.Event(wall_time=wall, file_version="brain.Event:2").SerializeToString())


def probe_payload(layers: int, rng: np.random.Generator, scale: float) -> dict:
    names = [f"dense_{i}" for i in range(layers)]
    lay_rows = []
    var_rows = []
    for name in names:
        nz = int(rng.integers(1000, 100000))
        uc = int(nz * rng.random() * 0.01)
        lay_rows.append(
            [
                name,
                nz,
                uc,
                uc / nz,
                float(rng.random() * 1e-3),
                float(rng.random() * 1e-3),
                float(rng.random() * 100),
                float(rng.random() * 10),
                0.0,
                False,
            ]
        )
        for v in ("kernel", "bias"):
            var_rows.append(
                [f"{name}/{v}", name, nz, nz, uc, uc / nz, float(rng.random() * 1e-3), 0.5]
            )
    sweep = [
        [k, 2.0**k, max(0.0, 0.01 - 0.001 * k), max(0.0, 0.001 * (k - 20))] for k in range(0, 25)
    ]
    return {
        "mode": "float16",
        "loss_scale": scale,
        "reference": "float32_twin",
        "reference_note": None,
        "variables": contract.table(contract.PROBE_VARIABLE_COLUMNS, var_rows),
        "layers": contract.table(contract.PROBE_LAYER_COLUMNS, lay_rows),
        "model": {
            "ref_nonzero": 1,
            "underflow_count": 0,
            "underflow_fraction": 0.001,
            "grad_rel_error": 1e-3,
            "max_abs_activation": 50.0,
            "first_nonfinite_layer": None,
        },
        "histogram": {
            "edges_log2": list(range(-40, 17)),
            "counts": [int(x) for x in rng.integers(0, 1000, 56)],
            "zeros": 3,
            "window_log2": [-39.0, 0.9],
        },
        "sweep": contract.table(
            ["scale_log2", "scale", "predicted_underflow_fraction", "predicted_overflow_fraction"],
            sweep,
        ),
        "recommended_scale": 2.0**15,
    }


def build_logdir(path: str, steps: int, probes: int, layers: int, log_every: int = 10) -> dict:
    """Write the synthetic run into ``path`` (one event file); returns the truth counts."""
    os.makedirs(path, exist_ok=True)
    rng = np.random.default_rng(0)
    wall0 = 1.7e9
    all_steps = np.arange(1, steps + 1, dtype=np.int64)
    scale = np.float32(32768.0) * (2.0 ** rng.integers(-3, 2, steps)).astype(np.float32)
    skipped = (rng.random(steps) < 0.001).astype(np.float32)
    groups = []
    tags = [(contract.LOSS_SCALE, all_steps, scale), (contract.STEP_SKIPPED, all_steps, skipped)]
    every = all_steps[all_steps % log_every == 0]
    for tag in (
        contract.SKIPPED_STEPS,
        contract.SKIPPED_STEPS_TOTAL,
        contract.GRAD_ZERO_FRACTION,
        contract.GRAD_SUBNORMAL_FRACTION,
        contract.GRAD_NONFINITE_COUNT,
        contract.GRAD_MAX_ABS,
        contract.GRAD_HEADROOM_BITS,
        contract.STEP_TIME_MS,
        contract.PEAK_MEMORY_MB,
        contract.TRAIN_LOSS,
    ):
        tags.append((tag, every, rng.random(len(every)).astype(np.float32)))
    n_scalars = 0
    for ti, (tag, st, vals) in enumerate(tags):
        for gst, mat in scalar_events(tag, st, vals, wall0):
            groups.append((gst * 64 + ti, mat))
            n_scalars += len(gst)
    # interleave in (step, tag) order, as a real run writes them
    keys = np.concatenate([k for k, _ in groups])
    sizes = np.concatenate([np.full(len(k), m.shape[1], dtype=np.int64) for k, m in groups])
    order = np.argsort(keys, kind="stable")
    pos = np.empty(len(keys), dtype=np.int64)
    pos[order] = np.concatenate([[0], np.cumsum(sizes[order])[:-1]])
    total = int(sizes.sum())
    out = np.empty(total, dtype=np.uint8)
    a = 0
    for k, m in groups:
        p = pos[a : a + len(k)]
        out[p[:, None] + np.arange(m.shape[1])] = m
        a += len(k)
    fname = os.path.join(path, f"events.out.tfevents.{int(wall0)}.bench.1.v2")
    with open(fname, "wb") as f:
        f.write(file_version_event(wall0))
        f.write(
            record_event(
                contract.KIND_RUN_INFO,
                0,
                {
                    "policy": "mixed_float16",
                    "compute_dtype": "float16",
                    "variable_dtype": "float32",
                    "batch_size": 64,
                    "device": {
                        "type": "GPU",
                        "name": "bench",
                        "compute_capability": "8.0",
                        "tensor_cores": True,
                    },
                },
                wall0,
            )
        )
        f.write(out.tobytes())
    # probes into a second file of the same run (the probe writes beside the scalars)
    fname2 = os.path.join(path, f"events.out.tfevents.{int(wall0) + 1}.bench.2.v2")
    probe_steps = np.linspace(1, steps, probes).astype(np.int64) if probes else []
    with open(fname2, "wb") as f:
        f.write(file_version_event(wall0 + 1))
        cols = contract.LAYERS_COLUMNS
        rows = [
            [
                f"dense_{i}",
                f"model/dense_{i}",
                "Dense",
                1,
                "mixed_float16",
                "float16",
                "float32",
                "float16",
                "float16",
                1000,
                1000,
                {"units": 64},
                True,
                i == layers - 1,
                None,
            ]
            for i in range(layers)
        ]
        table = {"layers": contract.table(cols, rows)}
        f.write(record_event(contract.KIND_LAYERS, 1, table, wall0))
        for s in probe_steps:
            f.write(
                record_event(
                    contract.KIND_PROBE,
                    int(s),
                    probe_payload(layers, rng, 32768.0),
                    wall0 + float(s) * 0.01,
                )
            )
    return {
        "scalar_events": n_scalars,
        "probes": len(probe_steps),
        "layers": layers,
        "bytes": os.path.getsize(fname) + os.path.getsize(fname2),
    }


def time_load_run(path: str):
    import mpwatch

    t = time.perf_counter()
    run = mpwatch.load_run(path)
    return time.perf_counter() - t, run


def time_tbparse(path: str):
    from tbparse import SummaryReader

    t = time.perf_counter()
    r = SummaryReader(path)
    sc = r.scalars
    te = r.tensors
    return time.perf_counter() - t, (len(sc), len(te))


def time_accumulator(path: str):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    t = time.perf_counter()
    acc = EventAccumulator(
        path,
        size_guidance={
            "scalars": 0,
            "tensors": 0,
            "histograms": 0,
            "images": 0,
            "audio": 0,
            "compressedHistograms": 0,
        },
    )
    acc.Reload()
    n = sum(len(acc.Tensors(tag)) for tag in acc.Tags()["tensors"])
    return time.perf_counter() - t, n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--probes", type=int, default=1000)
    ap.add_argument("--layers", type=int, default=200)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--logdir", help="build here (kept) instead of a temporary directory")
    ap.add_argument("--skip-tbparse", action="store_true")
    ap.add_argument("--skip-accumulator", action="store_true")
    args = ap.parse_args(argv)

    tmp = None
    path = args.logdir
    if path is None:
        tmp = tempfile.mkdtemp(prefix="mpwatch-bench-")
        path = os.path.join(tmp, "run")
    try:
        t = time.perf_counter()
        truth = build_logdir(path, args.steps, args.probes, args.layers, args.log_every)
        print(
            f"built {path}: {args.steps:,} steps, {truth['scalar_events']:,} scalar events, "
            f"{truth['probes']:,} probes of {truth['layers']} layers, "
            f"{truth['bytes'] / 2**20:.1f} MiB in {time.perf_counter() - t:.1f} s"
        )
        t_load, run = time_load_run(path)
        n_values = int(run.scalars.notna().to_numpy().sum())
        assert n_values == truth["scalar_events"], (n_values, truth["scalar_events"])
        assert len(run.probe_model) == truth["probes"]
        assert len(run.probes) == truth["probes"] * truth["layers"]
        print(
            f"mpwatch.load_run      {t_load:8.2f} s  ({n_values:,} scalar values, "
            f"{len(run.probes):,} probe rows)"
        )
        if not args.skip_tbparse:
            t_tbp, n = time_tbparse(path)
            print(
                f"tbparse SummaryReader {t_tbp:8.2f} s  ({n[0]:,} scalars, {n[1]:,} tensors)"
                f"   ratio {t_tbp / t_load:6.1f}x"
            )
        if not args.skip_accumulator:
            t_acc, n = time_accumulator(path)
            print(
                f"EventAccumulator      {t_acc:8.2f} s  ({n:,} tensors)"
                f"   ratio {t_acc / t_load:6.1f}x"
            )
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
