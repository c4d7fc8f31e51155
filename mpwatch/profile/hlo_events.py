"""GPU events → the HLO instructions they ran.

A kernel launched by its own thunk carries its instruction in the event's ``hlo_op`` stat
(``cudnn-conv-bw-filter.9``). Inside a CUDA graph (XLA's command buffers) ``hlo_op`` names the
command buffer (``command_buffer_17``), which the program's HLO does not hold; there:

- a fusion's kernel is named after its instruction (``input_reduce_fusion_4`` for
  ``input_reduce_fusion.4``), except where XLA compiled identical fusions once and reuses the
  first one's kernel (its name then shows up again for a later instruction);
- a library call's kernels (cuBLAS ``nvjet_*``, cuDNN) and a copy's ``memcpy*`` kernels are named
  by the library.

The command buffer's kernels run in the order of the program's schedule (``HloModule.schedule``),
so :func:`align_run` walks the run's kernels along it: a kernel named after an instruction later
in the schedule is that instruction; a reused name, or a library's or copy's kernel, is the next
instruction of its kind (a fusion; a custom call; a copy); a library's helper kernels (memsets,
split-K sums) stay with the call before them. :func:`kernel_instructions` sums every kernel's
time per instruction.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from mpwatch.profile import xplane
from mpwatch.profile.hlo import HloInstruction, HloModule
from mpwatch.profile.kernel_classes import classify

__all__ = ["kernel_instructions", "align_run"]

# instructions that launch no kernel of their own
_NO_KERNEL = frozenset(
    {
        "parameter",
        "constant",
        "get-tuple-element",
        "bitcast",
        "tuple",
        "after-all",
        "partition-id",
        "replica-id",
        "opt-barrier",
        "add-dependency",
        "while",  # their bodies' instructions launch the kernels
        "conditional",
        "call",
    }
)
_HELPERS = frozenset({"helper", "reduction", "memset"})
_LAUNCH = re.compile(r"grid:(\S+) block:(\S+)")


def _sanitized(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def _kind(event_name: str) -> str:
    """Which instruction an unnamed kernel stands for: ``copy``, ``helper`` or ``call``."""
    c = classify(event_name, None, "")
    if event_name.lower().startswith("memset") or c.kind in _HELPERS:
        return "helper"
    if c.kind in ("copy", "memcpy") or event_name.lower().startswith("memcpy"):
        return "copy"
    return "call"


def _fits(instr: HloInstruction, want: str, module: HloModule, run_names: set[str]) -> bool:
    if want == "fusion":
        return instr.opcode == "fusion"
    if want == "copy":
        return instr.opcode == "copy"
    if instr.opcode == "fusion":
        # a library's fusion (cuDNN's, cuBLAS'): its kernels carry the library's names, so no
        # kernel of the run is named after it; it holds the matrix math
        return _sanitized(instr.name) not in run_names and any(
            i.opcode in ("dot", "convolution", "custom-call") for i in module.inside(instr)
        )
    return instr.opcode != "copy"  # a custom call, a sort, a scatter...


def align_run(
    names: Sequence[str], module: HloModule, by_sanitized: dict[str, HloInstruction]
) -> list[HloInstruction | None]:
    """The instruction each kernel of one command buffer run ran (None: not found), ``names`` in
    the order they ran. Needs the program's schedule (of the computation the run's first named
    kernel is in: the entry, a loop's body); without it only named kernels are found."""
    named = [by_sanitized.get(_sanitized(n)) for n in names]
    # the schedule of the computation the run's first named kernel is in (the entry, or a while
    # loop's body)
    first = next(
        (
            i
            for i, ins in enumerate(named)
            if ins is not None and module.schedule.get(ins.computation)
        ),
        None,
    )
    if first is None:
        return named
    order = module.schedule[named[first].computation]
    pos = {iid: i for i, iid in enumerate(order)}
    launching = [module.instructions[i].opcode not in _NO_KERNEL for i in order]
    run_names = {_sanitized(n) for n in names}

    def fits(q: int, want: str) -> bool:
        return launching[q] and _fits(module.instructions[order[q]], want, module, run_names)

    out: list[HloInstruction | None] = [None] * len(names)

    def want_of(i: int) -> str:
        return "fusion" if named[i] is not None else _kind(names[i])

    # backwards from the first named kernel
    q = pos[named[first].id] - 1
    for i in range(first - 1, -1, -1):
        want = want_of(i)
        if want == "helper":
            continue  # filled below from the call after it
        while q >= 0 and not fits(q, want):
            q -= 1
        if q < 0:
            break
        out[i] = module.instructions[order[q]]
        q -= 1
    # forwards
    p = pos[named[first].id]
    last_call: HloInstruction | None = None
    for i in range(first, len(names)):
        ins = named[i]
        if ins is not None and ins.id in pos and pos[ins.id] >= p:
            out[i] = ins
            p = pos[ins.id] + 1
            last_call = None
            continue
        want = want_of(i)
        if want == "helper":
            out[i] = last_call
            continue
        q = p
        while q < len(order) and not fits(q, want):
            q += 1
        if q >= len(order):
            out[i] = ins  # a reused kernel past the schedule's end: its own instruction's kind
            continue
        out[i] = module.instructions[order[q]]
        p = q + 1
        last_call = out[i] if want == "call" else None
    # helpers before any call: the call after them
    for i in range(len(names) - 2, -1, -1):
        if out[i] is None and want_of(i) == "helper":
            out[i] = out[i + 1]
    return out


def kernel_instructions(
    spaces: Sequence[Any], modules: dict[str, HloModule]
) -> dict[str, dict[tuple[str, str, str, str], float]]:
    """GPU kernel name -> {(program, instruction name, grid, block): device time in us} (grid and
    block as xprof's table writes them, ``"1,1,1"``; empty when the event has none) from the device
    planes' events: the event's ``hlo_op`` where it names an instruction of its program; inside a
    command buffer the instruction :func:`align_run` finds."""
    by_base: dict[str, list[str]] = {}
    for key in modules:
        by_base.setdefault(xplane.module_base(key), []).append(key)
    sanitized: dict[str, dict[str, HloInstruction]] = {}
    out: dict[str, dict[tuple[str, str, str, str], float]] = {}

    def add(ev: Any, prog: str, instr: HloInstruction) -> None:
        m = _LAUNCH.search(str(ev.stats.get("kernel_details") or ""))
        launch = (m.group(1), m.group(2)) if m else ("", "")
        per = out.setdefault(ev.name, {})
        key = (prog, instr.name, *launch)
        per[key] = per.get(key, 0.0) + ev.duration_ps / 1e6

    for space in spaces:
        for plane in space.device_planes:
            for line in plane.lines:
                runs: list[tuple[str, Any, list[Any]]] = []  # (program, run key, events)
                for ev in sorted(line.events, key=lambda e: e.offset_ps):
                    module = ev.stats.get("hlo_module")
                    if not module:
                        continue
                    key = f"{module}({ev.stats.get('program_id')})"
                    keys = [key] if key in modules else by_base.get(str(module), [])
                    if len(keys) != 1:
                        continue
                    prog = keys[0]
                    mod = modules[prog]
                    hop = str(ev.stats.get("hlo_op") or "")
                    instr = mod.by_name.get(hop)
                    if instr is not None:
                        add(ev, prog, instr)
                        continue
                    run_key = (hop, ev.stats.get("correlation_id"))
                    if runs and runs[-1][0] == prog and runs[-1][1] == run_key:
                        runs[-1][2].append(ev)
                    else:
                        runs.append((prog, run_key, [ev]))
                for prog, _, evs in runs:
                    mod = modules[prog]
                    table = sanitized.get(prog)
                    if table is None:
                        table = {_sanitized(n): i for n, i in mod.by_name.items()}
                        sanitized[prog] = table
                    for ev, instr in zip(evs, align_run([e.name for e in evs], mod, table)):
                        if instr is not None:
                            add(ev, prog, instr)
    return out
