"""A :class:`Finding` (one diagnosis), the :data:`SEVERITIES` and their ranking.

Example:
    >>> f = Finding("recording", "warning", "Recording part 'probe': boom", "notice at step 3")
    >>> f.at_least("info"), f.at_least("error")
    (True, False)
    >>> severity_rank("error") > severity_rank("warning")
    True
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from mpwatch.contract import json_safe

__all__ = ["Finding", "SEVERITIES", "severity_rank", "most_severe_first"]

#: the severities, least severe first
SEVERITIES = ("info", "warning", "error")
_RANK = {s: i for i, s in enumerate(SEVERITIES)}


def severity_rank(severity: str) -> int:
    """0 for ``"info"``, 1 for ``"warning"``, 2 for ``"error"``."""
    return _RANK[severity]


def most_severe_first(findings: list[Finding]) -> list[Finding]:
    """The findings sorted most severe first, then by run, then by rule (stable: a rule's own
    findings keep their order)."""
    return sorted(findings, key=lambda f: (-_RANK[f.severity], f.run or "", f.rule))


@dataclass
class Finding:
    """One diagnosis.

    Attributes:
        rule: the rule's id (a key of :data:`mpwatch.judge.RULES`).
        severity: ``"info"``, ``"warning"`` or ``"error"``.
        title: one line.
        evidence: the numbers that triggered it.
        fix: what to change, as code.
        layer: the layer it is about, or None for the whole run.
        run: the run's name (set by :func:`mpwatch.judge.diagnose` on a logdir).
        why: why it matters (the rule's rationale).
        source: where the rule comes from (public titles and URLs).
        action: machine-readable advice for :func:`mpwatch.apply_recommendations`
            (``{"dtype": "float32"}`` to keep ``layer`` in float32, ``{"loss_scale": S}``, ...).
        data: the numbers, machine-readable.
    """

    rule: str
    severity: str
    title: str
    evidence: str
    fix: str = ""
    layer: str | None = None
    run: str | None = None
    why: str = ""
    source: str = ""
    action: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, not {self.severity!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (non-finite numbers become None)."""
        return json_safe(asdict(self))

    def at_least(self, severity: str) -> bool:
        return _RANK[self.severity] >= _RANK[severity]
