"""Training memory by kind and dtype, and what float32 / mixed_float16 / mixed_bfloat16 would need.

What a fit keeps in memory, counted from the model itself after its first step (the ``memory``
record, written by :class:`mpwatch.record.callbacks.layer_dtypes.LayerDtypeMonitor`):

- **weights**: every variable of the model (trainable and not: BatchNormalization's moving
  statistics too), in its own dtype;
- **gradients**: one per trainable variable, in the variable's dtype (Keras differentiates with
  respect to the variable: a mixed policy's gradients are float32);
- **optimizer state**: the optimizer's variables (Adam's two moments per weight, its counters; a
  LossScaleOptimizer's and its inner optimizer's), in their dtypes;
- **activations**: the output of every leaf layer for one batch, in the dtype it returns (noted
  while the train step is traced): an estimate of what the backward pass keeps, since XLA may
  fuse or recompute some outputs and a layer's own intermediates (attention scores) are not
  counted.

Under another global policy a layer that follows the global policy (the model's own, the one it
was built under) stores its float variables
(and its gradients and its optimizer slots) in that policy's variable dtype and returns that
policy's compute dtype; a layer with a policy of its own (``dtype="float32"``) keeps it.

Example:
    >>> import keras  # doctest: +SKIP
    >>> payload = memory_payload(model, outputs={}, batch_size=32)  # doctest: +SKIP
    >>> payload["by_policy"]["columns"][:3]  # doctest: +SKIP
    ['policy', 'weights', 'gradients']
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from mpwatch import contract

_BYTES = {
    "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1,
    "int16": 2, "int32": 4, "int64": 8, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}  # fmt: skip


def dtype_bytes(dtype: str) -> int:
    """Bytes of one element of a Keras dtype name (4 for one mpwatch does not know)."""
    return _BYTES.get(str(dtype), 4)


def _name(dtype: Any) -> str:
    return str(getattr(dtype, "name", None) or dtype)


def _size(v: Any) -> int:
    return int(math.prod(int(d) for d in v.shape))


def _policy(name: str) -> tuple[str, str]:
    """(variable dtype, compute dtype) of a global policy name."""
    import keras

    p = keras.DTypePolicy(name)
    return p.variable_dtype, p.compute_dtype


def _owners(model: Any) -> dict[int, Any]:
    """id(variable) -> the innermost layer owning it."""
    from mpwatch.layers import walk

    out: dict[int, Any] = {}
    for layer, _, _ in sorted(walk(model), key=lambda t: t[2]):  # deeper layers win
        for v in getattr(layer, "weights", []):
            out[id(v)] = layer
    return out


def _optimizer_variables(optimizer: Any) -> list[Any]:
    seen: dict[int, Any] = {}
    for opt in (optimizer, getattr(optimizer, "inner_optimizer", None)):
        for v in getattr(opt, "variables", None) or []:
            seen.setdefault(id(v), v)
    return list(seen.values())


def _slot_owner(optimizer_variables: list[Any], trainable: list[Any]) -> dict[int, Any]:
    """id(optimizer variable) -> the trainable variable it is a slot of (Keras names a slot
    ``<variable path with _>_<slot>``, with the variable's shape): the longest such prefix."""
    keys = sorted(((_key(v), v) for v in trainable), key=lambda kv: len(kv[0]), reverse=True)
    out: dict[int, Any] = {}
    for o in optimizer_variables:
        name = str(getattr(o, "path", None) or o.name).rsplit("/", 1)[-1]
        for key, v in keys:
            if name.startswith(key + "_") and tuple(o.shape) == tuple(v.shape):
                out[id(o)] = v
                break
    return out


def _key(v: Any) -> str:
    return str(getattr(v, "path", None) or v.name).replace("/", "_")


def layer_outputs(
    shapes: dict[int, list[tuple[tuple[int | None, ...], str]]],
) -> tuple[dict[int, tuple[int, str]], int | None]:
    """(id(layer) -> (elements of its outputs, dtype), batch size) from the shapes the traced
    step gave: a dim unknown in the trace (a ``tf.data`` batch) is the batch, taken from the
    outputs that know it (the most common first dim); without any, None and the elements are
    per example."""
    from collections import Counter

    firsts = Counter(
        s[0] for outs in shapes.values() for s, _ in outs if len(s) > 1 and s[0] is not None
    )
    unknown = any(d is None for outs in shapes.values() for s, _ in outs for d in s)
    batch = firsts.most_common(1)[0][0] if firsts and not unknown else None
    fill = batch if batch is not None else 1
    out: dict[int, tuple[int, str]] = {}
    for lid, outs in shapes.items():
        if not outs:
            continue
        n = sum(math.prod(fill if d is None else d for d in s) for s, _ in outs)
        out[lid] = (int(n), outs[0][1])
    return out, batch


def memory_payload(
    model: Any,
    outputs: dict[int, tuple[int, str]],
    batch_size: int | None,
    optimizer: Any = None,
) -> dict[str, Any]:
    """The ``memory`` record of a built model whose optimizer is built. ``outputs``: id(leaf
    layer) -> (elements of its output for one batch, its dtype), noted while the train step was
    traced. ``optimizer``: the built optimizer whose state is counted (default the model's; a
    pre-flight, before any step, counts a built copy's)."""
    from mpwatch.layers import walk

    glob = model.dtype_policy.name  # the policy the model was built under (as run_info says)
    glob_var, glob_compute = _policy(glob)
    owners = _owners(model)
    trainable = list(model.trainable_variables)
    opt_vars = _optimizer_variables(optimizer or getattr(model, "optimizer", None))
    slots = _slot_owner(opt_vars, trainable)
    leaves = {id(layer): layer for layer, _, _ in walk(model)}

    def follows(layer: Any) -> bool:
        return layer is not None and getattr(layer.dtype_policy, "name", None) == glob

    # (kind, current dtype, dtype under a policy's variable/compute dtype, elements); the last
    # dtype is None where the item keeps its own dtype under any policy
    items: list[tuple[str, str, str | None, int]] = []

    def var_item(kind: str, v: Any, owner: Any) -> None:
        dtype = _name(v.dtype)
        moves = dtype == glob_var and follows(owner)
        items.append((kind, dtype, "variable" if moves else None, _size(v)))

    for v in model.variables:
        var_item("weights", v, owners.get(id(v)))
    for v in trainable:
        var_item("gradients", v, owners.get(id(v)))
    for o in opt_vars:
        ref = slots.get(id(o))
        var_item("optimizer_state", o, owners.get(id(ref)) if ref is not None else None)
    for lid, (elements, dtype) in outputs.items():
        layer = leaves.get(lid)
        moves = _name(dtype) == glob_compute and follows(layer)
        items.append(("activations", _name(dtype), "compute" if moves else None, int(elements)))

    by_dtype: dict[tuple[str, str], int] = defaultdict(int)
    for kind, dtype, _, n in items:
        by_dtype[(kind, dtype)] += n
    rows = [
        [kind, dtype, n, n * dtype_bytes(dtype)]
        for kind in contract.MEMORY_KINDS
        for (k, dtype), n in sorted(by_dtype.items())
        if k == kind
    ]
    policies = [glob] + [p for p in contract.MEMORY_POLICIES if p != glob]
    by_policy = []
    for name in policies:
        var_dtype, compute = _policy(name)
        totals = dict.fromkeys(contract.MEMORY_KINDS, 0)
        for kind, dtype, follows_as, n in items:
            if follows_as == "variable":
                dtype = var_dtype
            elif follows_as == "compute":
                dtype = compute
            totals[kind] += n * dtype_bytes(dtype)
        by_policy.append([name, *totals.values(), sum(totals.values())])
    return {
        "policy": glob,
        "batch_size": batch_size,
        "by_dtype": contract.table(contract.MEMORY_COLUMNS, rows),
        "by_policy": contract.table(contract.POLICY_COLUMNS, by_policy),
    }
