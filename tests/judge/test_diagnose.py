"""diagnose / diagnose_run / diagnose_runs over every rule: order, serialization, no TensorFlow."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from builders import (
    healthy_run,
    make_run,
    model_row,
    probe_layer,
    write_float32_run,
    write_mixed_run,
)

from mpwatch.judge import RULES, SEVERITIES, Finding, diagnose, diagnose_run, diagnose_runs
from mpwatch.judge.diagnose import compare_all
from mpwatch.read.run import Run


def test_healthy_run_has_only_info():
    findings = diagnose(healthy_run())
    assert [f.rule for f in findings if f.severity != "info"] == []
    assert {f.rule for f in findings} <= {"float32-inside"}


def test_every_rule_is_documented_and_findings_serialize_most_severe_first():
    for r in RULES.values():
        assert r.why and r.threshold and r.source
    inf = float("inf")
    probes = {10: (model_row(uf=0.5, mx=inf), [probe_layer("dense", mx=inf)])}
    findings = diagnose(make_run(probes=probes))
    assert findings
    for f in findings:
        assert f.rule in RULES
        d = f.to_dict()
        assert d["severity"] in SEVERITIES
        json.dumps(d, allow_nan=False)
    order = [SEVERITIES.index(f.severity) for f in findings]
    assert order == sorted(order, reverse=True)
    with pytest.raises(ValueError):
        Finding("x", "fatal", "t", "e")


def test_findings_name_their_run():
    run = make_run("r1")
    assert diagnose_run(run) and all(f.run == "r1" for f in diagnose_run(run))


def test_empty_run_has_no_findings():
    assert diagnose(Run(name=".", path="/x")) == []
    assert diagnose_runs([Run(name=".", path="/x")]) == []


def test_logdir_runs_and_mapping_agree(tmp_path):
    write_mixed_run(str(tmp_path / "mixed"))
    write_float32_run(str(tmp_path / "fp32"))
    from mpwatch.read import load_runs

    runs = load_runs(tmp_path)
    by_logdir = [f.to_dict() for f in diagnose(tmp_path)]
    assert by_logdir == [f.to_dict() for f in diagnose(runs)]
    assert by_logdir == [f.to_dict() for f in diagnose_runs(list(runs.values()))]
    assert {f["rule"] for f in by_logdir} >= {"output-16bit", "skipped-steps", "mixed-vs-float32"}
    assert [f.to_dict() for f in diagnose(tmp_path, run="mixed")] == [
        f.to_dict() for f in diagnose_run(runs["mixed"])
    ]
    assert len(compare_all(runs.values())) == 1


def test_the_judge_imports_no_tensorflow():
    code = (
        "import sys, mpwatch.judge, mpwatch.judge.docs, mpwatch.judge.rules; "
        "print('tensorflow' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_one_finding_per_layer_cause():
    """A layer over output-rel-error's threshold whose gradient also errs: one finding (the most
    severe, then the lowest declared layer_cause rank), the other's title in its evidence."""
    from mpwatch.judge.folds import declared, one_per_layer

    a = Finding("output-rel-error", "warning", "out err", "e1", layer="dense", run="r",
                action={"dtype": "float32"})  # fmt: skip
    b = Finding("gradient-error", "error", "grad err", "e2", layer="dense", run="r",
                action={"dtype": "float32"})  # fmt: skip
    c = Finding("gradient-error", "warning", "other layer", "e3", layer="conv2d", run="r")
    d = Finding("loss-scale", "warning", "not a layer cause", "e4", layer="dense", run="r")
    out = one_per_layer([a, b, c, d])
    assert [f.title for f in out] == ["grad err", "other layer", "not a layer cause"]
    assert out[0].evidence == "e2; also: out err (output-rel-error)"
    assert out[0].data["also"] == ["output-rel-error"]
    assert declared("output-16bit").layer_cause == 0  # the first of the layer causes
    assert declared("loss-scale").layer_cause is None


def test_the_same_scale_advice_is_one_finding():
    """gradient-underflow and loss-scale share scale_evidence: when both give the same action for
    one run, the loss-scale finding is dropped (its rule in data["also"]); other runs and other
    actions are kept."""
    from mpwatch.judge.folds import fold_same_advice as fold_shared_advice

    act = {"loss_scale": 131072.0, "float32_layers": ["d1", "d2"]}
    under = Finding("gradient-underflow", "error", "30% underflow", "e", run="r", action=dict(act))
    same = Finding("loss-scale", "warning", "start at 2^17", "e", run="r", action=dict(act))
    other_run = Finding("loss-scale", "warning", "x", "e", run="q", action=dict(act))
    other_act = Finding("loss-scale", "warning", "y", "e", run="r", action={"loss_scale": 8.0})
    out = fold_shared_advice([under, same, other_run, other_act])
    assert out == [under, other_run, other_act]
    assert under.data["also"] == ["loss-scale"]


def test_pairing_needs_the_same_structure():
    from mpwatch.judge.diagnose import model_structure

    a, b = make_run("a"), make_run("b", policy="float32")
    assert model_structure(a) == model_structure(b)  # same classes and parameters, any policy
    c = make_run("c", policy="float32")
    c.layers.loc[0, "params"] = 841
    assert model_structure(c) != model_structure(a)


def test_diagnose_names_no_rule_and_the_declarations_hold_together():
    """The judge by declaration: judge/diagnose.py and judge/folds.py name no rule (no rule id,
    no rule module); what each rule's findings are the cause of, rest on or are replaced by is
    declared in the rule's own module, and every rule a declaration names exists."""
    import ast
    from pathlib import Path

    import mpwatch.judge as judge
    from mpwatch.judge.declare import Declared
    from mpwatch.judge.rules import ALL_RULES

    ids = {m.RULE.id for m in ALL_RULES}
    modules = {m.__name__.rsplit(".", 1)[-1] for m in ALL_RULES}
    here = Path(judge.__file__).parent
    for name in ("diagnose.py", "folds.py"):
        tree = ast.parse((here / name).read_text())
        said = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)} & ids
        assert not said, (name, said)
        imported = {
            a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names
        } | {n.module.rsplit(".", 1)[-1] for n in ast.walk(tree)
             if isinstance(n, ast.ImportFrom) and n.module}  # fmt: skip
        assert not imported & modules, (name, imported & modules)
    ranks = []
    for m in ALL_RULES:
        d = getattr(m, "DECLARED", Declared())
        assert isinstance(d, Declared), m.__name__
        assert set(d.same_advice_as) <= ids and set(d.layer_head_of) <= ids, m.__name__
        if d.layer_cause is not None:
            ranks.append(d.layer_cause)
    assert len(ranks) == len(set(ranks)) == 7  # the layer causes, each its own rank
