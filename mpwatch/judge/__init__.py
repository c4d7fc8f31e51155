"""Judge: a :class:`mpwatch.read.Run` in, a list of :class:`Finding` out. Pure, no TensorFlow.

Example:
    >>> from mpwatch.judge import diagnose
    >>> from mpwatch.read import Run
    >>> diagnose(Run(name=".", path=""))
    []
"""

from mpwatch.judge.advisor import (
    RULES,
    SEVERITIES,
    Finding,
    Rule,
    compare_runs,
    diagnose,
    diagnose_run,
    diagnose_runs,
)

__all__ = [
    "RULES",
    "SEVERITIES",
    "Finding",
    "Rule",
    "compare_runs",
    "diagnose",
    "diagnose_run",
    "diagnose_runs",
]
