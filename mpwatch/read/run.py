"""The :class:`Run`: everything mpwatch recorded in one run directory, as pandas tables.

A Run is built by :func:`mpwatch.load_run` (from a logdir's event files: :mod:`mpwatch.read.logdir`)
or by :func:`mpwatch.read.run_from_records` (from records already decoded, as the TensorBoard tab
reads them: :mod:`mpwatch.read.assemble`). Here the object and what it answers: its tables, the
latest probe (:class:`ProbeResult`), the skipped steps, the batch size, the profile's tables. No
TensorFlow.

Example:
    >>> import mpwatch  # doctest: +SKIP
    >>> run = mpwatch.load_run("logs/run1")  # doctest: +SKIP
    >>> run.scalars["mpwatch/loss_scale"].tail()  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from mpwatch import contract
from mpwatch.contract.encoding import finite_float
from mpwatch.read.problems import ReadProblem

__all__ = ["Run", "ProbeResult", "PROBE_TOP_KEYS", "frame_of", "empty_scalars"]


@dataclass
class Run:
    """Everything mpwatch recorded in one run directory, as pandas tables.

    Attributes:
        name: the run's path relative to the logdir (``"."`` for the logdir itself).
        path: the run directory.
        info: the latest ``run_info`` record (``{}`` when none).
        scalars: indexed by int ``step``; one column per full scalar tag (``"mpwatch/loss_scale"``,
            and any other scalar in the run, such as Keras' own); NaN where absent; sorted by step.
        layers: the latest ``layers`` record's table (empty when none).
        layer_history: every ``layers`` record as ``(step, table)``.
        grad_variables: ``step`` + the ``grad_variables`` table's columns, every record.
        updates: ``step`` + the ``updates`` table's columns (updates lost to rounding, per 16-bit
            variable), every record; empty when no variable is 16-bit.
        memory: the latest ``memory`` record (memory by kind and dtype, and under other
            policies), or None; as tables: :attr:`memory_by_dtype`, :attr:`memory_by_policy`.
        probe_layers: one row per probe step and layer: ``step`` + the probe's layers-table
            columns (``probes`` is the old name of this table).
        probe_variables: the same for the probe's variables table.
        probe_float8: the same for the probe's float8 readiness table (per Dense/EinsumDense).
        probe_inputs: the same for the probe's inputs table (float model inputs: integer ids a
            16-bit cast rounds).
        probe_model: one row per probe step: ``step``, the probe's ``model`` dict's keys,
            ``loss_scale``, ``recommended_scale``, ``mode``, ``reference``, ``reliable`` (False:
            the probe's loss disagreed with the train step's; :meth:`latest_probe` skips it),
            ``batch_size``, ``batch_source``, ``batch_sub_of`` (the batch's size where the
            probe ran on its first ``batch_size`` examples to fit the device's free memory),
            and ``memory_need_bytes`` with
            ``memory_need_from`` (what the probe needed beyond the training's state, and how it
            was found; None in runs before it was recorded).
        histograms: probe step -> the probe's ``histogram`` dict.
        sweeps: ``step`` + the probe's ``sweep`` table columns.
        profile: the latest ``profile`` record, or None. Its tables as DataFrames:
            :attr:`profile_layers` (op time per layer), :attr:`profile_kernel_layers` and
            :attr:`profile_kernel_table` (a GPU trace's kernels); :attr:`profile_kernels` (the
            GPU kernel figures of the run), :attr:`profile_source` (where the figures come from).
        profile_trace: the capture directory (``plugins/profile/<capture>``) whose raw trace the
            profile was read from, when the run's event files held no ``profile`` record (a
            trace from Keras' TensorBoard callback or ``jax.profiler``, read as it is: converted
            without the model, so layers are known by the op names alone); None when the profile
            is a record, or there is none.
        notices: every ``notice`` record, each with its ``step``.
        train_step: the latest ``train_step`` record (the train step's contract: who defines
            ``train_step``, every optimizer, whether it stepped and scales the loss), ``{}``
            when none.
        budgets: every ``budget`` record, one per fit, each with its ``step``: mpwatch's own
            time in that fit, per part, and the cost budget's decisions (what ran, what was
            skipped or deferred, and why); ``[]`` for runs recorded without one.
        warnings: what the reader skipped, and why.
        problems: what the reader could not read of the run's files (or, for a folder it could
            not list, of the folder), as :class:`~mpwatch.read.problems.ReadProblem` (their
            messages are among ``warnings``): the judge's rule ``damaged-logs`` says each aloud.
    """

    name: str
    path: str
    info: dict[str, Any] = field(default_factory=dict)
    scalars: pd.DataFrame = field(default_factory=lambda: empty_scalars())
    layers: pd.DataFrame = field(default_factory=pd.DataFrame)
    layer_history: list[tuple[int, pd.DataFrame]] = field(default_factory=list)
    grad_variables: pd.DataFrame = field(default_factory=lambda: pd.DataFrame({"step": []}))
    updates: pd.DataFrame = field(default_factory=lambda: pd.DataFrame({"step": []}))
    memory: dict[str, Any] | None = None
    probe_layers: pd.DataFrame = field(default_factory=lambda: pd.DataFrame({"step": []}))
    probe_variables: pd.DataFrame = field(default_factory=lambda: pd.DataFrame({"step": []}))
    probe_inputs: pd.DataFrame = field(default_factory=lambda: pd.DataFrame({"step": []}))
    probe_float8: pd.DataFrame = field(default_factory=lambda: pd.DataFrame({"step": []}))
    probe_model: pd.DataFrame = field(default_factory=lambda: pd.DataFrame({"step": []}))
    histograms: dict[int, dict[str, Any]] = field(default_factory=dict)
    sweeps: pd.DataFrame = field(default_factory=lambda: pd.DataFrame({"step": []}))
    profile: dict[str, Any] | None = None
    profile_trace: str | None = None
    notices: list[dict[str, Any]] = field(default_factory=list)
    train_step: dict[str, Any] = field(default_factory=dict)
    budgets: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    problems: list[ReadProblem] = field(default_factory=list)
    #: every structured record read, by kind: list of (step, payload) in step order
    records: dict[str, list[tuple[int, dict[str, Any]]]] = field(default_factory=dict)

    @property
    def has_data(self) -> bool:
        """Whether the run holds any mpwatch data (an ``mpwatch/`` scalar or any record)."""
        if any(str(c).startswith(contract.PREFIX) for c in self.scalars.columns):
            return True
        return any(self.records.values())

    def scalar(self, tag: str) -> pd.Series:
        """One scalar series without its NaNs (empty float Series when the tag is absent)."""
        if tag not in self.scalars.columns:
            return pd.Series([], dtype="float64", index=pd.Index([], dtype="int64", name="step"))
        return self.scalars[tag].dropna()

    @property
    def memory_by_dtype(self) -> pd.DataFrame:
        """The memory record's bytes per kind and dtype (empty without a record)."""
        return frame_of((self.memory or {}).get("by_dtype"))

    @property
    def memory_by_policy(self) -> pd.DataFrame:
        """The memory record's bytes per kind under each policy (empty without a record)."""
        return frame_of((self.memory or {}).get("by_policy"))

    @property
    def probes(self) -> pd.DataFrame:
        """The old name of :attr:`probe_layers` (the probe's per-layer table)."""
        return self.probe_layers

    def latest_probe(
        self, modes: Iterable[str] | None = None, reliable_only: bool = True
    ) -> ProbeResult | None:
        """The latest probe (of these ``modes``: "float16", "bfloat16", "preflight"), or None.
        Probes marked unreliable (their loss disagreed with the train step's on the same batch
        and weights) are skipped unless ``reliable_only=False``: no finding rests on them.

        Example:
            >>> Run(name=".", path="").latest_probe() is None
            True
        """
        pm = self.probe_model
        if not len(pm):
            return None
        if modes is not None and "mode" in pm:
            pm = pm[pm["mode"].isin(list(modes))]
            if not len(pm):
                return None
        if reliable_only and "reliable" in pm:
            pm = pm[~pm["reliable"].map(_marked_unreliable)]
            if not len(pm):
                return None
        row = pm.sort_values("step", kind="stable").iloc[-1].to_dict()
        step = int(row["step"])

        def at(table: pd.DataFrame) -> pd.DataFrame:
            if not len(table) or "step" not in table:
                return pd.DataFrame()
            return table[table["step"] == step].reset_index(drop=True)

        return ProbeResult(
            step=step,
            model=row,
            layers=at(self.probe_layers),
            variables=at(self.probe_variables),
            sweep=at(self.sweeps),
            histogram=self.histograms.get(step),
            inputs=at(self.probe_inputs),
            float8=at(self.probe_float8),
        )

    def latest_float8(self) -> ProbeResult | None:
        """The latest reliable probe that measured float8 readiness (a probe measures it at
        the first probe and every few after: ``mpwatch.record.probe.probe.FLOAT8_EVERY``), or
        None."""
        pf = self.probe_float8
        if not len(pf) or "step" not in pf:
            return None
        steps = set(int(s) for s in pf["step"].unique())
        pm = self.probe_model
        if len(pm) and "reliable" in pm:
            bad = pm.loc[pm["reliable"].astype(object).eq(False), "step"]
            steps -= set(int(s) for s in bad)
        if not steps:
            return None
        step = max(steps)
        at = pm[pm["step"] == step]
        return ProbeResult(
            step=step,
            model=at.iloc[-1].to_dict() if len(at) else {},
            layers=pd.DataFrame(),
            variables=pd.DataFrame(),
            sweep=pd.DataFrame(),
            float8=pf[pf["step"] == step].reset_index(drop=True),
        )

    def unreliable_probe_steps(self) -> list[int]:
        """The steps of the probes marked unreliable (their loss disagreed with the train step's
        on the same batch and weights), sorted.

        Example:
            >>> Run(name=".", path="").unreliable_probe_steps()
            []
        """
        pm = self.probe_model
        if not len(pm) or "reliable" not in pm:
            return []
        hit = pm[pm["reliable"].map(_marked_unreliable)]
        return sorted({int(s) for s in hit["step"]})

    @property
    def batch_size(self) -> int | None:
        """The training batch size: ``run_info``'s where Keras gave it (Keras 2), else the size of
        the first training batch the probe captured (Keras 3 does not tell callbacks the batch
        size; where the probe ran on its first examples only, the whole batch's size it
        recorded); None when neither was recorded (no probe, or a user-given probe batch).

        Example:
            >>> Run(name=".", path="").batch_size is None
            True
        """
        size = self.info.get("batch_size")
        if isinstance(size, (int, float)) and size > 0:
            return int(size)
        pm = self.probe_model
        if len(pm) and "batch_source" in pm and "batch_size" in pm:
            got = pm[(pm["batch_source"] == "training") & pm["batch_size"].notna()]
            if len(got):
                first = got.sort_values("step", kind="stable").iloc[0]
                whole = pd.to_numeric(first.get("batch_sub_of"), errors="coerce")
                if pd.notna(whole) and whole > 0:  # a probe on the batch's first examples only
                    return int(whole)
                return int(first["batch_size"])
        return None

    def skipped_steps(self) -> pd.Series:
        """Updates the optimizer dropped, by step: ``step -> count`` (int64), skipped steps only.

        From the per-step flag ``mpwatch/step_skipped`` where it was recorded (each skipped step
        counts 1). Without it (a run recorded by a sampling reader, or an older run), from the rises
        of the cumulative ``mpwatch/skipped_steps_total``: a rise between two recorded points counts
        at the later one. ``skipped_steps().sum()`` is the run's total.

        Example:
            >>> len(Run(name=".", path="").skipped_steps())
            0
        """
        empty = pd.Series([], dtype="int64", index=pd.Index([], dtype="int64", name="step"))
        flags = self.scalar(contract.STEP_SKIPPED)
        if len(flags):
            hit = flags[flags > 0.5]
            return pd.Series(1, index=hit.index, dtype="int64") if len(hit) else empty
        total = self.scalar(contract.SKIPPED_STEPS_TOTAL)
        total = total[np.isfinite(total)]
        if not len(total):
            return empty
        rise = np.diff(total.to_numpy(), prepend=0.0)
        out = pd.Series(np.round(rise).astype("int64"), index=total.index)
        return out[out > 0]

    def stepping_loss_scales(self) -> dict[str, float | None] | None:
        """The final loss scale of each optimizer that stepped (None: it scales no loss), by
        name, from the ``train_step`` record, where the compiled optimizer never stepped and
        others did (a GAN's ``d_optimizer`` and ``g_optimizer``): the recorded loss-scale series
        (``mpwatch/loss_scale``) is the compiled optimizer's, and says nothing of this training.
        None otherwise: the series is the training's.

        Example:
            >>> Run(name=".", path="").stepping_loss_scales() is None
            True
        """
        opts = [o for o in self.train_step.get("optimizers") or [] if isinstance(o, Mapping)]

        def stepped(o: Mapping[str, Any]) -> bool:
            """It ran in the train step: its iterations advanced, or (a LossScaleOptimizer whose
            every step was skipped) its scale moved since the fit began."""
            try:
                if int(o.get("iterations") or 0) > int(o.get("iterations_start") or 0):
                    return True
            except (TypeError, ValueError):
                return False
            now, start = finite_float(o.get("loss_scale")), o.get("loss_scale_start")
            return now is not None and isinstance(start, (int, float)) and now != start

        compiled = [o for o in opts if o.get("compiled")]
        others = [o for o in opts if not o.get("compiled") and stepped(o)]
        if not compiled or stepped(compiled[0]) or not others:
            return None
        return {
            str(o.get("name")): finite_float(o.get("loss_scale")) if o.get("loss_scaled") else None
            for o in others
        }

    @property
    def profile_source(self) -> str | None:
        """Where the profile's per-layer precision and time come from (``contract.
        PROFILE_SOURCES``): ``"device_kernels"`` (a GPU trace: what each kernel ran in, from its
        name), ``"host_ops"`` (a CPU trace: ops counted in their layer's dtype), ``"device_ops"``
        (device ops without kernels: older GPU records); None without a profile.

        Example:
            >>> Run(name=".", path="").profile_source is None
            True
        """
        return contract.profile_source(self.profile)

    @property
    def profile_kernels(self) -> dict[str, Any] | None:
        """A GPU trace's run-level kernel figures (the record's ``kernel_summary``: device time by
        precision, ``tensor_core_share`` by mpwatch's reading of the kernel names beside xprof's
        ``xprof_tensor_core_share``, ``unknown_share``, eligible time not on Tensor Cores, ...);
        None on a CPU trace or without a profile.

        Example:
            >>> Run(name=".", path="").profile_kernels is None
            True
        """
        prof = self.profile or {}
        summary = prof.get("kernel_summary")
        return dict(summary) if isinstance(summary, dict) else None

    @property
    def profile_kernel_layers(self) -> pd.DataFrame:
        """A GPU trace's per-layer kernel figures (``contract.PROFILE_KERNEL_LAYER_COLUMNS``: time
        forward and backward, by precision, on Tensor Cores, eligible but not on Tensor Cores, the
        layer's Tensor Core dims), longest first; empty without one."""
        return _profile_table(self.profile, "kernel_layers", contract.PROFILE_KERNEL_LAYER_COLUMNS)

    @property
    def profile_kernel_table(self) -> pd.DataFrame:
        """A GPU trace's kernels, classified (``contract.PROFILE_KERNEL_COLUMNS``), longest first
        (the record may leave the shortest out: ``profile["kernels_dropped"]``); empty without."""
        return _profile_table(self.profile, "kernels", contract.PROFILE_KERNEL_COLUMNS)

    @property
    def profile_layers(self) -> pd.DataFrame:
        """The profile's op time per layer (``contract.PROFILE_LAYER_COLUMNS``: 16- and 32-bit op
        time, casts; on a CPU the host ops); empty without a profile."""
        return _profile_table(self.profile, "layers", contract.PROFILE_LAYER_COLUMNS)

    def __repr__(self) -> str:  # the default would print every table
        return (
            f"Run(name={self.name!r}, path={self.path!r}, steps={len(self.scalars)}, "
            f"scalar_tags={len(self.scalars.columns)}, layers={len(self.layers)}, "
            f"probes={len(self.probe_model)}, profile={self.profile is not None}, "
            f"warnings={len(self.warnings)})"
        )


@dataclass
class ProbeResult:
    """One probe, as :meth:`Run.latest_probe` gives it.

    Attributes:
        step: the probe's step.
        model: the model-wide row (``probe_model`` at that step: underflow_fraction, loss_scale,
            recommended_scale, mode, reference, ...).
        layers: the probe's per-layer table at that step.
        variables: the probe's per-variable table at that step.
        sweep: predicted underflow and overflow at each power-of-two scale.
        histogram: the log2 histogram of the reference gradients, or None.
        inputs: the probe's inputs table (float model inputs and what a 16-bit cast changes).
        float8: the probe's float8 readiness table (one row per Dense/EinsumDense layer; empty
            when not measured).
    """

    step: int
    model: dict[str, Any]
    layers: pd.DataFrame
    variables: pd.DataFrame
    sweep: pd.DataFrame
    histogram: dict[str, Any] | None = None
    inputs: pd.DataFrame = field(default_factory=pd.DataFrame)
    float8: pd.DataFrame = field(default_factory=pd.DataFrame)


#: the probe record's top-level keys that ``probe_model`` carries beside its ``model`` dict
PROBE_TOP_KEYS = (
    "loss_scale",
    "recommended_scale",
    "mode",
    "reference",
    "reference_note",
    "reliable",
    "unreliable_reason",
)


def _marked_unreliable(value: Any) -> bool:
    """Whether a probe's ``reliable`` flag is False (numpy's too); None or NaN (not checked, or an
    older record) is not."""
    return isinstance(value, (bool, np.bool_)) and not bool(value)


def _profile_table(profile: Mapping[str, Any] | None, key: str, columns: list[str]) -> pd.DataFrame:
    """One table of a profile record as a DataFrame (empty, with ``columns``, when absent)."""
    frame = frame_of((profile or {}).get(key))
    return frame if len(frame.columns) else pd.DataFrame(columns=list(columns))


def empty_scalars() -> pd.DataFrame:
    """The scalar table of a run without scalars: no column, an int64 ``step`` index."""
    return pd.DataFrame(index=pd.Index([], dtype="int64", name="step"))


def frame_of(tbl: Any) -> pd.DataFrame:
    """A record's split table as a DataFrame (empty when missing or malformed)."""
    if not isinstance(tbl, dict) or "columns" not in tbl:
        return pd.DataFrame()
    try:
        return pd.DataFrame(tbl.get("data") or [], columns=list(tbl["columns"]))
    except (ValueError, TypeError):
        return pd.DataFrame(columns=list(tbl["columns"]))
