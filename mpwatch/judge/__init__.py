"""Judge: a :class:`mpwatch.read.Run` in, a list of :class:`Finding` out. Pure, no TensorFlow.

- :mod:`mpwatch.judge.finding`: :class:`Finding`, :data:`SEVERITIES`;
- :mod:`mpwatch.judge.rule`: the :class:`Rule` type and the helpers rules share;
- :mod:`mpwatch.judge.rules`: one module per rule, in :data:`~mpwatch.judge.rules.ALL_RULES`;
- :mod:`mpwatch.judge.diagnose`: :func:`diagnose` and friends run them;
- :mod:`mpwatch.judge.docs`: ``docs/rules.md`` from the rules' docstrings.

:data:`RULES` maps each rule id to its :class:`Rule` (title, severities, why, threshold, source).

Example:
    >>> from mpwatch.judge import diagnose
    >>> from mpwatch.read import Run
    >>> diagnose(Run(name=".", path=""))
    []
    >>> RULES["output-16bit"].severities
    ('warning', 'error')
"""

from mpwatch.judge.diagnose import compare_runs, diagnose, diagnose_run, diagnose_runs
from mpwatch.judge.finding import SEVERITIES, Finding
from mpwatch.judge.rule import Rule
from mpwatch.judge.rules import ALL_RULES

#: rule id -> :class:`Rule`, in :data:`~mpwatch.judge.rules.ALL_RULES` order
RULES: dict[str, Rule] = {m.RULE.id: m.RULE for m in ALL_RULES}

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
