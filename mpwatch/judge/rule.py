"""The :class:`Rule` type, and the small helpers the rules in :mod:`mpwatch.judge.rules` share.

A rule is one module of :mod:`mpwatch.judge.rules`: a module docstring in ruff's shape (the
sections of :data:`SECTIONS`, each under a ``## `` heading), ``RULE = Rule(...)`` and
``check(run) -> list[Finding]`` (or ``check_pair(mixed, fp32)`` for a rule about two runs). The
docstring is a template: ``{NAME}`` fields are filled from ``Rule.thresholds`` (the rule's
constants), so the documented thresholds are the ones the code uses.

Every helper here reads only the :class:`~mpwatch.read.run.Run`.

Example:
    >>> from mpwatch.judge.rules import output_16bit
    >>> output_16bit.RULE.id, output_16bit.RULE.severities
    ('output-16bit', ('warning', 'error'))
    >>> fmt(65504.0), fmt(1e-6), pct(0.05)
    ('65504', '1.00e-06', '5.00%')
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from mpwatch import contract
from mpwatch.formats import SIXTEEN_BIT
from mpwatch.judge.finding import SEVERITIES, Finding
from mpwatch.read.run import Run

__all__ = [
    "Rule",
    "SECTIONS",
    "PUBLIC_REFERENCES",
    "HEADROOM_WARN_BITS",
    "UNDERFLOW_WARN",
    "finite",
    "fmt",
    "pct",
    "policy",
    "compute_dtype",
    "effective_float32",
    "layer_row",
    "keep_float32_fix",
]

# --- shared thresholds (each is used by more than one rule) --------------------------------------
# activation-overflow warns below this headroom; try-mixed-precision lists the layers a pre-flight
# probe puts above 65504 / 2**HEADROOM_WARN_BITS as ones to keep in float32
HEADROOM_WARN_BITS = 3.0  # activations within 3 doublings of 65504 (> 8188)
# gradient-underflow warns above this model-wide underflow fraction; loss-scale calls a scale far
# below the recommended one a warning (not info) only when the underflow reaches it
UNDERFLOW_WARN = 0.01

#: the sections of a rule's docstring, in order
SECTIONS = ("What it finds", "Why it matters", "Threshold", "Example evidence", "Fix", "References")

#: the public documents rules cite: URL -> title (a rule's references use these titles and URLs)
PUBLIC_REFERENCES = {
    "https://www.tensorflow.org/guide/mixed_precision": "TensorFlow mixed precision guide",
    "https://keras.io/api/mixed_precision/": "Keras mixed precision API",
    "https://keras.io/api/optimizers/loss_scale_optimizer/": "Keras LossScaleOptimizer",
    "https://arxiv.org/abs/1710.03740": "Micikevicius et al. 2017, Mixed Precision Training",
    "https://docs.nvidia.com/deeplearning/performance/mixed-precision-training/index.html": (
        "NVIDIA, Train With Mixed Precision"
    ),
    "https://docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication/"
    "index.html": "NVIDIA Deep Learning Performance guide, Matrix Multiplication",
    "https://www.tensorflow.org/guide/profiler": "TensorFlow Profiler guide",
}

_HEADING = re.compile(r"^## (.+?)\s*$")
_URL = re.compile(r"<(https?://[^>\s]+)>")


class _Listed(tuple):
    """A tuple constant in a docstring: ``{NAME}`` renders as ``a, b, c``."""

    def __format__(self, spec: str) -> str:
        return ", ".join(format(v, spec) for v in self)


def _plain(text: str) -> str:
    """A section as one line of plain text (whitespace collapsed)."""
    return " ".join(text.split())


@dataclass(frozen=True)
class Rule:
    """One rule: its id, title, the severities it can give, and its documentation.

    Attributes:
        id: the id findings carry (``Finding.rule``); the rule's module is named after it, with
            ``_`` for ``-``.
        title: one line.
        severities: the severities its findings can have, least severe first.
        doc: the rule module's docstring (a template: ``{NAME}`` fields come from ``thresholds``).
        thresholds: the constants the rule uses, by name (rendered into ``text``; a tuple renders
            as its items joined by ``", "``).
        text: ``doc`` rendered.
        sections: ``text``'s sections by heading (see :data:`SECTIONS`).
    """

    id: str
    title: str
    severities: tuple[str, ...]
    doc: str
    thresholds: Mapping[str, Any] = field(default_factory=dict, hash=False)
    text: str = field(init=False, repr=False, hash=False, compare=False)
    sections: Mapping[str, str] = field(init=False, repr=False, hash=False, compare=False)

    def __post_init__(self) -> None:
        bad = [s for s in self.severities if s not in SEVERITIES]
        if bad or not self.severities:
            raise ValueError(f"rule {self.id!r}: severities must be among {SEVERITIES}: {bad}")
        values = {k: _Listed(v) if isinstance(v, (tuple, list)) else v
                  for k, v in self.thresholds.items()}  # fmt: skip
        text = (self.doc or "").format(**values)
        sections: dict[str, list[str]] = {"": []}
        current = ""
        for line in text.splitlines():
            m = _HEADING.match(line.strip())
            if m:
                current = m.group(1)
                sections[current] = []
            else:
                sections[current].append(line)
        rendered = {k: "\n".join(v).strip() for k, v in sections.items()}
        missing = [s for s in SECTIONS if not rendered.get(s)]
        if missing:
            raise ValueError(f"rule {self.id!r}: docstring lacks sections {missing}")
        object.__setattr__(self, "text", text)
        object.__setattr__(self, "sections", rendered)

    @property
    def summary(self) -> str:
        """The docstring's first line (``Rule `id`: ...``)."""
        return self.sections[""].partition("\n")[0].strip()

    @property
    def why(self) -> str:
        """Why it matters, as one line (what findings carry in ``Finding.why``)."""
        return _plain(self.sections["Why it matters"])

    @property
    def threshold(self) -> str:
        """The threshold, as one line, with the rule's constants filled in."""
        return _plain(self.sections["Threshold"])

    @property
    def references(self) -> list[tuple[str, str | None, str]]:
        """``(title, url or None, note)`` of each item of the References section (items are
        ``- Title: note <URL>``, the URL on the item's last line)."""
        items: list[str] = []
        for line in self.sections["References"].splitlines():
            s = line.strip()
            if s.startswith("- "):
                items.append(s[2:].strip())
            elif s and items:
                items[-1] += " " + s
        out: list[tuple[str, str | None, str]] = []
        for item in items:
            m = _URL.search(item)
            url = m.group(1) if m else None
            title, _, note = _URL.sub("", item).partition(": ")
            out.append((_plain(title).replace("`", ""), url, _plain(note)))
        return out

    @property
    def source(self) -> str:
        """The references as one line: ``title: note (url); ...`` (what ``Finding.source``
        carries)."""
        parts = []
        for title, url, note in self.references:
            s = title + (f": {note}" if note else "")
            parts.append(s + (f" ({url})" if url else ""))
        return "; ".join(parts).replace("`", "")

    def finding(self, severity: str, title: str, evidence: str, **kw: Any) -> Finding:
        """A :class:`Finding` of this rule (its ``why`` and ``source`` filled in)."""
        return Finding(
            rule=self.id, severity=severity, title=title, evidence=evidence, why=self.why,
            source=self.source, **kw,
        )  # fmt: skip


# --- formatting ----------------------------------------------------------------------------------
finite = contract.finite_float  # the one definition, in the contract


def fmt(x: float | None, digits: int = 3) -> str:
    """A number for a title or an evidence line (``"n/a"`` for None)."""
    if x is None:
        return "n/a"
    if float(x).is_integer() and abs(x) < 1e9:
        return f"{int(x)}"
    if x != 0 and (abs(x) >= 1e5 or abs(x) < 1e-3):
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}g}"


def pct(x: float) -> str:
    """A fraction as a percentage: two decimals below 10%, one above."""
    return f"{100 * x:.2f}%" if x < 0.1 else f"{100 * x:.1f}%"


# --- reading the run -----------------------------------------------------------------------------
def policy(run: Run) -> str:
    """The run's global policy name (``""`` when not recorded)."""
    return str(run.info.get("policy") or "")


def compute_dtype(run: Run) -> str:
    """The run's compute dtype: from run_info, else from the policy name, else from the layer
    table (its first 16-bit compute dtype, else its first one); ``""`` when nothing says."""
    cd = run.info.get("compute_dtype")
    if cd:
        return str(cd)
    pol = policy(run)
    if pol.startswith("mixed_"):
        return pol[len("mixed_") :]
    if pol:
        return pol
    if len(run.layers) and "compute_dtype" in run.layers:
        vals = run.layers["compute_dtype"].dropna().astype(str)
        if (vals.isin(SIXTEEN_BIT)).any():
            return str(vals[vals.isin(SIXTEEN_BIT)].iloc[0])
        if len(vals):
            return str(vals.iloc[0])
    return ""


def effective_float32(run: Run) -> set[str]:
    """Layers that compute in float32 inside although their policy is 16-bit."""
    lt = run.layers
    if not len(lt) or "effective_dtype" not in lt or "name" not in lt:
        return set()
    m = (lt["effective_dtype"].astype(str) == "float32") & (
        lt.get("compute_dtype", pd.Series(index=lt.index, dtype=object))
        .astype(str)
        .isin(SIXTEEN_BIT)
    )
    return set(lt.loc[m, "name"].astype(str))


def layer_row(run: Run, name: str) -> dict[str, Any] | None:
    """The layer table's first row of that name (rules look rows up many times: the name index
    is built once per layer table and kept on the run)."""
    lt = run.layers
    if not len(lt) or "name" not in lt:
        return None
    cached = run.__dict__.get("_judge_layer_rows")
    if cached is None or cached[0] is not lt:
        rows: dict[str, dict[str, Any]] = {}
        for rec in lt.to_dict("records"):
            rows.setdefault(str(rec["name"]), rec)
        cached = run.__dict__["_judge_layer_rows"] = (lt, rows)
    return cached[1].get(str(name))


def keep_float32_fix(name: str, cls: str | None) -> str:
    """The fix, as code, that keeps one layer in float32."""
    cls = cls or "Layer"
    return (
        f'keras.layers.{cls}(..., dtype="float32", name="{name}")  # keep {name!r} in float32\n'
        "# or, without editing the model code:\n"
        "model = mpwatch.apply_recommendations(model, findings).model"
    )
