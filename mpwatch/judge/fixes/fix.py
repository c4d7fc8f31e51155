"""A finding's model-changing advice as one object: :class:`Fix`, read, checked and applied.

A finding says what to change twice: as code for a person (``Finding.fix``) and as data for
:func:`mpwatch.apply_recommendations` (``Finding.action``). Where the two were written apart they
disagreed: the fix checks grew "keep 'd1' float32" to ``d1`` and ``d2`` in the printed code and
under an action key that applying did not read, so the fit stayed NaN with the advice applied.
Here is the one reading of an action (:meth:`Fix.of`) that applying, the fix checks and the
consistency check of the diagnosis (:func:`disagreement`) share, and the one way to change the
layers of an advice (:meth:`Fix.with_layers`).

Example:
    >>> from mpwatch.judge.finding import Finding
    >>> f = Finding("activation-overflow", "error", "t", "e", layer="d1",
    ...             action={"dtype": "float32"})
    >>> Fix.of(f).float32_layers
    ('d1',)
    >>> Fix.of(f).with_layers(["d1", "d2"]).action()
    {'dtype': 'float32', 'float32_layers': ['d1', 'd2']}
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["Fix", "disagreement", "layers_code", "printed_layers"]

#: the action keys a Fix reads (``layers``: the key the fix checks once wrote, read for old data)
_KEYS = ("dtype", "float32_layers", "layers", "policy", "loss_scale", "dynamic_growth_steps")


@dataclass(frozen=True)
class Fix:
    """What one finding changes in the model and its optimizer.

    Attributes:
        float32_layers: the layers to keep in float32, the finding's own first.
        policy: the global dtype policy to build the model under (None: as it is).
        loss_scale: the LossScaleOptimizer's ``initial_scale`` (None: as it is).
        dynamic_growth_steps: its ``dynamic_growth_steps`` (None: as it is).
        extra: the action's other keys (``output``, ...), kept as they were.
    """

    float32_layers: tuple[str, ...] = ()
    policy: str | None = None
    loss_scale: float | None = None
    dynamic_growth_steps: int | None = None
    extra: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, finding: Any) -> Fix:
        """The finding's advice: its ``layer`` when ``action["dtype"] == "float32"``, then
        ``action["float32_layers"]`` (and the old ``layers``), in order, unique; its policy,
        loss scale and growth steps."""
        action = dict(getattr(finding, "action", None) or {})
        names: list[str] = []
        layer = getattr(finding, "layer", None)
        if layer and action.get("dtype") == "float32":
            names.append(str(layer))
        for key in ("float32_layers", "layers"):
            for name in action.get(key) or []:
                if str(name) not in names:
                    names.append(str(name))
        scale = action.get("loss_scale")
        growth = action.get("dynamic_growth_steps")
        return cls(
            float32_layers=tuple(names),
            policy=str(action["policy"]) if action.get("policy") else None,
            loss_scale=float(scale) if scale else None,
            dynamic_growth_steps=int(growth) if growth else None,
            extra=tuple((k, v) for k, v in action.items() if k not in _KEYS),
        )

    def with_layers(self, names: Iterable[str]) -> Fix:
        """The same advice keeping exactly ``names`` in float32."""
        return replace(self, float32_layers=tuple(dict.fromkeys(str(n) for n in names)))

    def action(self) -> dict[str, Any]:
        """The advice as a finding's ``action`` dict (what :meth:`of` reads back)."""
        out: dict[str, Any] = dict(self.extra)
        if self.float32_layers:
            out["dtype"] = "float32"
            if len(self.float32_layers) > 1:
                out["float32_layers"] = list(self.float32_layers)
        if self.policy:
            out["policy"] = self.policy
        if self.loss_scale:
            out["loss_scale"] = self.loss_scale
        if self.dynamic_growth_steps:
            out["dynamic_growth_steps"] = self.dynamic_growth_steps
        return out


#: a layer the printed code keeps in float32: ``dtype="float32", name="d1"`` (a constructor) or
#: ``get_layer("d1")...dtype_policy = "float32"``
_PRINTED = re.compile(
    r'dtype="float32",\s*name="(?P<a>[^"]+)"'
    r'|get_layer\("(?P<b>[^"]+)"\)(?![^\n]*get_layer)(?:[^\n]*float32|\._flatten_layers\(\))'
)


def layers_code(names: Iterable[str], run: Any) -> str:
    """The code that keeps each of ``names`` in float32, one layer after the other, as
    :func:`mpwatch.judge.rule.keep_float32_fix` writes one (a layer's constructor line; a layer
    that holds layers, its loop over them), then the way to apply it without editing the
    model's code: the printed form of :meth:`Fix.with_layers`' advice."""
    from mpwatch.judge.rule import keep_float32_fix, layer_row

    lines: list[str] = []
    for name in names:
        code = keep_float32_fix(name, (layer_row(run, name) or {}).get("class"), run)
        body = code.split("\n# or, without editing the model code:")[0].split("\n")
        if any(ln.startswith("for sub in model.get_layer(") for ln in body):  # a container
            at = next(i for i, ln in enumerate(body) if ln.startswith("for sub in"))
            lines += body[at : at + 2]
        elif ".dtype_policy = " in code.split("\n# or")[0]:  # a classifier head, set in place
            lines += [ln for ln in code.split("\n# or")[0].split("\n") if ".dtype_policy" in ln]
        else:
            lines.append(body[0])
    lines += ["# or, without editing the model code:",
              "model = mpwatch.apply_recommendations(model, findings).model"]  # fmt: skip
    return "\n".join(lines)


def printed_layers(code: str) -> list[str]:
    """The layers a fix's code keeps in float32, as it prints them (comments left out)."""
    lines = [ln.split("#", 1)[0] for ln in (code or "").split("\n")]
    found = []
    for m in _PRINTED.finditer("\n".join(lines)):
        name = m.group("a") or m.group("b")
        if name not in found:
            found.append(name)
    return found


def disagreement(finding: Any) -> str | None:
    """Why the finding's printed code keeps a layer in float32 that its applied advice does not
    (the user reads "d1 and d2", ``apply_recommendations`` sets ``d1``), or None. (The advice may
    name more than the code prints: a layer already float32, a set written as a list.)"""
    printed = printed_layers(getattr(finding, "fix", "") or "")
    applied = list(Fix.of(finding).float32_layers)
    missing = [n for n in printed if n not in applied]
    if not missing:
        return None
    return f"prints {printed} in float32, applies {applied}"
