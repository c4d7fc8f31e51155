"""Underflow by layer and probe step: the heatmap the HTML report draws and the tab serves.

Example:
    >>> import mpwatch  # doctest: +SKIP
    >>> run = next(iter(mpwatch.load_run("logs/run1").values()))  # doctest: +SKIP
    >>> underflow_heatmap(run)["steps"]  # doctest: +SKIP
    [100, 200, 300]
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from mpwatch.read import Run

#: the most probe steps a heatmap shows (evenly spread, the latest included)
HEATMAP_MAX_STEPS = 200


def underflow_heatmap(run: Run, max_steps: int = HEATMAP_MAX_STEPS) -> dict[str, Any]:
    """``{"layers", "steps", "values"}``: each layer's gradient underflow fraction at each probe
    step (``values[layer][step]``, None where not measured), from the run's probe table; at most
    ``max_steps`` probe steps, evenly spread, the latest included; layers in the order the probe
    lists them."""
    probes = run.probe_layers
    empty: dict[str, Any] = {"layers": [], "steps": [], "values": []}
    if not len(probes) or not {"step", "layer", "underflow_fraction"} <= set(probes.columns):
        return empty
    probes = probes[probes["layer"].notna()]
    steps = np.unique(probes["step"].to_numpy(dtype=np.int64))
    if len(steps) > max_steps:
        steps = steps[np.unique(np.linspace(0, len(steps) - 1, max_steps).astype(int))]
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
