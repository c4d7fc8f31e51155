"""Op name → layer: which layer of the model an op or a GPU kernel belongs to, and its direction.

The model is a tree of :class:`LayerInfo` (:func:`describe_model`: names, paths, classes, compute
dtypes). TensorFlow op names look like ``StatefulPartitionedCall/sequential_1/dense_1_2/MatMul`` or
``.../gradient_tape/sequential_1/dense_1_2/MatMul/MatMul_1``: TensorFlow makes a graph name scope
unique by appending ``_N``, so the scope of layer ``dense_1`` may read ``dense_1_2`` and the scope
of layer ``dense`` may read ``dense_1`` (the name of *another* layer). :func:`match_scopes` resolves
this per parent scope: a scope component matches layer ``L`` when it is ``L`` or ``L_<digits>``;
components with a single candidate are fixed first, the rest by elimination, and a remaining tie by
the suffix pattern of the resolved siblings (see :func:`match_scopes`); :func:`attribute_ops` walks
the tree with it.

JAX op names (also those of Keras' JAX backend) carry the layer scopes inside transformations:
``jit(train_step)/jvp(conv2d_1)/...`` (forward) and ``jit(train_step)/transpose(jvp(conv2d_1))/...``
(backward) (:func:`jax_scopes`, :func:`attribute_jax_ops`). :func:`attribute_kernels` gives each
GPU kernel's op name its layer and direction (:func:`op_name_direction`), with or without a model.

Example:
    >>> jax_scopes("jit(train_step)/transpose(jvp(conv2d_1))/conv_general_dilated")
    [('conv2d_1', True, True)]
    >>> match_scopes(["dense_1", "dense_1_2"], ["dense", "dense_1"])
    {'dense_1': 'dense', 'dense_1_2': 'dense_1'}
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mpwatch.formats import FLOAT32_INSIDE, is_16bit
from mpwatch.layers import layer_path, sublayers


# --- layers and their scopes ---------------------------------------------------------------------
@dataclass
class LayerInfo:
    """What the join needs to know of a layer."""

    name: str
    path: str  # Keras path, e.g. "sequential/dense_1" ("/"-joined names from the root model down)
    cls: str
    compute_dtype: str
    trainable_params: int = 0
    dtype_given: bool = False  # compute_dtype is what the layer really computes in (no class rule)
    children: list[LayerInfo] = field(default_factory=list)

    @property
    def bits(self) -> int:
        """Bits the layer's ops compute in (16 or 32)."""
        if self.cls in FLOAT32_INSIDE and not self.dtype_given:
            return 32
        return 16 if is_16bit(self.compute_dtype) else 32


def describe_model(model: Any) -> LayerInfo:
    """The model as a tree of :class:`LayerInfo` (names, paths, classes, compute dtypes)."""

    def visit(layer: Any, prefix: str) -> LayerInfo:
        path = layer_path(prefix, layer.name)
        try:
            trainable = int(sum(math.prod(w.shape) for w in layer.trainable_weights))
        except Exception:  # noqa: BLE001 - unbuilt layers
            trainable = 0
        info = LayerInfo(
            name=layer.name,
            path=path,
            cls=type(layer).__name__,
            compute_dtype=str(getattr(layer, "compute_dtype", "float32")),
            trainable_params=trainable,
        )
        info.children = [visit(c, path) for c in sublayers(layer)]
        return info

    return visit(model, "")


def tree_from_layers_table(
    table: Mapping[str, Any],
) -> tuple[LayerInfo | None, dict[str, dict[str, int]]]:
    """The model as :func:`describe_model` gives it, and each layer's Tensor Core dimensions,
    from a run's ``layers`` record table (``{"columns": [...], "data": [...]}``, rows with
    ``path``, ``class``, ``compute_dtype``, ``trainable_params``, ``tc_dims``): how a trace is
    joined to the model's layers after the fit, without the model. ``(None, {})`` when the table
    has no paths.

    >>> root, dims = tree_from_layers_table({"columns": ["name", "path", "class",
    ...     "compute_dtype", "trainable_params", "tc_dims"], "data": [
    ...     ["dense", "net/dense", "Dense", "float16", 40, {"in": 8, "out": 4}]]})
    >>> root.name, [c.path for c in root.children], root.children[0].bits, dims
    ('net', ['net/dense'], 16, {'net/dense': {'in': 8, 'out': 4}})
    """
    cols = list(table.get("columns") or [])
    if "path" not in cols:
        return None, {}
    rows = [dict(zip(cols, r)) for r in table.get("data") or []]
    paths = [str(r.get("path") or "") for r in rows if r.get("path")]
    if not paths:
        return None, {}
    root_name = paths[0].split("/")[0]
    root = LayerInfo(name=root_name, path=root_name, cls="Model", compute_dtype="float32")
    nodes: dict[str, LayerInfo] = {root_name: root}
    dims: dict[str, dict[str, int]] = {}
    for r in sorted(rows, key=lambda r: str(r.get("path") or "").count("/")):
        path = str(r.get("path") or "")
        if not path or path in nodes:
            continue
        info = LayerInfo(
            name=str(r.get("name") or path.rsplit("/", 1)[-1]),
            path=path,
            cls=str(r.get("class") or ""),
            compute_dtype=str(r.get("compute_dtype") or "float32"),
            trainable_params=int(r.get("trainable_params") or 0),
        )
        parent = nodes.get(path.rsplit("/", 1)[0] if "/" in path else "", root)
        parent.children.append(info)
        nodes[path] = info
        if isinstance(r.get("tc_dims"), dict) and r["tc_dims"]:
            dims[path] = {str(k): int(v) for k, v in r["tc_dims"].items()}
    return root, dims


def iter_layers(root: LayerInfo) -> Iterable[LayerInfo]:
    """All layers below the root, depth first (the root model itself is not yielded)."""
    for child in root.children:
        yield child
        yield from iter_layers(child)


_TRAILING_SUFFIX = re.compile(r"^(.+)_\d+$")


def scope_candidates(component: str, names: Iterable[str]) -> list[str]:
    """Layer names that a graph scope component may stand for: ``L`` itself or ``L_<digits>``.

    >>> scope_candidates("dense_1_2", ["dense", "dense_1", "dense_2"])
    ['dense_1']
    >>> scope_candidates("dense_1", ["dense", "dense_1", "dense_2"])
    ['dense', 'dense_1']
    """
    known = names if isinstance(names, (set, frozenset, dict)) else set(names)
    out = [component] if component in known else []
    m = _TRAILING_SUFFIX.match(component)
    if m and m.group(1) in known:
        out.append(m.group(1))
    return sorted(out)


def match_scopes(components: Iterable[str], names: Sequence[str]) -> dict[str, str]:
    """Map graph scope components seen under one parent scope to the layer names of that parent.

    TensorFlow makes scope names unique per graph by appending ``_N``; Keras layer names already end
    in ``_N``. A component therefore may match several layers (``dense_1``: layer ``dense_1``, or
    layer ``dense`` made unique). Resolution: each layer gets at most one component first, by
    elimination from components with a single candidate; a remaining tie goes to the suffixed
    reading when the resolved siblings carry a uniqueness suffix, else to the exact name. Components
    that match no layer are left out. A layer called several times (shared layers) may own several
    components.

    >>> match_scopes(["dense_1", "dense_1_2", "dense_2_1"], ["dense", "dense_1", "dense_2"])
    {'dense_1': 'dense', 'dense_1_2': 'dense_1', 'dense_2_1': 'dense_2'}
    >>> match_scopes(["dense", "dense_1"], ["dense", "dense_1"])
    {'dense': 'dense', 'dense_1': 'dense_1'}
    """
    comps = sorted(set(components))
    known = set(names)
    cands = {c: scope_candidates(c, known) for c in comps}
    cands = {c: v for c, v in cands.items() if v}
    result: dict[str, str] = {}
    taken: set[str] = set()
    changed = True
    while changed:
        changed = False
        for c in sorted(cands):
            if c in result:
                continue
            free = [n for n in cands[c] if n not in taken]
            if len(free) == 1:
                result[c] = free[0]
                taken.add(free[0])
                changed = True
    pending = [c for c in cands if c not in result]
    if pending:
        suffixed = sum(1 for c, n in result.items() if c != n)
        exact = sum(1 for c, n in result.items() if c == n)
        prefer_suffix = suffixed > exact
        for c in pending:
            free = [n for n in cands[c] if n not in taken] or cands[c]
            exact_ok = c in free
            others = sorted((n for n in free if n != c), key=len, reverse=True)
            if exact_ok and (not prefer_suffix or not others):
                pick = c
            else:
                pick = others[0] if others else free[0]
            result[c] = pick
            taken.add(pick)
    return dict(sorted(result.items()))


def _model_scope_start(parts: list[str], root_name: str) -> int | None:
    """Index of the component that is the root model's scope (``net`` or ``net_1``)."""
    for i, p in enumerate(parts[:-1]):
        if scope_candidates(p, [root_name]):
            return i
    return None


def _sub_model_scope_start(parts: list[str], sub_models: Sequence[str]) -> int | None:
    """Index of the first component that is the scope of one of the root's sub-models, for an
    op outside the root's own scope: a train step (or ``compute_loss``) that calls a sub-model
    itself (``self.teacher(x)`` in a distiller, a GAN's generator) opens that sub-model's scope
    at the top (``StatefulPartitionedCall/teacher_1/conv2d_1/convolution``), not under the
    root model's."""
    if not sub_models:
        return None
    for i, p in enumerate(parts[:-1]):
        if scope_candidates(p, sub_models):
            return i
    return None


def attribute_ops(op_names: Iterable[str], root: LayerInfo) -> dict[str, LayerInfo | None]:
    """For each op name, the deepest layer whose scope holds it (None: outside every layer).

    An op outside the root model's scope joins through the scope of one of the root's sub-models
    where it has one (a train step that calls ``self.teacher(x)`` itself).

    >>> root = LayerInfo("distiller", "distiller", "Distiller", "float32", children=[
    ...     LayerInfo("teacher", "distiller/teacher", "Sequential", "float16", children=[
    ...         LayerInfo("conv2d", "distiller/teacher/conv2d", "Conv2D", "float16")])])
    >>> found = attribute_ops(["StatefulPartitionedCall/teacher_1/conv2d_1/convolution",
    ...     "StatefulPartitionedCall/cond/then/_47/cond/Cumsum_1"], root)
    >>> [v.path if v else None for v in found.values()]
    [None, 'distiller/teacher/conv2d']
    """
    names = list(dict.fromkeys(op_names))
    split = {n: n.split("/") for n in names}
    # Walk level by level: for each (layer, seen components below it) resolve the suffixes together.
    out: dict[str, LayerInfo | None] = {}
    # group op names by the node they reached and the remaining parts
    frontier: dict[int, tuple[LayerInfo, list[tuple[str, list[str]]]]] = {}
    root_items = []
    sub_models = [c.name for c in root.children if c.children]
    for n in names:
        parts = split[n]
        start = _model_scope_start(parts, root.name)
        if start is None:
            sub = _sub_model_scope_start(parts, sub_models)
            if sub is None:
                out[n] = None
            else:
                root_items.append((n, parts[sub:]))
            continue
        root_items.append((n, parts[start + 1 :]))
    frontier[id(root)] = (root, root_items)
    while frontier:
        nxt: dict[int, tuple[LayerInfo, list[tuple[str, list[str]]]]] = {}
        for node, items in frontier.values():
            by_name = {c.name: c for c in node.children}
            seen = [rest[0] for _, rest in items if len(rest) > 1]
            mapping = match_scopes(seen, by_name) if by_name else {}
            for n, rest in items:
                child = by_name.get(mapping.get(rest[0], "")) if len(rest) > 1 else None
                if child is None:
                    out[n] = node if node is not root else None
                else:
                    nxt.setdefault(id(child), (child, []))[1].append((n, rest[1:]))
        frontier = nxt
    return out


def attribute_jax_ops(op_names: Iterable[str], root: LayerInfo) -> dict[str, LayerInfo | None]:
    """For each JAX op name, the deepest layer of ``root`` its scopes name (None: outside every
    layer): ``jit(train_step)/jvp(block)/jvp(dense)/dot_general`` walks ``block`` then its child
    ``dense``; a scope that is no child of the layer reached so far is taken by its name when one
    layer of the model alone has that name (JAX may leave a container's scope out).

    >>> root = LayerInfo("m", "m", "Functional", "float32", children=[
    ...     LayerInfo("conv2d", "m/conv2d", "Conv2D", "float16")])
    >>> {k: v.path if v else None for k, v in attribute_jax_ops(
    ...     ["jit(train_step)/transpose(jvp(conv2d))/conv_general_dilated",
    ...      "jit(train_step)/jvp(compile_loss)/log"], root).items()}
    {'jit(train_step)/transpose(jvp(conv2d))/conv_general_dilated': 'm/conv2d', \
'jit(train_step)/jvp(compile_loss)/log': None}
    """
    infos = list(iter_layers(root))
    count: dict[str, int] = {}
    for info in infos:
        count[info.name] = count.get(info.name, 0) + 1
    unique = {info.name: info for info in infos if count[info.name] == 1}
    out: dict[str, LayerInfo | None] = {}
    for name in dict.fromkeys(op_names):
        node, found = root, None
        for scope, _, _ in jax_scopes(name):
            child = next((c for c in node.children if c.name == scope), None)
            if child is None:
                child = unique.get(scope)
            if child is not None:
                node = found = child
        out[name] = found
    return out


def attribute_any_ops(op_names: Iterable[str], root: LayerInfo) -> dict[str, LayerInfo | None]:
    """:func:`attribute_ops` for TensorFlow op names, :func:`attribute_jax_ops` for JAX ones."""
    names = list(dict.fromkeys(op_names))
    jax_names = [n for n in names if is_jax_op_name(n)]
    if not jax_names:
        return attribute_ops(names, root)
    out = attribute_ops([n for n in names if not is_jax_op_name(n)], root)
    out.update(attribute_jax_ops(jax_names, root))
    return out


# --- JAX op names and the direction of an op ---------------------------------------------------
# JAX transformations that wrap a name scope: jvp(conv2d), transpose(jvp(conv2d)), vmap(...);
# function wrappers (jit(train_step), pjit(...)) name functions, not layers
_JAX_FUNCTION_WRAPPERS = frozenset({"jit", "pjit", "xla_pmap", "pmap", "shard_map", "xla_call"})
_JAX_MARK = re.compile(r"(?:^|/)(?:jit|pjit|xla_pmap|pmap)\(|(?:^|/)(?:transpose|jvp|vmap)\(")
_WRAPPED = re.compile(r"^([A-Za-z_][\w.]*)\((.*)\)$", re.S)

DIRECTIONS = ("forward", "backward", "unknown")
#: JAX name scopes that hold no layer: Keras 3's trainer computes the loss under ``compile_loss``
#: (inside ``jvp``, beside the layers)
JAX_NON_LAYER_SCOPES = frozenset({"compile_loss"})


def split_op_name(op_name: str) -> list[str]:
    """``op_name`` split at the ``/`` outside parentheses (``transpose(jvp(a/b))`` is one part).

    >>> split_op_name("jit(train_step)/transpose(jvp(functional/dense))/dot_general")
    ['jit(train_step)', 'transpose(jvp(functional/dense))', 'dot_general']
    """
    parts, depth, cur = [], 0, []
    for ch in op_name:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        if ch == "/" and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def is_jax_op_name(op_name: str) -> bool:
    """Whether an op name has JAX's form (``jit(f)/...``, ``jvp(...)``, ``transpose(...)``)."""
    return bool(_JAX_MARK.search(op_name or ""))


def jax_scopes(op_name: str) -> list[tuple[str, bool, bool]]:
    """The name scopes of a JAX op name, outermost first: ``(scope, backward, differentiated)``.

    ``backward``: the scope sits inside a ``transpose(...)`` (the backward pass);
    ``differentiated``: inside ``jvp(...)`` or ``transpose(...)`` (the model's forward or backward,
    not the optimizer).
    The first component (``jit(train_step)``) names the function and the last the primitive; they
    are no scopes.

    >>> jax_scopes("jit(train_step)/jvp(conv2d_1)/conv_general_dilated")
    [('conv2d_1', False, True)]
    >>> jax_scopes("jit(train_step)/transpose(jvp(conv2d_1))/conv_general_dilated")
    [('conv2d_1', True, True)]
    >>> jax_scopes("jit(train_step)/transpose(jvp(functional/block))/jvp(dense)/dot_general")
    [('functional', True, True), ('block', True, True), ('dense', True, True)]
    """
    parts = split_op_name(op_name or "")
    if len(parts) < 2:
        return []
    middle = parts[:-1]
    out: list[tuple[str, bool, bool]] = []
    backward = differentiated = False
    for i, comp in enumerate(middle):
        wrappers: list[str] = []
        text = comp
        while True:
            m = _WRAPPED.match(text)
            if not m:
                break
            wrappers.append(m.group(1))
            text = m.group(2)
        if "transpose" in wrappers:
            backward = True
        if "transpose" in wrappers or "jvp" in wrappers:
            differentiated = True
        if i == 0 and wrappers and wrappers[0] in _JAX_FUNCTION_WRAPPERS:
            continue  # jit(train_step): the function
        if wrappers and set(wrappers) <= _JAX_FUNCTION_WRAPPERS:
            continue  # a nested jit(...) call: a function, not a scope
        for scope in text.split("/"):
            if scope:
                out.append((scope, backward, differentiated))
    return out


def op_name_direction(op_name: str) -> str:
    """``forward``, ``backward`` or ``unknown`` for an op name.

    JAX: ``transpose(...)`` is the backward pass, ``jvp(...)`` or a plain scope the forward.
    TensorFlow: ``gradient_tape`` or ``gradients`` scopes are the backward pass. Names without a
    scope (``XlaModule``: XLA fusions xprof could not map to an op) are ``unknown``.

    >>> op_name_direction("jit(train_step)/transpose(jvp(conv2d))/conv_general_dilated")
    'backward'
    >>> op_name_direction("model/conv2d/Conv2D")
    'forward'
    >>> op_name_direction("XlaModule")
    'unknown'
    """
    op_name = op_name or ""
    if is_jax_op_name(op_name):
        return "backward" if "transpose(" in op_name else "forward"
    parts = op_name.split("/")
    if len(parts) < 2:
        return "unknown"
    if any(p == "gradient_tape" or p.startswith("gradients") for p in parts):
        return "backward"
    return "forward"


def layer_resolver(model: Any) -> tuple[LayerInfo | None, dict[str, LayerInfo], set[str]]:
    """(root, name -> LayerInfo for unique names, all names) of ``model`` (a Keras model, a
    :class:`LayerInfo` tree, a layer name or an iterable of layer names; None: no layers)."""
    if model is None:
        return None, {}, set()
    if isinstance(model, LayerInfo):
        root = model
    elif isinstance(model, str):
        return None, {}, {model}
    elif not (hasattr(model, "layers") or hasattr(model, "_flatten_layers")):
        return None, {}, {str(n) for n in model}
    else:
        root = describe_model(model)
    infos = list(iter_layers(root))
    count: dict[str, int] = {}
    for info in infos:
        count[info.name] = count.get(info.name, 0) + 1
    by_name = {info.name: info for info in infos if count[info.name] == 1}
    return root, by_name, {info.name for info in infos}


def attribute_kernels(
    op_names: Iterable[str], model: Any = None
) -> dict[str, tuple[str | None, str | None, str]]:
    """For each op name: ``(layer, path, direction)``; layer and path None outside every layer.

    JAX names: the innermost scope that is a layer of ``model`` (a Keras model, a
    :class:`LayerInfo` tree or an iterable of layer names); without a model, the innermost scope
    inside ``jvp``/``transpose`` (the model's forward and backward pass; the optimizer's scopes
    are outside them), none under Keras' loss scope (:data:`JAX_NON_LAYER_SCOPES`). TensorFlow
    names: the scope matching of :func:`attribute_ops` (needs a model tree). ``direction``:
    :func:`op_name_direction`, taken from the layer's own scope for JAX names.
    """
    root, by_name, names = layer_resolver(model)
    unique = list(dict.fromkeys(str(n) for n in op_names))
    tf_names = [n for n in unique if not is_jax_op_name(n)]
    tf_owner = attribute_ops(tf_names, root) if (root is not None and tf_names) else {}
    out: dict[str, tuple[str | None, str | None, str]] = {}
    for n in unique:
        direction = op_name_direction(n)
        if is_jax_op_name(n):
            scopes = jax_scopes(n)
            pick = None
            if names:
                pick = next((s for s in reversed(scopes) if s[0] in names), None)
            elif scopes and not any(s[0] in JAX_NON_LAYER_SCOPES for s in scopes):
                diff = [s for s in scopes if s[2]]
                pick = diff[-1] if diff else None
            if pick is None:
                out[n] = (None, None, direction)
                continue
            scope, backward, _ = pick
            info = by_name.get(scope)
            out[n] = (
                scope,
                info.path if info is not None else scope,
                "backward" if backward else "forward",
            )
        else:
            info = tf_owner.get(n)
            if info is None:
                out[n] = (None, None, direction)
            else:
                key = info.name if by_name.get(info.name) is info else info.path
                out[n] = (key, info.path, direction)
    return out
