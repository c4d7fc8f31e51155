"""The views the reports and the tab both show (mpwatch/show/views/), against values set here:
the underflow heatmap of a run probed more often than it shows, the skipped steps of a run with
and without the per-step flag, the loss scale from the first step. The HTML report's SVG and the
tab's JSON are both read from the same views."""

from __future__ import annotations

import numpy as np
import pytest
from builders import make_run, model_row, probe_layer

from mpwatch import contract
from mpwatch.show import views


def test_the_heatmap_keeps_at_most_200_probe_steps_evenly_spread_the_latest_included():
    probes = {
        10 * i: (model_row(), [probe_layer("dense", uf=i / 1000), probe_layer("out", uf=0.0)])
        for i in range(1, 251)
    }
    view = views.underflow_heatmap(make_run(probes=probes))
    want = np.array(sorted(probes))[np.unique(np.linspace(0, 249, 200).astype(int))]
    assert view["steps"] == want.tolist() and view["steps"][-1] == 2500
    assert view["layers"] == ["dense", "out"]
    assert view["values"][0] == pytest.approx([s / 10 / 1000 for s in want])
    assert view["values"][1] == [0.0] * 200
    assert views.underflow_heatmap(make_run()) == {"layers": [], "steps": [], "values": []}


def test_skipped_steps_from_the_flag_else_spans_of_the_cumulative_count():
    flagged = make_run(scalars={contract.STEP_SKIPPED: {1: 1.0, 2: 1.0, 3: 0.0, 4: 1.0}})
    assert views.skip_marks(flagged) == ([1, 2, 4], [])
    counted = make_run(
        scalars={contract.SKIPPED_STEPS_TOTAL: {50: 2.0, 100: 2.0, 150: 5.0},
                 contract.LOSS_SCALE: {5: 1.0, 50: 1.0}}  # fmt: skip
    )
    # 2 skips between the first recorded step (5) and 50, then 3 between 101 and 150
    assert views.skip_marks(counted) == ([], [(5, 50, 2), (101, 150, 3)])


def test_the_loss_scale_starts_at_the_scale_the_first_step_used():
    info = {"loss_scale": {"kind": "dynamic", "initial": 32768.0},
            "start": {"iterations": 0, "loss_scale": 32768.0}}  # fmt: skip
    run = make_run(scalars={contract.LOSS_SCALE: {1: 16384.0, 2: 16384.0}})
    run.records[contract.KIND_RUN_INFO] = [(0, info)]
    ls = views.loss_scale_series(run)
    assert ls.index.tolist() == [0, 1, 2] and ls.tolist() == [32768.0, 16384.0, 16384.0]
    resumed = {**info, "start": {"iterations": 40, "loss_scale": 4096.0}}
    run.records[contract.KIND_RUN_INFO] = [(40, resumed)]
    assert views.loss_scale_series(run).index.tolist() == [1, 2]
