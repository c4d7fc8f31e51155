"""Rule `recording`: a recording part stopped or was unavailable.

## What it finds
Every notice the recording callbacks wrote (a part that could not run on this model or device,
or stopped after an error), with its part, step and message.

## Why it matters
Missing data means a missing diagnosis: say which part and why.

## Threshold
Any notice record with level error: warning; info otherwise.

## Example evidence
```text
Recording part 'probe': the float32 reference could not be built
notice at step 3 (level error)
```

## Fix
No code: the notice's message says what was missing and why; the other findings of the run are
computed without that part's data.

## References
- `mpwatch.contract`: the `notice` record (part, level, message) the recording parts write
"""

from __future__ import annotations

from mpwatch.judge.finding import Finding
from mpwatch.judge.rule import Rule
from mpwatch.read.run import Run

RULE = Rule(
    id="recording",
    title="A recording part stopped or was unavailable",
    severities=("info", "warning"),
    doc=__doc__,
)


def check(run: Run) -> list[Finding]:
    """Findings of this rule on one run: one per notice."""
    out = []
    for n in run.notices:
        lvl = str(n.get("level") or "info")
        out.append(
            RULE.finding(
                "warning" if lvl == "error" else "info",
                f"Recording part {n.get('part')!r}: {n.get('message')}",
                f"notice at step {n.get('step')} (level {lvl})",
                data={"part": n.get("part"), "step": n.get("step")},
            )
        )
    return out
