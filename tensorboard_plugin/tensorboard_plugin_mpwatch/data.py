"""From TensorBoard's data provider to mpwatch records, and from records to the tab's JSON views.

Nothing here touches the file system: every value comes from ``context.data_provider``. Records are
decoded with :mod:`mpwatch.contract` (the on-disk contract); the run model and the findings come
from :mod:`mpwatch.read` and :mod:`mpwatch.judge` so a finding is computed in one place for
the CLI and the tab.

>>> json_safe({"a": float("nan"), "b": [1.0, float("inf")]})
{'a': None, 'b': [1.0, None]}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from tensorboard.data import provider as tb_provider

from mpwatch import contract
from mpwatch.contract import json_safe
from mpwatch.read.run import later_writes_win

SCALARS_PLUGIN = "scalars"
# Scalars are read at most this many points per tag from the data provider; TensorBoard's own
# reservoir keeps 1,000 per tag unless --samples_per_plugin says otherwise.
READ_SCALARS = 100_000
READ_TENSORS = 1_000_000  # records: keep all (the loader sets mpwatch=0)


@dataclass
class RunRecords:
    """Everything mpwatch wrote into one run, as the data provider serves it."""

    name: str
    scalars: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    records: dict[str, list[tuple[int, dict[str, Any]]]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def latest(self, kind: str) -> dict[str, Any] | None:
        items = self.records.get(kind)
        return items[-1][1] if items else None


def _floats(arr: np.ndarray) -> list[float | None]:
    """A float array as a JSON list (non-finite -> None), fast for long series."""
    arr = np.asarray(arr, dtype=np.float64)
    out: list[Any] = arr.tolist()
    if not np.isfinite(arr).all():
        for i in np.flatnonzero(~np.isfinite(arr)).tolist():
            out[i] = None
    return out


# --- reading from the data provider ---------------------------------------------------------------
def list_mpwatch_runs(provider: Any, ctx: Any, experiment_id: str) -> dict[str, dict[str, Any]]:
    """Runs holding mpwatch data -> {max_step, max_wall_time, version}; the version changes when a
    run still being written gains data."""
    out: dict[str, dict[str, Any]] = {}

    def note(run: str, series: Any) -> None:
        entry = out.setdefault(run, {"max_step": 0, "max_wall_time": 0.0, "records": 0})
        entry["max_step"] = max(entry["max_step"], int(series.max_step))
        entry["max_wall_time"] = max(entry["max_wall_time"], float(series.max_wall_time))

    tensors = provider.list_tensors(
        ctx, experiment_id=experiment_id, plugin_name=contract.PLUGIN_NAME
    )
    for run, tags in tensors.items():
        for tag, series in tags.items():
            if contract.kind_of_tag(tag) is not None:
                note(run, series)
                out[run]["records"] += 1
    scalars = provider.list_scalars(ctx, experiment_id=experiment_id, plugin_name=SCALARS_PLUGIN)
    for run, tags in scalars.items():
        for tag, series in tags.items():
            if tag.startswith(contract.PREFIX):
                note(run, series)
    for entry in out.values():
        entry["version"] = f"{entry['max_step']}:{entry['max_wall_time']:.6f}"
    return out


def read_run(
    provider: Any,
    ctx: Any,
    experiment_id: str,
    run: str,
    decoded: dict[tuple[str, int, float], Any] | None = None,
) -> RunRecords:
    """Read and decode every mpwatch scalar and record of ``run``.

    ``decoded`` maps (tag, step, wall time) to a record's decoded payload (or its error) and is
    updated: pass the previous read's to decode only the new records of a run still being written.
    """
    decoded = {} if decoded is None else decoded
    result = RunRecords(name=run)
    listing = provider.list_scalars(
        ctx,
        experiment_id=experiment_id,
        plugin_name=SCALARS_PLUGIN,
        run_tag_filter=tb_provider.RunTagFilter(runs=[run]),
    ).get(run, {})
    tags = sorted(t for t in listing if t.startswith(contract.PREFIX))
    if tags:
        data = provider.read_scalars(
            ctx,
            experiment_id=experiment_id,
            plugin_name=SCALARS_PLUGIN,
            downsample=READ_SCALARS,
            run_tag_filter=tb_provider.RunTagFilter(runs=[run], tags=tags),
        ).get(run, {})
        for tag, points in data.items():
            steps = np.fromiter((p.step for p in points), dtype=np.int64, count=len(points))
            values = np.fromiter((p.value for p in points), dtype=np.float64, count=len(points))
            # points come in write order (files in name order): a resumed run's later writes win
            keep = later_writes_win(np.arange(len(steps)), steps)
            steps, values = steps[keep], values[keep]
            order = np.argsort(steps, kind="stable")
            result.scalars[tag] = (steps[order], values[order])

    tensors = provider.list_tensors(
        ctx,
        experiment_id=experiment_id,
        plugin_name=contract.PLUGIN_NAME,
        run_tag_filter=tb_provider.RunTagFilter(runs=[run]),
    ).get(run, {})
    kinds: dict[str, str] = {}
    for tag, series in tensors.items():
        kind = contract.kind_of_tag(tag)
        if kind is None:
            continue
        try:
            meta = contract.parse_metadata_content(series.plugin_content or b"{}")
        except ValueError as e:
            result.errors.append(f"{tag}: {e}")
            continue
        kinds[tag] = meta.get("kind", kind)
    if kinds:
        data = provider.read_tensors(
            ctx,
            experiment_id=experiment_id,
            plugin_name=contract.PLUGIN_NAME,
            downsample=READ_TENSORS,
            run_tag_filter=tb_provider.RunTagFilter(runs=[run], tags=sorted(kinds)),
        ).get(run, {})
        for tag, points in data.items():
            items = result.records.setdefault(kinds[tag], [])
            steps = np.fromiter((p.step for p in points), dtype=np.int64, count=len(points))
            kept = later_writes_win(np.arange(len(steps)), steps, strict=True).tolist()
            for p in (points[i] for i in kept):
                key = (tag, int(p.step), float(p.wall_time))
                if key not in decoded:
                    try:
                        blob = p.numpy.item() if hasattr(p.numpy, "item") else p.numpy
                        decoded[key] = contract.decode_payload(blob)
                    except (ValueError, TypeError) as e:
                        decoded[key] = ValueError(f"{tag} at step {p.step}: {e}")
                value = decoded[key]
                if isinstance(value, ValueError):
                    result.errors.append(str(value))
                else:
                    items.append((int(p.step), value))
            items.sort(key=lambda item: item[0])
    return result


# --- the run model and the findings (mpwatch.read / mpwatch.judge) ---------------------------
def build_model(records: RunRecords) -> Any:
    """The :class:`mpwatch.read.run.Run` of decoded records: the model ``mpwatch.load_run`` builds
    from event files (same tables, part merging and purges), so the advisor sees the same run in the
    tab and in the CLI."""
    from mpwatch.read import run as reader

    return reader.run_from_records(
        records.name, scalars=records.scalars, records=records.records, warnings=records.errors
    )


FINDING_KEYS = ("severity", "layer", "rule", "title", "evidence", "fix", "why")


def findings(model: Any) -> tuple[list[dict[str, Any]], str | None]:
    """The advisor's findings as dicts, and why there are none when the advisor failed."""
    import mpwatch.judge as advisor

    try:
        diagnosed = advisor.diagnose(model)
    except Exception as e:  # a run still being written may be incomplete: say so, keep the tab
        return [], f"the advisor failed on this run: {type(e).__name__}: {e}"
    out = []
    for f in diagnosed:
        d = f.to_dict()
        out.append({k: d.get(k) for k in FINDING_KEYS})
    return out, None


# --- views ---------------------------------------------------------------------------------------
def _table(tbl: Any) -> list[dict[str, Any]]:
    """Split table -> list of row dicts."""
    if not isinstance(tbl, dict):
        return []
    cols = tbl.get("columns") or []
    return [dict(zip(cols, row)) for row in tbl.get("data") or []]


def downsample(steps: np.ndarray, values: np.ndarray, points: int) -> tuple[np.ndarray, np.ndarray]:
    """At most ``points`` points: per bucket of equal step count keep the first, min and max points
    (so spikes and drops survive) and always the last point."""
    n = len(steps)
    if n <= points:
        return steps, values
    buckets = max(1, points // 3)
    edges = np.linspace(0, n, buckets + 1).astype(np.int64)
    keep = [edges[:-1]]
    finite = np.where(np.isfinite(values), values, np.nan)
    starts = edges[:-1]
    valid = edges[1:] > starts
    starts = starts[valid]
    with np.errstate(all="ignore"):
        filled_hi = np.where(np.isnan(finite), -np.inf, finite)
        filled_lo = np.where(np.isnan(finite), np.inf, finite)
    # argmax/argmin per bucket via reduceat on values, then locate the index
    hi = np.maximum.reduceat(filled_hi, starts)
    lo = np.minimum.reduceat(filled_lo, starts)
    bucket_of = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, n)))
    is_hi = filled_hi == hi[bucket_of]
    is_lo = filled_lo == lo[bucket_of]
    first_hi = np.flatnonzero(is_hi)
    first_lo = np.flatnonzero(is_lo)
    keep.append(first_hi[np.unique(bucket_of[first_hi], return_index=True)[1]])
    keep.append(first_lo[np.unique(bucket_of[first_lo], return_index=True)[1]])
    nonfinite = np.flatnonzero(~np.isfinite(values))[:points]
    keep.append(nonfinite)
    keep.append(np.array([n - 1]))
    idx = np.unique(np.concatenate(keep))
    return steps[idx], values[idx]


SKIPPED_LIMIT = 10_000


def skipped_steps(scalars: dict[str, tuple[np.ndarray, np.ndarray]]) -> tuple[list[int], int]:
    """Steps to mark as skipped, and how many steps were skipped in all.

    TensorBoard keeps a sample of each scalar tag (1,000 by default), so the per-step flag may miss
    skipped steps of a long run; the cumulative count does not: a rise of the count between two kept
    points marks the later one. The total is the last cumulative count when it was recorded.
    """
    marks: list[np.ndarray] = []
    total = 0
    for tag in (contract.STEP_SKIPPED, contract.SKIPPED_STEPS):
        if tag in scalars:
            steps, values = scalars[tag]
            marks.append(steps[values > 0])
            total = max(total, int(np.nansum(values[np.isfinite(values)])))
    if contract.SKIPPED_STEPS_TOTAL in scalars:
        steps, values = scalars[contract.SKIPPED_STEPS_TOTAL]
        finite = np.isfinite(values)
        steps, values = steps[finite], values[finite]
        if len(values):
            rise = np.diff(values, prepend=0.0) > 0
            marks.append(steps[rise])
            total = int(values[-1])
    if not marks:
        return [], total
    return np.unique(np.concatenate(marks))[:SKIPPED_LIMIT].tolist(), total


def scalars_view(records: RunRecords, points: int) -> dict[str, Any]:
    series = {}
    for tag, (steps, values) in sorted(records.scalars.items()):
        s, v = downsample(steps, values, points)
        series[tag] = {"steps": s.tolist(), "values": _floats(v), "count": int(len(steps))}
    skipped, total = skipped_steps(records.scalars)
    return {
        "run": records.name,
        "series": series,
        "skipped_steps": skipped,
        "skipped_total": total,
    }


LAYER_COLUMNS = (
    "name",
    "class",
    "compute_dtype",
    "variable_dtype",
    "output_dtype",
    "effective_dtype",
    "params",
    "underflow_fraction",
    "grad_rel_error",
    "output_rel_error",
    "max_abs_activation",
    "time_share",
    "tc_aligned",
    "is_output",
    "note",
)


def layers_view(records: RunRecords, found: list[dict[str, Any]]) -> dict[str, Any]:
    """The per-layer table: dtypes from the layers record, numerics from the latest probe, time
    share from the profile, findings per layer."""
    layers: list[dict[str, Any]] = []
    for _, payload in records.records.get(contract.KIND_LAYERS, []):
        layers = _table(payload.get("layers"))  # the latest layer table wins
    probe = records.latest(contract.KIND_PROBE) or {}
    by_layer_probe = {row.get("layer"): row for row in _table(probe.get("layers"))}
    profile = records.latest(contract.KIND_PROFILE) or {}
    by_layer_time = {row.get("layer"): row for row in _table(profile.get("layers"))}
    badges: dict[str, list[dict[str, str]]] = {}
    for f in found:
        if f.get("layer"):
            badges.setdefault(str(f["layer"]), []).append(
                {"severity": f["severity"], "rule": f["rule"], "title": f["title"]}
            )
    rows = []
    names = [row.get("name") for row in layers]
    for name in list(by_layer_probe):  # layers seen by the probe but missing from the table
        if name not in names and name is not None:
            layers.append({"name": name})
    for row in layers:
        name = row.get("name")
        p = by_layer_probe.get(name, {})
        t = by_layer_time.get(name, {})
        rows.append(
            [
                name,
                row.get("class"),
                row.get("compute_dtype"),
                row.get("variable_dtype"),
                row.get("output_dtype"),
                row.get("effective_dtype"),
                row.get("params"),
                p.get("underflow_fraction"),
                p.get("grad_rel_error"),
                p.get("output_rel_error"),
                p.get("max_abs_activation"),
                t.get("share"),
                row.get("tc_aligned"),
                row.get("is_output"),
                row.get("note"),
            ]
        )
    return json_safe(
        {
            "run": records.name,
            "columns": list(LAYER_COLUMNS),
            "rows": rows,
            "badges": badges,
            "probe_step": records.records[contract.KIND_PROBE][-1][0]
            if records.records.get(contract.KIND_PROBE)
            else None,
            "profiled": bool(profile),
        }
    )


HEATMAP_MAX_STEPS = 200


def _heatmap(probes: pd.DataFrame) -> dict[str, Any]:
    """Layer × probe step underflow from the Run's probe table; at most HEATMAP_MAX_STEPS steps,
    evenly spread, the latest included; layers in the order the probe lists them."""
    empty = {"layers": [], "steps": [], "values": []}
    if not len(probes) or not {"step", "layer", "underflow_fraction"} <= set(probes.columns):
        return empty
    probes = probes[probes["layer"].notna()]
    steps = np.unique(probes["step"].to_numpy(dtype=np.int64))
    if len(steps) > HEATMAP_MAX_STEPS:
        steps = steps[np.unique(np.linspace(0, len(steps) - 1, HEATMAP_MAX_STEPS).astype(int))]
        probes = probes[probes["step"].isin(steps)]
    if not len(probes):
        return empty
    layers = pd.unique(probes["layer"].astype(str))
    rows = pd.Index(layers).get_indexer(probes["layer"].astype(str))
    cols = np.searchsorted(steps, probes["step"].to_numpy(dtype=np.int64))
    grid = np.full((len(layers), len(steps)), np.nan)
    grid[rows, cols] = pd.to_numeric(probes["underflow_fraction"], errors="coerce").to_numpy()
    grid = np.round(grid, 7)
    values = np.where(np.isfinite(grid), grid, None).tolist()
    return {"layers": list(layers), "steps": steps.tolist(), "values": values}


def probes_view(records: RunRecords, model: Any, step: int | None) -> dict[str, Any]:
    """Probe steps and the probe at ``step``; without ``step``: the latest probe and the layer ×
    probe-step underflow heatmap."""
    probes = records.records.get(contract.KIND_PROBE, [])
    steps = [s for s, _ in probes]
    chosen: tuple[int, dict[str, Any]] | None = probes[-1] if probes else None
    if step is not None:
        matches = [item for item in probes if item[0] == step]
        if not matches:
            raise KeyError(step)
        chosen = matches[-1]
    heatmap = None
    if step is None:  # the heatmap comes with the default view only (a step picks a histogram)
        heatmap = _heatmap(model.probes)
    probe = None
    if chosen is not None:
        s, payload = chosen
        probe = {
            "step": s,
            "mode": payload.get("mode"),
            "loss_scale": payload.get("loss_scale"),
            "reference": payload.get("reference"),
            "reference_note": payload.get("reference_note"),
            "model": payload.get("model"),
            "histogram": payload.get("histogram"),
            "sweep": payload.get("sweep"),
            "recommended_scale": payload.get("recommended_scale"),
        }
    return json_safe(
        {
            "run": records.name,
            "steps": steps,
            "heatmap": heatmap,
            "probe": probe,
        }
    )


def profile_view(records: RunRecords) -> dict[str, Any]:
    items = records.records.get(contract.KIND_PROFILE, [])
    return json_safe(
        {
            "run": records.name,
            "step": items[-1][0] if items else None,
            "profile": items[-1][1] if items else None,
        }
    )


def info_view(records: RunRecords) -> dict[str, Any]:
    notices = [payload for _, payload in records.records.get(contract.KIND_NOTICE, [])]
    return {
        "info": records.latest(contract.KIND_RUN_INFO),
        "notices": notices,
        "errors": records.errors,
    }
