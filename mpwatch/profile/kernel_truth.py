"""A classified kernel table's final word: the HLO over the name, and every kernel's owner.

:func:`merge_hlo` takes each kernel's precision and Tensor Core use from its HLO instruction where
the trace has one (:mod:`mpwatch.profile.hlo_kernels`: ``precision_source`` ``"hlo"``) and from its
name otherwise (``"name"``; ``""`` when neither knows), keeps the name's reading beside it
(``name_precision``, ``name_tensor_core``) and flags where the two disagree
(``precision_disagrees``). :func:`kernel_owners` gives each kernel its owner: a layer, or a named
part of the step (:mod:`mpwatch.profile.step_parts`), through the op name of its instruction and
of the instructions fused into it.

Example:
    >>> import pandas as pd
    >>> df = pd.DataFrame({"op_name": ["jit(train_step)/cond/branch_1_fun/adam/mul"],
    ...                    "hlo_op_names": [()], "hlo_state_part": [""]})
    >>> kernel_owners(df, None)[["layer", "part"]].values.tolist()
    [[None, 'optimizer update']]
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pandas as pd

from mpwatch.profile.attribution import (
    attribute_kernels,
    is_jax_op_name,
    jax_scopes,
    op_name_direction,
)
from mpwatch.profile.step_parts import OPTIMIZER, PARTS, step_part

__all__ = ["merge_hlo", "kernel_owners", "agree"]

#: op names that name no op (xprof's for kernels XLA launched from a CUDA graph)
_NO_OP = frozenset({"", "XlaModule", "XlaModule:"})


def agree(name_precision: str, hlo_precision: str) -> bool:
    """Whether a name's precision and the HLO's are compatible: equal, either unknown, the HLO's
    ``mixed`` beside a 16- or 32-bit name, or a float32 name for a TF32 dot (cuBLAS/cuDNN names
    often say only the storage type).

    >>> agree("float16", "float16"), agree("float16", "mixed"), agree("float32", "float16")
    (True, True, False)
    """
    if name_precision in ("", "unknown") or hlo_precision in ("", "unknown"):
        return True
    if name_precision == hlo_precision:
        return True
    if hlo_precision == "mixed" and name_precision in ("float16", "bfloat16", "float32"):
        return True
    return {name_precision, hlo_precision} == {"float32", "tf32"}


def merge_hlo(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` (a kernel table classified by name) with the HLO's reading where it has one.

    Sets ``precision``, ``tensor_core``, ``tensor_core_why``, ``precision_source``,
    ``name_precision``, ``name_tensor_core``, ``precision_disagrees``, ``is_cast``, ``evidence``
    (``hlo`` where the HLO decided Tensor Core use)."""
    out = df.copy()
    out["name_precision"] = out["precision"]
    out["name_tensor_core"] = out["tensor_core"]
    n = len(out)
    hlo_p = out["hlo_precision"] if "hlo_precision" in out else pd.Series([""] * n, index=out.index)
    hlo_tc = (
        out["hlo_tensor_core"] if "hlo_tensor_core" in out else pd.Series([""] * n, index=out.index)
    )
    why = (
        out["hlo_tensor_core_why"]
        if "hlo_tensor_core_why" in out
        else pd.Series([""] * n, index=out.index)
    )
    use_p = hlo_p.fillna("").astype(str).ne("") & hlo_p.ne("unknown")
    use_tc = hlo_tc.isin(["yes", "no"])
    out["precision"] = out["precision"].where(~use_p, hlo_p)
    out["precision_source"] = [
        "hlo" if h else ("name" if p != "unknown" else "")
        for h, p in zip(use_p, out["name_precision"])
    ]
    out["tensor_core"] = out["tensor_core"].where(~use_tc, hlo_tc)
    out["evidence"] = out["evidence"].where(~use_tc, "hlo")
    out["tensor_core_why"] = [
        str(w) if u else ("" if tc == "unknown" else f"kernel name ({tc})")
        for w, u, tc in zip(why.fillna(""), use_tc, out["tensor_core"])
    ]
    out["precision_disagrees"] = [
        bool(h) and not agree(str(np_), str(hp))
        for h, np_, hp in zip(use_p, out["name_precision"], hlo_p)
    ]
    cast = out["hlo_is_cast"] if "hlo_is_cast" in out else pd.Series(False, index=out.index)
    out["is_cast"] = cast.fillna(False).astype(bool)
    return out


def _owner_of_names(
    own: str, fused: tuple[str, ...], owners: dict[str, tuple[str | None, str | None, str]]
) -> tuple[str | None, str | None, str, str | None]:
    """``(layer, path, direction, part)`` from an instruction's own op name and its fused ones."""
    part = step_part(own)
    if part is not None:
        if part != OPTIMIZER and any(step_part(f) == OPTIMIZER for f in fused):
            part = OPTIMIZER  # the loss scaling's apply-or-skip cond around the optimizer's update
        return None, None, op_name_direction(own), part
    layer, path, direction = owners.get(own, (None, None, op_name_direction(own)))
    if layer is not None:
        return layer, path, direction, None
    if any(step_part(f) == OPTIMIZER for f in fused):
        return None, None, op_name_direction(own), OPTIMIZER
    if own not in _NO_OP and (not is_jax_op_name(own) or jax_scopes(own)):
        # its own op name is a scope's (a layer the model does not have, a TensorFlow op): the
        # instructions fused into it do not overrule that
        return None, None, direction, None
    tally: Counter[Any] = Counter()
    first: dict[Any, str] = {}
    for f in fused:
        p = step_part(f)
        key: Any = ("part", p) if p is not None else None
        if key is None and owners.get(f, (None,))[0] is not None:
            key = ("layer", owners[f][0])
        if key is not None:
            tally[key] += 1
            first.setdefault(key, f)
    if not tally:
        return None, None, op_name_direction(own), None
    (kind, value), _ = tally.most_common(1)[0]
    name = first[(kind, value)]
    if kind == "part":
        return None, None, op_name_direction(name), str(value)
    layer, path, direction = owners[name]
    return layer, path, direction, None


def kernel_owners(df: pd.DataFrame, model: Any = None) -> pd.DataFrame:
    """``df`` with ``layer, path, direction, part``: a kernel's layer (None outside every layer)
    or, for one outside every layer, the named part of the step it belongs to (None: no owner).

    Its own op name (the table's ``op_name``: xprof's, or its HLO instruction's) decides first: a
    layer, or a part (the loss scaling's ``cond`` that wraps the optimizer's update counts as the
    optimizer update). Else the op names of the instructions fused into it (``hlo_op_names``): any
    of the optimizer's makes it the optimizer update; where its own op name names no scope (empty,
    or the model's own level: ``jit(train_step)/transpose(jvp())/...``) the owner most of them
    name. Else
    the train step's argument it reads (``hlo_state_part``: optimizer or metrics variables, the
    batch)."""
    out = df.copy()
    n = len(out)
    fused_col = (
        out["hlo_op_names"] if "hlo_op_names" in out else pd.Series([()] * n, index=out.index)
    )
    state_col = (
        out["hlo_state_part"] if "hlo_state_part" in out else pd.Series([""] * n, index=out.index)
    )
    names = set(str(x) for x in out["op_name"])
    for fused in fused_col:
        names.update(str(f) for f in (fused or ()))
    owners = attribute_kernels(sorted(names), model)
    rows = []
    for own, fused, state in zip(out["op_name"], fused_col, state_col):
        fused_t = tuple(str(f) for f in (fused or ()) if str(f) != str(own))
        layer, path, direction, part = _owner_of_names(str(own), fused_t, owners)
        if layer is None and part is None and state in PARTS:
            part = str(state)
        rows.append((layer, path, direction, part))
    out["layer"] = [r[0] for r in rows]
    out["path"] = [r[1] for r in rows]
    out["direction"] = [r[2] for r in rows]
    out["part"] = [r[3] for r in rows]
    return out
