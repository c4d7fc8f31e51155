"""Every run's findings for the tab, judged as ``mpwatch diagnose LOGDIR`` judges them
(:func:`findings_by_run`): as dicts of the keys the tab shows, with why there are none when the
advisor failed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mpwatch.read import Run

__all__ = ["FINDING_KEYS", "Judged", "findings_by_run"]

FINDING_KEYS = ("severity", "layer", "rule", "title", "evidence", "fix", "why")


def _finding_json(f: Any) -> dict[str, Any]:
    d = f.to_dict()
    return {k: d.get(k) for k in FINDING_KEYS}


#: run name -> (its findings as dicts, why there are none when the advisor failed)
Judged = dict[str, tuple[list[dict[str, Any]], str | None]]


def findings_by_run(models: Mapping[str, Run]) -> Judged:
    """Each run's findings (as dicts) and why there are none when the advisor failed, judged as
    ``mpwatch diagnose LOGDIR`` judges them: :func:`mpwatch.judge.diagnose_runs` over every run of
    the experiment (a mixed run compared with a float32 run of the same model, a measured
    comparison replacing its ``no-tensor-cores`` finding), then split by run, in the CLI's order.

    ``models``: run name -> its Run. When the joint diagnosis fails (a run still being written may
    be incomplete), each run is judged alone and its note says that it was not compared.
    """
    from mpwatch.judge import diagnose_run, diagnose_runs

    try:
        found = diagnose_runs(list(models.values()))
    except Exception as e:  # keep the tab: judge each run alone, say why
        why = f"{type(e).__name__}: {e}"
        out: Judged = {}
        for name, model in models.items():
            try:
                alone = [_finding_json(f) for f in diagnose_run(model)]
                out[name] = (alone, f"judged alone (the comparison of runs failed: {why})")
            except Exception as e1:  # noqa: BLE001 - this run's data may be incomplete
                out[name] = ([], f"the advisor failed on this run: {type(e1).__name__}: {e1}")
        return out
    by_run: dict[str, list[dict[str, Any]]] = {name: [] for name in models}
    for f in found:
        by_run.setdefault(str(f.run), []).append(_finding_json(f))
    return {name: (items, None) for name, items in by_run.items()}
