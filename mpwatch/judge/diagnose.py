"""Run the rules: :func:`diagnose` (a Run, several, or a logdir), :func:`diagnose_run`,
:func:`diagnose_runs`, :func:`compare_all`. Findings come back most severe first.

No TensorFlow here: every rule reads the tables of a :class:`~mpwatch.read.run.Run` (see
``contract.py`` for their schemas), so the rules run in milliseconds and are tested on constructed
tables. The TensorBoard tab and ``mpwatch diagnose`` both call :func:`diagnose`: a recommendation
is computed in one place.

Example:
    >>> import mpwatch  # doctest: +SKIP
    >>> for f in mpwatch.diagnose("logs/run1"):  # doctest: +SKIP
    ...     print(f.severity, f.title)
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from mpwatch.judge.finding import Finding, most_severe_first
from mpwatch.judge.rule import policy
from mpwatch.judge.rules import PAIR_RULES, RUN_RULES
from mpwatch.read.run import Run, load_run, load_runs

__all__ = ["diagnose", "diagnose_run", "diagnose_runs", "compare_all", "compare_runs"]


def diagnose_run(run: Run) -> list[Finding]:
    """Every run-level rule on one Run, most severe first."""
    out: list[Finding] = []
    for rule in RUN_RULES:
        for f in rule.check(run):
            if f.run is None:
                f.run = run.name
            out.append(f)
    return most_severe_first(out)


def compare_runs(mixed: Run, fp32: Run) -> list[Finding]:
    """Every rule about two runs on a mixed run and a float32 run of the same model (today:
    ``mixed-vs-float32``: step time, memory and loss)."""
    out: list[Finding] = []
    for rule in PAIR_RULES:
        out.extend(rule.check_pair(mixed, fp32))
    return out


def _model_key(run: Run) -> tuple[Any, Any] | None:
    m = run.info.get("model") or {}
    if not m:
        return None
    return (m.get("name"), m.get("params"))


def compare_all(runs: Iterable[Run]) -> list[Finding]:
    """Pair each mixed run with the first float32 run of the same model (name and parameter
    count, else parameter count alone) and compare them (:func:`compare_runs`)."""
    runs = [r for r in runs if r.info]
    out = []
    f32 = [r for r in runs if policy(r) == "float32"]
    mixed = [r for r in runs if policy(r).startswith("mixed_")]
    for m in mixed:
        key = _model_key(m)
        partner = [f for f in f32 if key is not None and _model_key(f) == key]
        if not partner:
            # same model class and parameter count, differently named
            mk = (m.info.get("model") or {}).get("params")
            partner = [f for f in f32 if mk and (f.info.get("model") or {}).get("params") == mk]
        if partner:
            out.extend(compare_runs(m, partner[0]))
    return out


def diagnose_runs(runs: Mapping[str, Run] | Iterable[Run]) -> list[Finding]:
    """Every rule on every run with mpwatch data, plus the mixed-vs-float32 comparisons."""
    items = list(runs.values()) if isinstance(runs, Mapping) else list(runs)
    out: list[Finding] = []
    for r in items:
        if r.has_data:
            out.extend(diagnose_run(r))
    out.extend(compare_all(r for r in items if r.has_data))
    return most_severe_first(out)


def diagnose(
    run_or_logdir: Run | str | os.PathLike[str] | Mapping[str, Run] | Iterable[Run],
    run: str | None = None,
) -> list[Finding]:
    """Findings for a Run, several Runs, or a logdir (every run in it, or the one named ``run``).

    Most severe first. Each Finding's ``run`` names the run it is about.

    Example:
        >>> findings = diagnose("logs")  # doctest: +SKIP
        >>> [f.title for f in findings if f.severity == "error"]  # doctest: +SKIP
    """
    if isinstance(run_or_logdir, Run):
        return diagnose_run(run_or_logdir)
    if isinstance(run_or_logdir, (str, os.PathLike)):
        if run is not None:
            return diagnose_run(load_run(run_or_logdir, run, warn=False))
        return diagnose_runs(load_runs(run_or_logdir))
    return diagnose_runs(run_or_logdir)
