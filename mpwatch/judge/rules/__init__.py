"""The rules, one module each, in the order they run: :data:`ALL_RULES`.

Adding a rule is one file here (named after the rule id, ``_`` for ``-``: a docstring with the
sections of :data:`mpwatch.judge.rule.SECTIONS`, ``RULE = Rule(...)`` and ``check(run)``, or
``check_pair(mixed, fp32)`` for a rule about a mixed run and a float32 run of the same model) and
one line in :data:`ALL_RULES`. ``docs/rules.md`` is generated from them
(``python -m mpwatch.show.docs``).

Example:
    >>> [m.RULE.id for m in ALL_RULES][:3]
    ['train-step', 'input-range', 'output-16bit']
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

#: every rule module, in order (findings are sorted afterwards: the order is the docs' order)
ALL_RULES: tuple[ModuleType, ...] = tuple(
    import_module(f"{__name__}.{name}")
    for name in (
        "train_step",
        "input_range",
        "target_range",
        "output_16bit",
        "activation_overflow",
        "id_rounding",
        "gradient_underflow",
        "loss_scale",
        "skipped_steps",
        "bad_batches",
        "output_rel_error",
        "gradient_error",
        "lost_updates",
        "float8_readiness",
        "float32_inside",
        "tensor_core_alignment",
        "tensor_core_use",
        "no_tensor_cores",
        "try_mixed_precision",
        "mixed_vs_float32",
        "profile",
        "damaged_logs",
        "recording",
        "budget",
        "preflight_policy",
    )
)

#: the rules about one run (``check(run)``)
RUN_RULES: tuple[ModuleType, ...] = tuple(m for m in ALL_RULES if hasattr(m, "check"))
#: the rules about a mixed run and a float32 run of the same model (``check_pair(mixed, fp32)``)
PAIR_RULES: tuple[ModuleType, ...] = tuple(m for m in ALL_RULES if hasattr(m, "check_pair"))

__all__ = ["ALL_RULES", "RUN_RULES", "PAIR_RULES"]
