"""The README and docs/ link only to files that ship, and the generated docs match the code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_inside_the_repository(doc):
    text = doc.read_text()
    targets = [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]
    for target in targets:
        path = target.split("#", 1)[0]
        if not path:  # an anchor in the same page
            continue
        resolved = (doc.parent / path).resolve()
        assert resolved.is_relative_to(ROOT), f"{doc.name} links outside the repository: {target}"
        assert resolved.exists(), f"{doc.name} links to a missing file: {target}"
    assert "shared/" not in text, f"{doc.name} mentions shared/, which users do not have"


def test_the_design_doc_and_the_generated_docs_exist():
    for name in ("design.md", "contract.md", "rules.md"):
        assert (ROOT / "docs" / name).is_file(), name


def test_generated_docs_match_the_code():
    from mpwatch.show.docs import DOCUMENTS

    for name, render in DOCUMENTS.items():
        on_disk = (ROOT / "docs" / name).read_text()
        assert on_disk == render(), f"docs/{name} is stale: run python -m mpwatch.show.docs"


def test_the_contract_doc_lists_every_tag_and_kind():
    from mpwatch import contract

    text = (ROOT / "docs" / "contract.md").read_text()
    for tag in contract.SCALAR_TAGS:
        assert f"`{tag}`" in text
    for kind in contract.RECORD_KINDS:
        assert f"### `{kind}`" in text
