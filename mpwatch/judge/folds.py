"""One finding per cause: the rules' declarations (:mod:`mpwatch.judge.declare`, each rule
module's ``DECLARED``) applied to a run's findings in one declared order, :data:`FOLDS`.

In order: the probe's fix checks said in each finding that keeps a layer float32
(:func:`checked_fixes`); each of :data:`~mpwatch.judge.declare.CAUSE_FOLDS` (:func:`fold_causes`:
the findings resting on a cause become its evidence); the same advice said once
(:func:`fold_same_advice`); a layer's head finding taking the same layer's findings of the same
cause (:func:`fold_layer_heads`); the rules' last words (:func:`settle`); one finding per layer
kept float32 (:func:`one_per_layer`); a consequence into the layer it rests on
(:func:`fold_into_layers`). A finding that becomes another's evidence leaves the list: its
title in the head's evidence (``"; also: ..."``), its rule in ``data["also"]``.

Example:
    >>> from mpwatch.judge.finding import Finding
    >>> root = Finding("train-step", "error", "Loss not scaled", "e", "fix",
    ...                data={"cause": "loss_not_scaled"})
    >>> rest = Finding("loss-scale", "warning", "Scale low", "e", "fix")
    >>> [f.rule for f in fold_causes([root, rest])], root.data["also"]
    (['train-step'], ['loss-scale'])
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from mpwatch.judge.declare import CAUSE_FOLDS, NOTHING, Cause, Declared
from mpwatch.judge.finding import Finding, severity_rank

__all__ = [
    "FOLDS",
    "declared",
    "checked_fixes",
    "fold_causes",
    "fold_into_root",
    "fold_same_advice",
    "fold_layer_heads",
    "settle",
    "one_per_layer",
    "fold_into_layers",
    "absorb",
]


@cache
def _declarations() -> dict[str, Declared]:
    from mpwatch.judge.rules import ALL_RULES

    return {m.RULE.id: getattr(m, "DECLARED", NOTHING) for m in ALL_RULES}


def declared(rule: str) -> Declared:
    """What the rule ``rule`` (an id) declares (nothing, for an unknown id)."""
    return _declarations().get(rule, NOTHING)


def absorb(head: Finding, f: Finding) -> None:
    """``f`` becomes evidence of ``head``: its title (and what it had absorbed) in ``head``'s
    evidence, its rule (and theirs) in ``head.data["also"]``."""
    absorbed = [(f.rule, f.title), *f.data.get("also_titles", [])]
    head.evidence += "".join(f"; also: {t} ({r})" for r, t in absorbed)
    head.data = {
        **head.data,
        "also": [*head.data.get("also", []), *(r for r, _ in absorbed)],
        "also_titles": [*head.data.get("also_titles", []), *absorbed],
    }


# --- the probe's fix checks ----------------------------------------------------------------------
def checked_fixes(run: Any, findings: list[Finding]) -> list[Finding]:
    """Each finding that keeps a layer float32 (``action["dtype"] == "float32"``) with what the
    probe's fix checks saw (:mod:`mpwatch.judge.evidence.fix_checks`), by its rule's declared
    ``fix_check``, else :func:`mpwatch.judge.evidence.fix_checks.settle_layers` (the advice grown
    to the
    checked set, or withdrawn where nothing fixed it)."""
    from mpwatch.judge.evidence.fix_checks import latest_checks, settle_layers, stopped

    latest = latest_checks(run)
    why = stopped(latest[2]) if latest else None  # the checks the advice is judged by stopped
    for f in findings:
        if not f.layer or f.action.get("dtype") != "float32":
            continue
        own = declared(f.rule).fix_check
        if own is not None:
            own(run, f)
        else:
            settle_layers(run, f, why)
    return findings


# --- causes --------------------------------------------------------------------------------------
def fold_into_root(
    findings: list[Finding],
    is_root: Callable[[Finding], bool],
    rests_on: Callable[[Finding, Finding], bool],
    worst: Callable[[Finding], bool] = lambda root: False,
) -> list[Finding]:
    """In each run, the findings that rest on that run's root finding (the most severe one for
    which ``is_root`` holds, the last of equals; ``rests_on(root, f)``) become its evidence
    (:func:`absorb`) instead of findings of their own: the one mechanism of every
    cause-and-consequence fold. Where ``worst(root)``, the root takes the severity of the worst
    finding it absorbs (a cause whose consequences are errors is one)."""
    roots: dict[Any, Finding] = {}
    for f in findings:
        if is_root(f):
            had = roots.get(f.run)
            if had is None or severity_rank(f.severity) >= severity_rank(had.severity):
                roots[f.run] = f
    if not roots:
        return findings
    out = []
    for f in findings:
        root = roots.get(f.run)
        if root is not None and f is not root and rests_on(root, f):
            absorb(root, f)
            if worst(root) and severity_rank(f.severity) > severity_rank(root.severity):
                root.severity = f.severity
            continue
        out.append(f)
    return out


def _cause(f: Finding, fold: str) -> Cause | None:
    """The cause of ``fold`` a finding is, by its rule's declaration, or None."""
    return next((c for c in declared(f.rule).causes if c.fold == fold and c.when(f)), None)


def fold_causes(findings: list[Finding]) -> list[Finding]:
    """Each fold of :data:`~mpwatch.judge.declare.CAUSE_FOLDS` in turn: in each run, the findings
    resting on its root (the most severe finding that is a cause of that fold) become the root's
    evidence."""
    for fold in CAUSE_FOLDS:
        findings = fold_into_root(
            findings,
            lambda f, fold=fold: _cause(f, fold) is not None,
            lambda root, f, fold=fold: _cause(root, fold).rests(f),  # type: ignore[union-attr]
            lambda root, fold=fold: _cause(root, fold).worst,  # type: ignore[union-attr]
        )
    return findings


# --- the same cause said once ---------------------------------------------------------------------
def fold_same_advice(findings: list[Finding]) -> list[Finding]:
    """A run's finding of a rule another rule's model-wide finding names in ``same_advice_as``,
    whose action is that finding's, is the same advice for the same cause: it is dropped, its
    rule listed in the head's ``data["also"]`` (whose evidence quotes the advice already)."""
    heads = {
        (f.run, rule): f
        for f in findings
        if f.layer is None and f.action
        for rule in declared(f.rule).same_advice_as
    }
    out = []
    for f in findings:
        head = heads.get((f.run, f.rule))
        if head is not None and f is not head and f.action == head.action:
            head.data = {**head.data, "also": [*head.data.get("also", []), f.rule]}
            continue
        out.append(f)
    return out


def fold_layer_heads(findings: list[Finding]) -> list[Finding]:
    """A layer's finding of a rule declaring ``layer_head_of`` takes the same run's and layer's
    findings of those rules as its evidence."""
    heads = {
        (f.run, f.layer, rule): f
        for f in findings
        if f.layer
        for rule in declared(f.rule).layer_head_of
    }
    out = []
    for f in findings:
        head = heads.get((f.run, f.layer, f.rule)) if f.layer else None
        if head is not None and head is not f:
            absorb(head, f)
            continue
        out.append(f)
    return out


def settle(findings: list[Finding]) -> list[Finding]:
    """Each rule's declared last word on the run's findings (``settle``), in the rules' order."""
    from mpwatch.judge.rules import ALL_RULES

    for m in ALL_RULES:
        hook = declared(m.RULE.id).settle
        if hook is not None:
            findings = hook(findings)
    return findings


def one_per_layer(findings: list[Finding]) -> list[Finding]:
    """Findings of rules declaring ``layer_cause`` about the same layer of the same run merged
    into the most severe one (then the lowest rank): the others' titles (and what they had
    absorbed) become its evidence; then a finding whose layer another finding of the run keeps
    float32 too (its checked, grown set), no less severe, becomes that one's evidence: one
    change, one finding."""
    rank = {f.rule: declared(f.rule).layer_cause for f in findings}
    mergeable = [f for f in findings if rank[f.rule] is not None and f.layer]
    mergeable.sort(key=lambda f: (-severity_rank(f.severity), rank[f.rule]))
    keep: dict[tuple[str | None, str], Finding] = {}
    merged: set[int] = set()
    for f in mergeable:
        head = keep.setdefault((f.run, str(f.layer)), f)
        if head is not f:
            absorb(head, f)
            merged.add(id(f))
    return _into_grown_sets([f for f in findings if id(f) not in merged], rank)


def _into_grown_sets(findings: list[Finding], rank: dict[str, int | None]) -> list[Finding]:
    from mpwatch.judge.fixes.fix import Fix

    grown = [
        (f, set(Fix.of(f).float32_layers)) for f in findings
        if rank[f.rule] is not None and len(Fix.of(f).float32_layers) > 1
    ]  # fmt: skip
    out = []
    for f in findings:
        head = next(
            (
                g for g, names in grown
                if g is not f and g.run == f.run and f.layer in names
                and severity_rank(g.severity) >= severity_rank(f.severity)
            ),
            None,
        )  # fmt: skip
        if head is not None and rank[f.rule] is not None and f.action.get("dtype") == "float32":
            absorb(head, f)
        else:
            out.append(f)
    return out


def fold_into_layers(findings: list[Finding]) -> list[Finding]:
    """A finding whose rule declares the layer it rests on (``rests_on_layer``) becomes the
    evidence of the same run's warning or error finding about that layer, where there is one."""
    heads: dict[tuple[str | None, str], Finding] = {}
    for f in findings:
        if f.layer and f.severity in ("warning", "error"):
            heads.setdefault((f.run, str(f.layer)), f)
    out = []
    for f in findings:
        on = declared(f.rule).rests_on_layer
        layer = on(f) if on is not None else None
        head = heads.get((f.run, layer)) if layer else None
        if head is not None and head is not f:
            absorb(head, f)
            continue
        out.append(f)
    return out


def _run_free(fold: Callable[[list[Finding]], list[Finding]]) -> Callable[..., list[Finding]]:
    return lambda run, findings: fold(findings)


#: the folds, in the order they apply to one run's findings: ``fold(run, findings)``
FOLDS: tuple[Callable[[Any, list[Finding]], list[Finding]], ...] = (
    checked_fixes,
    _run_free(fold_causes),
    _run_free(fold_same_advice),
    _run_free(fold_layer_heads),
    _run_free(settle),
    _run_free(one_per_layer),
    _run_free(fold_into_layers),
)
