"""A pre-flight's report as text, Markdown, JSON or a self-contained HTML page.

It ends where a user acts: the recommendation as code (the policy, the layers to keep in float32,
the loss scale, the code changes), the same advice ``apply_recommendations`` applies, and what the
pre-flight leaves unchecked. Each candidate shows its verdict, what a fit under it as it is will
do (its predictions) and its problems with their evidence.

Example:
    >>> report = mpwatch.preflight(model, (x, y))  # doctest: +SKIP
    >>> print(render(report, "markdown"))  # doctest: +SKIP
"""

from __future__ import annotations

import html
import json
from typing import Any

from mpwatch import words
from mpwatch.judge.evidence.scale_advice import optimizer_code
from mpwatch.judge.fixes.fix import layers_code
from mpwatch.launch import FORMATS
from mpwatch.launch.verdict import Verdict

#: a :class:`mpwatch.launch.check.Preflight` (not imported: it imports this module to render)
Preflight = Any

__all__ = ["FORMATS", "recommendation_code", "render"]



def recommendation_code(report: Preflight) -> str:
    """The recommendation as code: what :func:`mpwatch.apply_recommendations` applies with
    ``report.findings``, written out (and the code changes it cannot apply)."""
    chosen = report.chosen
    if chosen is None:
        return (
            'keras.mixed_precision.set_global_policy("float32")  # no candidate is ready: '
            "see each one's problems"
        )
    lines = [f'keras.mixed_precision.set_global_policy("{chosen.policy}")  # before building']
    if chosen.fix.float32_layers:
        from mpwatch.read import load_run

        run = load_run(chosen.run, warn=False)
        code = layers_code(chosen.fix.float32_layers, run).split("\n# or, without editing")[0]
        lines += ["# the layers to keep in float32:", code]
    if chosen.fix.loss_scale or chosen.fix.dynamic_growth_steps:
        lines.append(optimizer_code(chosen.fix.loss_scale, chosen.fix.dynamic_growth_steps))
    for f in chosen.code_changes:
        lines += [f"# {f.rule}: {f.title}", f.fix]
    lines += [
        "# or, without editing the model code (the policy, layers and loss scale above):",
        "model = mpwatch.apply_recommendations(model, report.findings).model",
    ]
    return "\n".join(lines)


def _prediction_lines(v: Verdict) -> list[str]:
    p = v.predictions
    if not p:
        return []
    scale = p.get("scale") or 1.0
    at = f"at loss scale {words.loss_scale(scale)}" if scale > 1 else "without a loss scale"
    out = []
    if p.get("stuck"):
        out.append(
            f"{at}: the forward pass overflows at {p['first_nonfinite_layer']!r}, at any "
            "scale: every step would be skipped and the loss scale would fall to its floor"
        )
    elif p.get("skips"):
        over = p.get("predicted_overflow_fraction")
        share = f" ({words.percent(over)} of the gradient elements)" if over else ""
        n = p.get("skipped_steps")
        steps = f"from {n[0]} to {n[1]}" if n else "the first"
        low = scale / 2.0 ** n[1] if n else None
        down = (
            f", down to {words.loss_scale(low)}: a scale that protects no small gradient"
            if low is not None and low <= 1.0 else ""
        )  # fmt: skip
        out.append(
            f"{at}: gradients overflow{share}: Keras would skip {steps} steps at the start, "
            f"halving the scale each time until they fit{down}"
        )
    elif p.get("skips") is None and p.get("train_step_draws"):
        bad, n = p["train_step_draws"]
        most = (p.get("skipped_steps") or [0, None])[1]
        upto = f"up to {most} steps" if most else "its first steps"
        out.append(
            f"{at}: the train step's own pass overflows in {bad} of {n} draws of its random "
            f"masks: Keras may skip {upto} at the start, halving the scale each time"
        )
    else:
        out.append(f"{at}: forward and backward passes finite")
    off = p.get("random_layers_off") or []
    if off:
        more = f" and {len(off) - 3} more" if len(off) > 3 else ""
        names = ", ".join(repr(n) for n in off[:3]) + more
        tm = p.get("train_step_pass_finite")
        said = (
            "" if tm is None else "; the train step's own pass, with them on (a few draws), "
            + ("was finite" if tm else "was not in every draw: Keras skips such steps")
        )  # fmt: skip
        out.append(
            f"(the probe's passes run {names} off; the fit's random masks can overflow where "
            f"they did not{said})"
        )
    under, zero = p.get("underflow_fraction"), p.get("zero_fraction")
    if under is not None:
        out.append(
            f"gradient elements below float16's range {at} (underflow): {words.percent(under)}"
        )
    if zero is not None and zero > 2 * (under or 0.0) + 0.01:
        out.append(
            f"zero in the 16-bit pass where float32's are not: {words.percent(zero)} (more than "
            "underflow explains: the findings say why)"
        )
    return out


def _memory_lines(v: Verdict) -> list[str]:
    """Training memory under the candidate by kind and dtype, and under the other policies
    (:func:`mpwatch.show.views.memory_view`)."""
    from mpwatch.read import load_run
    from mpwatch.show.views import memory_view

    try:
        view = memory_view(load_run(v.run, warn=False))
    except Exception:  # noqa: BLE001  (no memory record: nothing to say)
        return []
    if view is None:
        return []
    return ["training memory: " + line for line in view["lines"] if "measured peak" not in line]


def _candidate_text(v: Verdict, md: bool) -> list[str]:
    head = f"{v.policy}: {v.verdict}" + (f" ({v.reason})" if v.reason else "")
    out = [f"### {head}" if md else head]
    bullet = "- " if md else "  "
    out += [bullet + line for line in _prediction_lines(v)]
    out += [bullet + line for line in _memory_lines(v)]
    for f in v.problems:
        where = f" ({f.layer})" if f.layer else ""
        out.append(f"{bullet}{f.severity} {f.rule}{where}: {f.title}")
        out.append(("  " if md else "      ") + f.evidence)
    if v.checked is not None:
        left = ", ".join(f.rule for f in v.checked.problems) or "none"
        out.append(f"{bullet}recorded again with the change ({v.checked.run}): problems left: "
                   f"{left}")  # fmt: skip
        first = _prediction_lines(v.checked)[:1]  # what the fit with the change will show
        out += [f"{bullet}with the change, {line}" for line in first]
    speed = [f for f in v.findings if f.rule not in {"preflight-policy"} and f not in v.problems]
    for f in speed:
        out.append(f"{bullet}{f.severity} {f.rule}: {f.title}")
    return out


def _text(report: Preflight, md: bool) -> str:
    secs = sum(report.seconds.values())
    title = (
        f"mpwatch pre-flight: {len(report.candidates)} polic"
        f"{'y' if len(report.candidates) == 1 else 'ies'} tried on one batch of "
        f"{report.batch_size} ({words.duration_ms(secs * 1000)})"
    )
    chosen = report.chosen
    rec = (
        f"Recommendation: {report.recommended}"
        + (f", {chosen.verdict}" if chosen is not None else ": no candidate is ready")
    )
    code = recommendation_code(report)
    out = [f"# {title}" if md else title, ""]
    out += [f"## {rec}" if md else rec, ""]
    out += ["```python", code, "```"] if md else ["    " + ln for ln in code.split("\n")]
    out.append("")
    for v in report.candidates:
        out += _candidate_text(v, md) + [""]
    out.append("## Unchecked" if md else "Unchecked:")
    out += [("- " if md else "  - ") + u for u in report.unchecked]
    out += [
        "",
        f"The candidates' runs: {report.log_dir} (mpwatch diagnose {report.log_dir}; "
        f"tensorboard --logdir {report.log_dir})",
    ]
    return "\n".join(out) + "\n"


def render(report: Preflight, fmt: str = "text") -> str:
    """``report`` in ``fmt`` (:data:`FORMATS`)."""
    if fmt == "json":
        data = report.to_dict()
        data["code"] = recommendation_code(report)
        for c, v in zip(data["candidates"], report.candidates):
            c["memory"] = _memory_lines(v)
        return json.dumps(data, indent=2, default=str) + "\n"
    if fmt in ("text", "markdown"):
        return _text(report, md=fmt == "markdown")
    if fmt == "html":
        body = html.escape(_text(report, md=False))
        return (
            "<!doctype html><html><head><meta charset=\"utf-8\"><title>mpwatch pre-flight"
            "</title><style>body{font-family:system-ui,sans-serif;margin:2em}pre{white-space:"
            "pre-wrap}</style></head><body><h1>mpwatch pre-flight</h1><pre>" + body
            + "</pre></body></html>\n"
        )
    raise ValueError(f"mpwatch: a pre-flight report is one of {FORMATS}, not {fmt!r}")
