"""Rule `recording`: a recording part stopped or was unavailable.

## What it finds
Every notice the recording callbacks wrote (a part that could not run on this model or device,
or stopped after an error), with its part, step and message.

## Why it matters
Missing data means a missing diagnosis: say which part and why.

## Threshold
Any notice record with level error: warning; info otherwise, except an info notice that only
restates a run fact (the loss-scale part's "no loss scale" under a policy that has none, which
run_info records as `loss_scale.kind` "none"). Notices of one part with the same
first line are one finding (with their count and steps); a title keeps the message's first line,
cut at {TITLE_CHARS} characters, and the evidence at most {EVIDENCE_CHARS} characters of the
full message (a Keras config dump does not fill the screen).

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
from mpwatch.words import plain

TITLE_CHARS = 160  # characters of a notice's first line in the title
EVIDENCE_CHARS = 400  # characters of the full message in the evidence

RULE = Rule(
    id="recording",
    title="A recording part stopped or was unavailable",
    severities=("info", "warning"),
    doc=__doc__,
    thresholds={"TITLE_CHARS": TITLE_CHARS, "EVIDENCE_CHARS": EVIDENCE_CHARS},
)


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1].rstrip() + "…"


def check(run: Run) -> list[Finding]:
    """Findings of this rule on one run: one per part, level and message (first line)."""
    groups: dict[tuple[str, str, str], list[dict]] = {}
    no_scale = str((run.info.get("loss_scale") or {}).get("kind")) == "none"
    for n in run.notices:
        lvl = str(n.get("level") or "info")
        msg = plain(n.get("message") or "")  # Keras wraps messages in terminal escapes
        if lvl != "error" and no_scale and str(n.get("part")) == "loss_scale":
            continue  # "no loss scale": a run fact (run_info), not a recording problem
        first = _cut(msg.strip().splitlines()[0] if msg.strip() else "", TITLE_CHARS)
        groups.setdefault((str(n.get("part")), lvl, first), []).append(n)
    out = []
    for (part, lvl, first), notices in groups.items():
        steps = [n.get("step") for n in notices]
        msg = " ".join(plain(notices[0].get("message") or "").split())
        where = (
            f"notice at step {steps[0]}"
            if len(notices) == 1
            else f"{len(notices)} notices, at steps {', '.join(str(s) for s in steps[:10])}"
            + (" ..." if len(steps) > 10 else "")
        )
        evidence = f"{where} (level {lvl})"
        if msg != first:
            evidence += f": {_cut(msg, EVIDENCE_CHARS)}"
        out.append(
            RULE.finding(
                "warning" if lvl == "error" else "info",
                f"Recording part {part!r}: {first}",
                evidence,
                data={
                    "part": notices[0].get("part"),
                    "step": steps[0],
                    "steps": steps,
                    "count": len(notices),
                },  # fmt: skip
            )
        )
    return out
