"""GradientHealthMonitor: how the real, scaled training gradients sit in float16's range."""

from __future__ import annotations

from typing import Any

from mpwatch import contract
from mpwatch.record.callbacks.base import RecordingCallback, check_positive_int
from mpwatch.record.tap import lost_updates, stats


def variable_layer(path: str) -> str:
    """The layer part of a variable path ("model/dense/kernel" -> "model/dense")."""
    return path.rsplit("/", 1)[0] if "/" in path else path


def variable_layer_paths(model: Any) -> dict[str, str]:
    """Variable path -> the layer-table path of the innermost layer owning it (Keras' variable
    paths omit outer models: "inner/dense/kernel" belongs to layer "outer/inner/dense")."""
    from mpwatch.layers import walk

    out: dict[str, str] = {}
    for layer, path, _ in sorted(walk(model), key=lambda t: t[2]):  # deeper layers win
        for v in getattr(layer, "trainable_weights", []):
            out[getattr(v, "path", None) or v.name] = path
    return out


class GradientHealthMonitor(RecordingCallback):
    """Gradient health from the gradients the optimizer really receives (``g*S``), computed in the
    graph every ``log_every`` steps.

    Model-wide scalars: ``mpwatch/grad/zero_fraction`` (share of elements exactly 0),
    ``mpwatch/grad/subnormal_fraction`` (share with ``0 < |g*S| < 2**-14``: float16's subnormal
    range),
    ``mpwatch/grad/nonfinite_count``, ``mpwatch/grad/max_abs`` and ``mpwatch/grad/headroom_bits`` =
    ``log2(65504 / max|g*S|)``; and a ``grad_variables`` record with the same per variable. Without
    a
    loss scale (bfloat16, float32) S is 1. Between the logging steps the graph does no extra work.

    Under a multi-replica strategy the statistics are those of replica 0's gradients before the
    all-reduce (loss scale and skipped steps are exact there too).

    Args:
        log_dir: the run directory.
        log_every: compute and write every this many batch steps.
        per_variable: also write the per-variable ``grad_variables`` record.

    Example:
        >>> cb = GradientHealthMonitor(log_dir="logs/run1", log_every=100)  # doctest: +SKIP
        >>> model.fit(x, y, callbacks=[cb])  # doctest: +SKIP
    """

    part = "gradient_health"
    reads_tap = True

    def __init__(self, log_dir: Any, log_every: int = 50, per_variable: bool = True) -> None:
        super().__init__(log_dir, log_every)
        self.grad_every = check_positive_int("log_every", log_every)
        self.per_variable = bool(per_variable)
        self._layer_of: dict[str, str] | None = None

    def _begin(self) -> None:
        self._layer_of = None

    def _tap_data(self, got: Any) -> None:
        if not got.grad_counts:
            return
        tap = self.state.tap
        names = list(tap.variable_names) if tap is not None else []
        if self._layer_of is None:
            self._layer_of = variable_layer_paths(self.model)
        for i, step in enumerate(got.steps):
            counts = got.grad_counts.get(step)
            if counts is None or step % self.log_every:
                continue
            counts, moved = counts[:, : stats.NUM_COUNTS], counts[:, stats.NUM_COUNTS :]
            total = stats.shares(counts)
            self.writer.scalars(
                step,
                {
                    contract.GRAD_ZERO_FRACTION: total["zero_fraction"],
                    contract.GRAD_SUBNORMAL_FRACTION: total["subnormal_fraction"],
                    contract.GRAD_NONFINITE_COUNT: total["nonfinite_count"],
                    contract.GRAD_MAX_ABS: total["max_abs"],
                    contract.GRAD_HEADROOM_BITS: total["headroom_bits"],
                },
            )
            self._write_updates(step, names, moved)
            if self.per_variable:
                rows = []
                for j, row in enumerate(counts):
                    name = names[j] if j < len(names) else f"variable_{j}"
                    s = stats.shares(row)
                    rows.append(
                        [
                            name,
                            self._layer_of.get(name) or variable_layer(name),
                            s["size"],
                            s["zero_fraction"],
                            s["subnormal_fraction"],
                            s["nonfinite_count"],
                            s["max_abs"],
                            s["headroom_bits"],
                        ]
                    )
                scale = 1.0
                if got.scale_used is not None:
                    scale = float(got.scale_used[i])
                self.writer.record(
                    contract.KIND_GRAD_VARIABLES,
                    step,
                    {
                        "loss_scale": scale,
                        "variables": contract.table(contract.GRAD_VARIABLE_COLUMNS, rows),
                    },
                )

    def _write_updates(self, step: int, names: list[str], moved: Any) -> None:
        """The ``updates`` record and its model-wide scalar: updates lost to rounding in the
        16-bit variables (:mod:`mpwatch.record.tap.lost_updates`); nothing when none is 16-bit."""
        import numpy as np

        if moved.shape[1] < lost_updates.NUM_UPDATE_COUNTS:
            return
        measured = [j for j in range(len(moved)) if not np.isnan(moved[j]).any()]
        if not measured:
            return
        tvs = {getattr(v, "path", None) or v.name: v for v in self.model.trainable_variables}
        rows = []
        for j in measured:
            name = names[j] if j < len(names) else f"variable_{j}"
            updates, unchanged = (float(x) for x in moved[j])
            rows.append(
                [
                    name,
                    self._layer_of.get(name) or variable_layer(name),
                    str(tvs[name].dtype) if name in tvs else "unknown",
                    int(np.prod(tvs[name].shape)) if name in tvs else 0,
                    updates,
                    unchanged,
                    lost_updates.lost_shares([[updates, unchanged]])[0],
                ]
            )
        total = moved[measured].sum(axis=0)
        self.writer.scalars(
            step, {contract.UPDATES_LOST_FRACTION: lost_updates.lost_shares([total])[0]}
        )
        self.writer.record(
            contract.KIND_UPDATES,
            step,
            {"variables": contract.table(contract.UPDATE_COLUMNS, rows)},
        )
