"""An XLA CPU op's precision and owner from the HLO instruction it runs (issue 26).

On a CPU, XLA runs thunks: host events of the trace that name their program (``hlo_module``) and
instruction (``hlo_op``). :func:`cpu_readings` reads each such instruction as
:mod:`mpwatch.profile.hlo_kernels` reads a GPU kernel's (dot/convolution by their operand types,
other work by the float types it reads and writes, converts as casts), and
:func:`owner_op_name` picks the op name that owns it: its own metadata's, else, for a fusion XLA
made without one, the op name of the instructions fused into it (the optimizer's where any is,
else the scope most of them share), else, for an instruction XLA made with no op name at all,
that of the instructions it feeds or reads. :func:`mpwatch.profile.traces.xla_op_table` keeps
both per op.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from mpwatch.profile import xplane
from mpwatch.profile.hlo import HloModule, hlo_modules
from mpwatch.profile.hlo_kernels import HloReading, read_instruction
from mpwatch.profile.step_parts import OPTIMIZER, step_part

#: precisions that count as 16-bit compute
SIXTEEN = frozenset({"float16", "bfloat16"})


def owner_op_name(own: str, fused: Iterable[str]) -> str:
    """The op name an instruction is owned by: its own, else the optimizer's among the fused
    ones, else the fused op name whose scope (all but the last component) most of them share.

    >>> owner_op_name("", ["a/jvp(d)/mul", "a/jvp(d)/add", "a/adam/sqrt"])
    'a/adam/sqrt'
    >>> owner_op_name("", ["a/jvp(d)/mul", "a/jvp(d)/add", "a/jvp(e)/neg"])
    'a/jvp(d)/mul'
    """
    if own:
        return own
    names = [f for f in fused if f]
    if not names:
        return ""
    for f in names:
        if step_part(f) == OPTIMIZER:
            return f
    scopes = Counter(f.rsplit("/", 1)[0] for f in names)
    best = scopes.most_common(1)[0][0]
    return next(f for f in names if f.rsplit("/", 1)[0] == best)


class CpuHlo:
    """HLO programs (``name(id) -> HloModule``), read per (program, instruction) on demand."""

    def __init__(self, modules: dict[str, HloModule]) -> None:
        self.modules = dict(modules)
        self._by_base: dict[str, list[str]] = {}
        for key in self.modules:
            self._by_base.setdefault(xplane.module_base(key), []).append(key)
        self._read: dict[tuple[str, str], tuple[HloReading, str, str] | None] = {}
        self._users: dict[str, dict[int, list[Any]]] = {}

    def reading(self, module: str, instruction: str) -> tuple[HloReading, str, str] | None:
        """``(reading, owner op name, opcode)`` of an instruction (None: not in the HLO)."""
        key = (module, instruction)
        if key in self._read:
            return self._read[key]
        out = None
        keys = (
            [module]
            if module in self.modules
            else self._by_base.get(xplane.module_base(module), [])
        )
        for k in keys:
            mod = self.modules[k]
            instr = mod.by_name.get(instruction)
            if instr is None:
                continue
            try:
                reading = read_instruction(mod, instr)
            except (KeyError, IndexError, ValueError, TypeError):
                continue
            owner = owner_op_name(instr.op_name, reading.op_names) or self._neighbour(mod, instr)
            out = (reading, owner, instr.opcode)
            break
        self._read[key] = out
        return out

    def _neighbour(self, mod: HloModule, instr: Any) -> str:
        """The op name of an instruction XLA made without one (a backward convolution its
        canonicalization rewrote, a copy): that of the instructions it feeds, else of those it
        reads (their own or their fused ones')."""
        users = self._users.get(mod.name)
        if users is None:
            users = {}
            for i in mod.instructions.values():
                for o in i.operand_ids:
                    users.setdefault(o, []).append(i)
            self._users[mod.name] = users
        for group in (users.get(instr.id, []), mod.operands(instr)):
            names: list[str] = []
            for n in group:
                n = mod.source(n) if n.opcode in ("copy", "bitcast", "get-tuple-element") else n
                names.extend(x.op_name for x in (n, *mod.inside(n)) if x.op_name)
            owner = owner_op_name("", names)
            if owner:
                return owner
        return ""


def cpu_readings(spaces: Sequence[Any], programs: Callable[[str], bool] | None = None) -> CpuHlo:
    """The traces' programs (those ``programs(name)`` accepts, where given), for
    :meth:`CpuHlo.reading`."""
    modules: dict[str, HloModule] = {}
    for space in spaces:
        modules.update(hlo_modules(space, programs))
    return CpuHlo(modules)
