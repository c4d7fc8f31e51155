"""The rules' documentation: every rule module in ruff's shape, docs/rules.md generated from it
and up to date, and nothing shown to users cites material users do not have."""

from __future__ import annotations

import os
import re

import pytest
from builders import (
    healthy_run,
    make_run,
    model_row,
    probe_layer,
    profile_payload,
    write_float32_run,
    write_mixed_run,
)

from mpwatch.judge import RULES, SEVERITIES, diagnose
from mpwatch.judge.docs import render_rules_markdown
from mpwatch.judge.rule import PUBLIC_REFERENCES, SECTIONS
from mpwatch.judge.rules import ALL_RULES, PAIR_RULES, RUN_RULES

DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "rules.md")
# what users do not have: the project's internal seeds, design notes and shared folder
INTERNAL = re.compile(r"seed|DESIGN\.md|shared/", re.IGNORECASE)


def test_docs_rules_md_is_generated_from_the_rules():
    with open(DOCS, encoding="utf-8") as fh:
        on_disk = fh.read()
    assert on_disk == render_rules_markdown(), (
        "docs/rules.md is out of date: python -m mpwatch.show.docs"
    )


@pytest.mark.parametrize("module", ALL_RULES, ids=lambda m: m.RULE.id)
def test_rule_module_shape(module):
    rule = module.RULE
    assert module.__name__.rsplit(".", 1)[1] == rule.id.replace("-", "_")
    assert RULES[rule.id] is rule
    assert module.__doc__ == rule.doc
    assert rule.summary.startswith(f"Rule `{rule.id}`:")
    headings = re.findall(r"^## (.+)$", rule.text, flags=re.MULTILINE)
    assert tuple(headings) == SECTIONS
    assert "{" not in rule.threshold and "}" not in rule.threshold  # every field filled in
    assert rule.severities == tuple(s for s in SEVERITIES if s in rule.severities)
    assert (module in RUN_RULES) != (module in PAIR_RULES)
    assert callable(getattr(module, "check", None) or getattr(module, "check_pair", None))


@pytest.mark.parametrize("module", ALL_RULES, ids=lambda m: m.RULE.id)
def test_references_are_public(module):
    refs = module.RULE.references
    assert refs
    for title, url, _note in refs:
        if url is None:
            assert title.startswith("mpwatch"), title  # mpwatch's own (installed) modules
        else:
            assert PUBLIC_REFERENCES.get(url) == title, (title, url)


def _diagnosed_runs(tmp_path):
    inf = float("inf")
    write_mixed_run(str(tmp_path / "mixed"))
    write_float32_run(str(tmp_path / "fp32"))
    found = diagnose(tmp_path)
    found += diagnose(
        make_run(
            probes={10: (model_row(uf=0.5, mx=inf, first="dense"), [probe_layer("dense", mx=inf)])}
        )
    )
    found += diagnose(make_run(policy="float32"))
    found += diagnose(make_run(profile=profile_payload()))
    found += diagnose(healthy_run())
    return found


def test_nothing_shown_to_users_cites_internal_material(tmp_path):
    for rule in RULES.values():
        for text in (rule.text, rule.title, rule.why, rule.threshold, rule.source):
            assert not INTERNAL.search(text), (rule.id, INTERNAL.search(text).group(0))
    findings = _diagnosed_runs(tmp_path)
    assert {f.rule for f in findings} >= {
        "output-16bit",
        "activation-overflow",
        "profile",
        "try-mixed-precision",
        "mixed-vs-float32",
    }
    for f in findings:
        for text in (f.title, f.evidence, f.fix, f.why, f.source):
            assert not INTERNAL.search(text), (f.rule, text)
    assert not INTERNAL.search(render_rules_markdown())


def test_findings_keep_to_their_rules_severities(tmp_path):
    for f in _diagnosed_runs(tmp_path):
        assert f.severity in RULES[f.rule].severities, (f.rule, f.severity)
        assert f.why == RULES[f.rule].why and f.source == RULES[f.rule].source
