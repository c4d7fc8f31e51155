"""What a rule declares about its findings beside checking: what they are the cause of, what they
rest on, how they are checked. A rule module sets ``DECLARED = Declared(...)``;
:mod:`mpwatch.judge.folds` applies every rule's declarations in one declared order, so that
``judge/diagnose.py`` names no rule and a new rule's place among the others is in its own file.

Example:
    >>> from mpwatch.judge.finding import Finding
    >>> d = Declared(causes=(Cause("forward overflow", rests=lambda f: f.rule == "loss-scale",
    ...                            when=lambda f: f.severity == "error"),))
    >>> root = Finding("activation-overflow", "error", "t", "e", "fix")
    >>> [c.fold for c in d.causes if c.when(root)]
    ['forward overflow']
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mpwatch.judge.finding import Finding

#: the folds of causes, in the order they apply (:func:`mpwatch.judge.folds.fold_causes`): a
#: broken train step's contract first (what rests on it measured a step that does not exist),
#: then a regression target's range, the inputs' range, and a forward pass out of float16's range
CAUSE_FOLDS = ("train step contract", "target range", "input range", "forward overflow")


def _always(finding: Finding) -> bool:
    return True


@dataclass(frozen=True)
class Cause:
    """One thing a rule's finding is the cause of.

    Attributes:
        fold: which of :data:`CAUSE_FOLDS` it belongs to.
        rests: whether a finding of the same run rests on it (becomes its evidence).
        when: whether a finding of this rule is such a cause (else it is an ordinary finding).
        worst: the cause takes the severity of the worst finding resting on it.
    """

    fold: str
    rests: Callable[[Finding], bool]
    when: Callable[[Finding], bool] = _always
    worst: bool = False

    def __post_init__(self) -> None:
        if self.fold not in CAUSE_FOLDS:
            raise ValueError(f"unknown fold {self.fold!r}: one of {', '.join(CAUSE_FOLDS)}")


@dataclass(frozen=True)
class Declared:
    """A rule's declarations (all optional).

    Attributes:
        causes: what its findings are the cause of (:class:`Cause`).
        layer_cause: its findings keep a layer float32 for a cause in that layer: several such
            findings about one layer are one cause, one finding, headed by the most severe, then
            the lowest ``layer_cause`` rank.
        same_advice_as: rules whose finding giving the same action as this rule's model-wide
            finding is the same advice for the same cause (dropped, listed in its ``also``).
        layer_head_of: rules whose finding about a layer is the same cause as this rule's
            finding about that layer (it becomes the evidence of this one's).
        rests_on_layer: the layer a finding of this rule rests on, where it does (it becomes the
            evidence of that layer's warning or error finding), else None.
        settle: a last word on the run's findings after the folds of causes (a finding this
            rule's measurement makes moot said so).
        superseded_by: a finding of a rule about two runs that replaces this rule's finding
            about the mixed one (a measurement replacing an expectation).
        fix_check: how the probe's fix checks judge a finding that keeps its layer float32,
            ``fix_check(run, finding)`` (None:
            :func:`mpwatch.judge.evidence.fix_checks.settle_layers`,
            the pass made finite, the set grown where needed).
        without_data: the rule is run on a run without mpwatch data too (alone: what in it
            could not be read).
    """

    causes: tuple[Cause, ...] = ()
    layer_cause: int | None = None
    same_advice_as: tuple[str, ...] = ()
    layer_head_of: tuple[str, ...] = ()
    rests_on_layer: Callable[[Finding], str | None] | None = None
    settle: Callable[[list[Finding]], list[Finding]] | None = None
    superseded_by: Callable[[Finding], bool] | None = None
    fix_check: Callable[[Any, Finding], None] | None = None
    without_data: bool = False


#: what a rule that declares nothing declares
NOTHING = Declared()
