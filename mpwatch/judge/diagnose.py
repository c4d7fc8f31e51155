"""Run the rules: :func:`diagnose` (a Run, several, or a logdir), :func:`diagnose_run`,
:func:`diagnose_runs`, :func:`compare_all`. Findings come back most severe first, one per cause.

No TensorFlow here: every rule reads the tables of a :class:`~mpwatch.read.run.Run` (see
``mpwatch/contract/`` for schemas), so the rules run in milliseconds and are tested on constructed
tables. The TensorBoard tab and ``mpwatch diagnose`` both call :func:`diagnose`: a recommendation
is computed in one place. This module names no rule: what a rule's findings are the cause of,
rest on or are replaced by, each rule declares (:mod:`mpwatch.judge.declare`), and
:data:`mpwatch.judge.folds.FOLDS` applies it in one declared order.

Example:
    >>> import mpwatch  # doctest: +SKIP
    >>> for f in mpwatch.diagnose("logs/run1"):  # doctest: +SKIP
    ...     print(f.severity, f.title)
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from mpwatch.judge.finding import Finding, most_severe_first
from mpwatch.judge.folds import FOLDS, declared
from mpwatch.judge.rule import policy
from mpwatch.judge.rules import PAIR_RULES, RUN_RULES
from mpwatch.read import Run, load_run, load_runs

__all__ = [
    "diagnose",
    "diagnose_run",
    "diagnose_runs",
    "compare_all",
    "compare_runs",
    "model_structure",
    "in_place_for_subclassed",
    "one_advice",
]


def diagnose_run(run: Run) -> list[Finding]:
    """Every run-level rule on one Run, folded into one finding per cause
    (:data:`mpwatch.judge.folds.FOLDS`), most severe first, each fix one advice (printed and
    applied alike: :func:`in_place_for_subclassed`, :func:`one_advice`)."""
    out: list[Finding] = []
    for rule in RUN_RULES:
        for f in rule.check(run):
            if f.run is None:
                f.run = run.name
            out.append(f)
    for fold in FOLDS:
        out = fold(run, out)
    return one_advice(in_place_for_subclassed(run, most_severe_first(out)))


def in_place_for_subclassed(run: Run, findings: list[Finding]) -> list[Finding]:
    """On a subclassed model (``run_info``'s model kind), which ``apply_recommendations`` cannot
    clone layer by layer (it says so and raises), a fix's "without editing the model code" way
    is the layers' policies set on the model itself before it trains, the same layers as the
    advice (:class:`~mpwatch.judge.fixes.fix.Fix`), never a call that fails."""
    from mpwatch.judge.evidence.graph import APPLY_TAIL
    from mpwatch.judge.fixes.fix import Fix

    if ((run.info.get("model") or {}).get("kind")) != "subclassed":
        return findings
    tail = "\n".join(APPLY_TAIL)
    for f in findings:
        names = Fix.of(f).float32_layers
        if tail not in (f.fix or "") or not names:
            continue
        listed = ", ".join(f'"{n}"' for n in names) + ("," if len(names) == 1 else "")
        f.fix = f.fix.replace(
            tail,
            "# or, on this model before it trains (a subclassed model: apply_recommendations\n"
            "# cannot clone it), each of these layers and the layers under it:\n"
            "for layer in model._flatten_layers():\n"
            f"    if layer.name in ({listed}):\n"
            "        for sub in layer._flatten_layers():\n"
            '            sub.dtype_policy = "float32"',
        )
    return findings


#: set (the test suite does) to make a finding whose printed code and applied advice disagree
#: an error instead of a logged warning
STRICT_ENV = "MPWATCH_STRICT_ADVICE"


def one_advice(findings: list[Finding]) -> list[Finding]:
    """Each finding's printed code keeps the same layers in float32 as its applied advice
    (:func:`mpwatch.judge.fixes.fix.disagreement`); where not, a bug of mpwatch's: said, and kept in
    the finding's data (``fix_disagrees``), or raised under :data:`STRICT_ENV`."""
    import logging

    from mpwatch.judge.fixes.fix import disagreement

    for f in findings:
        why = disagreement(f)
        if why is None:
            continue
        if os.environ.get(STRICT_ENV):
            raise AssertionError(f"finding {f.rule} ({f.layer}): {why}")
        logging.getLogger("mpwatch").warning("mpwatch: finding %s: %s", f.rule, why)
        f.data = {**f.data, "fix_disagrees": why}
    return findings


def compare_runs(mixed: Run, fp32: Run) -> list[Finding]:
    """Every rule about two runs on a mixed run and a float32 run of the same model (step time,
    memory and loss)."""
    out: list[Finding] = []
    for rule in PAIR_RULES:
        out.extend(rule.check_pair(mixed, fp32))
    return out


def model_structure(run: Run) -> tuple[Any, ...] | None:
    """What makes two runs the same model: the parameter count and, layer by layer in the layer
    table, the class and parameter count (names are left out: Keras numbers them per session);
    without a layer table, the model's name, class and parameter count. None when the run records
    neither."""
    m = run.info.get("model") or {}
    lt = run.layers
    if len(lt) and "class" in lt and "params" in lt:
        layers = tuple(
            (str(c), int(p) if p == p and p is not None else None)
            for c, p in zip(lt["class"], lt["params"])
        )
        return ("layers", m.get("params"), layers)
    if m:
        return ("model", m.get("name"), m.get("class"), m.get("params"))
    return None


def compare_all(runs: Iterable[Run]) -> list[Finding]:
    """Pair each mixed run with the first float32 run of the same model
    (:func:`model_structure`: same parameter count and the same layer classes and parameter
    counts) and compare them (:func:`compare_runs`)."""
    runs = [r for r in runs if r.info]
    out = []
    f32 = [r for r in runs if policy(r) == "float32"]
    mixed = [r for r in runs if policy(r).startswith("mixed_")]
    for m in mixed:
        key = model_structure(m)
        if key is None:
            continue
        partner = [f for f in f32 if model_structure(f) == key]
        if partner:
            out.extend(compare_runs(m, partner[0]))
    return out


def diagnose_runs(runs: Mapping[str, Run] | Iterable[Run]) -> list[Finding]:
    """Every rule on every run with mpwatch data, plus the comparisons of mixed runs with float32
    runs of the same model (which replace the findings they measure: :func:`superseded`). A run
    without data gets the findings of the rules that declare ``without_data`` alone: what in it
    could not be read."""
    items = list(runs.values()) if isinstance(runs, Mapping) else list(runs)
    out: list[Finding] = []
    for r in items:
        if r.has_data:
            out.extend(diagnose_run(r))
        else:
            for rule in RUN_RULES:  # what in it could not be read
                if declared(rule.RULE.id).without_data:
                    out.extend(replace(f, run=r.name) for f in rule.check(r))
    pairs = compare_all(r for r in items if r.has_data)
    out = [f for f in out if not superseded(f, pairs)]
    out.extend(pairs)
    return most_severe_first(out)


def superseded(f: Finding, pairs: list[Finding]) -> bool:
    """Whether a finding about a mixed run is replaced by a finding about it and a float32 run
    of the same model, as its rule declares (``superseded_by``: a measurement replacing an
    expectation)."""
    by = declared(f.rule).superseded_by
    return by is not None and any(p.run == f.run and by(p) for p in pairs)


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
