"""Profiler trace → op table → per-layer time by the precision it ran in, and the cost of casts.

A trace captured by ``tf.profiler`` (``callbacks/profile_capture.py``, or Keras' own TensorBoard
callback) lies at ``<logdir>/plugins/profile/<run>/<host>.xplane.pb``. :func:`op_table` converts a
*copy* of it with xprof's own converter (tool ``framework_op_stats``, the table of TensorBoard's
Profile tab; the converter writes cache files beside its input, so the original run directory is
left alone) into a pandas table, one row per TensorFlow op. :func:`layer_time` joins the rows to the
model's layers by op name scope and splits each layer's time by the precision the op really ran in.

Op names look like ``StatefulPartitionedCall/sequential_1/dense_1_2/MatMul`` or
``.../gradient_tape/sequential_1/dense_1_2/MatMul/MatMul_1``: TensorFlow makes a graph name scope
unique by appending ``_N``, so the scope of layer ``dense_1`` may read ``dense_1_2`` and the scope
of layer ``dense`` may read ``dense_1`` (the name of *another* layer). :func:`match_scopes` resolves
this per parent scope: a scope component matches layer ``L`` when it is ``L`` or ``L_<digits>``;
components with a single candidate are fixed first, the rest by elimination, and a remaining tie by
the suffix pattern of the resolved siblings (see :func:`match_scopes`).

Precision of an op (``bits``): 16 when it belongs to a layer that computes in float16 or bfloat16
(bfloat16 counts as 16-bit, unlike the overview page of TensorBoard's Profile tab), 32 otherwise.
Exceptions, by op type: ``Cast`` (a conversion, not 16-bit compute), variable reads and writes
(variables are float32 under the mixed policies) and input-pipeline ops count as 32. Normalization
layers (BatchNormalization, LayerNormalization, GroupNormalization, RMSNormalization) compute in
float32 inside under a 16-bit policy, so their ops count as 32 too. Ops outside every layer (loss,
optimizer, input pipeline, the model's input casts) are *unattributed* and count as 32.

Time is the op's *self* time (time in the op minus time in ops nested inside it), so that rows add
up to the time of the captured steps without double counting. With a GPU the table holds the device
rows (GPU kernels grouped by TensorFlow op); on a CPU the host rows.

GPU kernels (:func:`kernel_table`, :func:`kernel_time`): xprof's ``kernel_stats`` tool gives one
row per GPU kernel (name, op name, duration, launch shape, xprof's Tensor Core flags). Each kernel
is classified by its name (:mod:`mpwatch.kernels`: precision and Tensor Core use; xprof's own
"Kernel uses TensorCore" misses most Ampere/Hopper kernel names) and joined to a layer through its
op name: TensorFlow scopes as above, JAX names ``jit(train_step)/jvp(conv2d_1)/...`` (forward) and
``jit(train_step)/transpose(jvp(conv2d_1))/...`` (backward), which works for traces of Keras' JAX
backend too.

Example (needs TensorFlow and xprof):
    >>> from mpwatch import profile  # doctest: +SKIP
    >>> ops = profile.op_table("logs/run1")  # doctest: +SKIP
    >>> result = profile.layer_time(ops, model)  # doctest: +SKIP
    >>> result.layers.sort_values("time_us", ascending=False).head()  # doctest: +SKIP
    >>> gpu = profile.kernel_time(profile.kernel_table("logs/run1"), model)  # doctest: +SKIP
    >>> gpu.summary["tensor_core_share"], gpu.summary["xprof_tensor_core_share"]  # doctest: +SKIP
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from mpwatch import contract, xplane
from mpwatch.formats import FLOAT32_INSIDE, is_16bit
from mpwatch.kernels import PRECISIONS, SIXTEEN_BIT_PRECISIONS, classify
from mpwatch.layers import layer_path, sublayers

TOOL = "framework_op_stats"

# Op types TensorFlow's automatic mixed precision graph rewrite keeps in float32 (its "deny list"
# and the reductions of its "infer list" that it leaves in float32). Keras' mixed policy does not
# rewrite the graph: in a float16 layer these ops run in float16 unless the layer casts. A fact for
# the advice.
AMP_FLOAT32_OPS = frozenset(
    {
        "Exp",
        "Expm1",
        "L2Loss",
        "Mean",
        "Pow",
        "Sum",
        "SoftmaxCrossEntropyWithLogits",
        "SparseSoftmaxCrossEntropyWithLogits",
    }
)

CAST_OPS = frozenset({"Cast", "convert_element_type"})  # TensorFlow's, JAX's
# Op types that never compute in the layer's dtype: variables are float32, input pipeline is host
# code.
ALWAYS_32BIT_OPS = frozenset(
    {
        "Cast",
        "convert_element_type",
        "ReadVariableOp",
        "AssignVariableOp",
        "AssignAddVariableOp",
        "AssignSubVariableOp",
        "VarHandleOp",
        "ResourceGather",
        "Dataset",
        "IteratorGetNext",
        "OptionalFromValue",
        "OptionalGetValue",
        "OptionalHasValue",
    }
)
# Rows the converter adds that are no ops.
NON_OP_TYPES = frozenset({"IDLE"})

OP_COLUMNS = [
    "host_or_device",
    "op_type",
    "op_name",
    "occurrences",
    "total_time_us",
    "self_time_us",
    "execution_mode",
]


class ProfileError(RuntimeError):
    """A trace could not be found, converted or read; the message says which and why."""


# --- finding and converting traces ---------------------------------------------------------------
def find_traces(path: str | os.PathLike) -> list[str]:
    """The ``*.xplane.pb`` files of one profile run.

    ``path`` is a ``.xplane.pb`` file, a run directory holding them, or a logdir whose
    ``plugins/profile/<run>/`` directories hold them (then the newest run is taken).
    """
    path = os.fspath(path)
    if os.path.isfile(path):
        if not path.endswith(".xplane.pb"):
            raise ProfileError(f"{path} is no profiler trace (expected a *.xplane.pb file)")
        return [path]
    if not os.path.isdir(path):
        raise ProfileError(f"no profiler trace at {path}: no such file or directory")
    here = sorted(glob.glob(os.path.join(glob.escape(path), "*.xplane.pb")))
    if here:
        return here
    runs = sorted(
        d
        for d in glob.glob(os.path.join(glob.escape(path), "plugins", "profile", "*"))
        if glob.glob(os.path.join(glob.escape(d), "*.xplane.pb"))
    )
    if not runs:
        raise ProfileError(
            f"no profiler trace under {path}: expected "
            "<logdir>/plugins/profile/<run>/<host>.xplane.pb"
        )
    return sorted(glob.glob(os.path.join(glob.escape(runs[-1]), "*.xplane.pb")))


def convert(traces: Sequence[str], tool: str = TOOL) -> Any:
    """Run xprof's converter for ``tool`` on copies of ``traces``; returns the parsed JSON.

    The copies live in a temporary directory that is removed afterwards, together with the cache
    files the converter writes beside them.
    """
    try:
        from xprof.convert import raw_to_tool_data
    except ImportError as e:  # pragma: no cover - xprof is a dependency
        raise ProfileError(
            f"xprof's converter is not importable ({e}): pip install tensorboard-plugin-profile"
        ) from e
    with tempfile.TemporaryDirectory(prefix="mpwatch-profile-") as tmp:
        copies = []
        for i, src in enumerate(traces):
            if not os.path.isfile(src) or os.path.getsize(src) == 0:
                raise ProfileError(f"profiler trace {src} is missing or empty")
            dst = os.path.join(tmp, f"{i}_{os.path.basename(src)}")
            shutil.copyfile(src, dst)
            copies.append(dst)
        try:
            data, _ = raw_to_tool_data.xspace_to_tool_data(copies, tool, {})
        except Exception as e:  # noqa: BLE001 - the converter raises whatever its C++ layer gives
            why = _unreadable(traces)
            raise ProfileError(why or f"xprof could not convert {traces[0]} ({tool}): {e}") from e
    if not data:
        why = _unreadable(traces)
        if why:
            raise ProfileError(why)
        raise ProfileError(
            f"xprof returned no {tool} data for {traces[0]}: the trace is empty or unreadable"
        )
    if isinstance(data, bytes):
        data = data.decode("utf-8", errors="replace")
    try:
        return json.loads(data)
    except json.JSONDecodeError as e:
        raise ProfileError(f"xprof's {tool} output is not JSON: {e}") from e


def _unreadable(traces: Sequence[str]) -> str | None:
    """Why a trace is no XSpace at all (None when it parses). Read with :mod:`mpwatch.xplane`, so
    no TensorFlow is imported."""
    for path in traces:
        try:
            space = xplane.read_xspace(path, planes=lambda name: False)
        except (xplane.XSpaceError, OSError) as e:
            return f"{path} is not a readable profiler trace (XSpace): {e}"
        if not space.planes:
            return f"{path} is not a profiler trace: it holds no planes"
    return None


def has_gpu_planes(traces: Sequence[str]) -> bool:
    """Whether any trace holds a ``/device:GPU:*`` plane (GPU kernels). A trace that cannot be
    read counts as having one, so the converter says what is wrong with it."""
    for path in traces:
        try:
            space = xplane.read_xspace(path, planes=lambda name: False)
        except (xplane.XSpaceError, OSError):
            return True
        if any(p.name.startswith("/device:GPU") for p in space.planes):
            return True
    return False


def _datatable_frame(table: Mapping[str, Any]) -> pd.DataFrame:
    cols = [c["id"] for c in table.get("cols", [])]
    rows = [[cell.get("v") if cell else None for cell in r.get("c", [])] for r in table["rows"]]
    return pd.DataFrame(rows, columns=cols)


def op_table(path: str | os.PathLike | Sequence[str], side: str = "auto") -> pd.DataFrame:
    """The framework op table of a trace: one row per TensorFlow op (the Profile tab's table).

    Columns: ``host_or_device, op_type, op_name, occurrences, total_time_us, self_time_us,
    execution_mode``. IDLE rows are dropped. ``side``: ``"device"`` (GPU rows), ``"host"`` (CPU
    rows) or ``"auto"`` (device rows when the trace has device time, else host rows); ``"all"``
    keeps both. ``df.attrs["side"]`` says which. Raises :class:`ProfileError` when the trace has no
    ops.
    """
    traces = list(path) if isinstance(path, (list, tuple)) else find_traces(path)
    data = convert(traces)
    tables = data if isinstance(data, list) else [data]
    tables = [t for t in tables if isinstance(t, Mapping) and "rows" in t]
    if not tables:
        raise ProfileError(f"xprof's {TOOL} output for {traces[0]} has no table")
    # The converter returns the table with IDLE rows and the one without; take the one without.
    frames = [_datatable_frame(t) for t in tables]
    frame = frames[-1]
    for f in frames:
        if "type" in f and not f["type"].isin(NON_OP_TYPES).any():
            frame = f
            break
    needed = {"host_or_device", "type", "operation", "occurrences", "total_time", "total_self_time"}
    missing = needed - set(frame.columns)
    if missing:
        raise ProfileError(f"xprof's {TOOL} table lacks columns {sorted(missing)}")
    df = pd.DataFrame(
        {
            "host_or_device": frame["host_or_device"].astype(str),
            "op_type": frame["type"].astype(str),
            "op_name": frame["operation"].astype(str),
            "occurrences": pd.to_numeric(frame["occurrences"]).fillna(0).astype("int64"),
            "total_time_us": pd.to_numeric(frame["total_time"]).astype(float),
            "self_time_us": pd.to_numeric(frame["total_self_time"]).astype(float),
            "execution_mode": frame["eager"].astype(str) if "eager" in frame else "",
        }
    )
    df = df[~df["op_type"].isin(NON_OP_TYPES)]
    is_device = df["host_or_device"].str.lower().eq("device")
    if side == "auto":
        side = "device" if (df.loc[is_device, "self_time_us"] > 0).any() else "host"
    if side == "device":
        df = df[is_device]
    elif side == "host":
        df = df[~is_device]
    elif side != "all":
        raise ValueError(f"side must be 'auto', 'device', 'host' or 'all', not {side!r}")
    df = df.reset_index(drop=True)
    if df.empty or df["self_time_us"].sum() <= 0:
        unreadable = _unreadable(traces)
        if unreadable:
            raise ProfileError(unreadable)
        raise ProfileError(
            f"the trace {traces[0]} holds no TensorFlow ops ({side} side): was the profiler "
            "started and stopped around training steps?"
        )
    df.attrs["side"] = side
    df.attrs["traces"] = traces
    return df


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


def attribute_ops(op_names: Iterable[str], root: LayerInfo) -> dict[str, LayerInfo | None]:
    """For each op name, the deepest layer whose scope holds it (None: outside every layer)."""
    names = list(dict.fromkeys(op_names))
    split = {n: n.split("/") for n in names}
    # Walk level by level: for each (layer, seen components below it) resolve the suffixes together.
    out: dict[str, LayerInfo | None] = {}
    # group op names by the node they reached and the remaining parts
    frontier: dict[int, tuple[LayerInfo, list[tuple[str, list[str]]]]] = {}
    root_items = []
    for n in names:
        parts = split[n]
        start = _model_scope_start(parts, root.name)
        if start is None:
            out[n] = None
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


# --- the join ------------------------------------------------------------------------------------
@dataclass
class ProfileResult:
    """Per-layer time by precision, per-op-type time, the Cast share; ``payload()``: the record."""

    ops: pd.DataFrame  # the op table with columns layer, bits, is_cast added
    layers: pd.DataFrame
    op_types: pd.DataFrame
    total_us: float
    unattributed_us: float
    cast_us: float
    device: str

    @property
    def cast_share(self) -> float:
        return self.cast_us / self.total_us if self.total_us > 0 else float("nan")

    @property
    def share_16bit(self) -> float:
        t16 = float(self.ops.loc[self.ops["bits"] == 16, "self_time_us"].sum())
        return t16 / self.total_us if self.total_us > 0 else float("nan")

    def payload(self, steps: Sequence[int] | None = None, trace_dir: str = "") -> dict[str, Any]:
        """The ``profile`` record payload of ``contract.py`` (schema 1, with added keys)."""

        def split(df: pd.DataFrame) -> dict[str, Any]:
            return contract.table(list(df.columns), df.astype(object).values.tolist())

        unattributed = self.ops[self.ops["layer"].isna()]
        by_category = (
            unattributed.groupby(unattributed["op_name"].map(op_category))["self_time_us"]
            .sum()
            .to_dict()
        )
        payload = {
            "steps": [int(s) for s in steps] if steps else None,
            "device": self.device,
            "total_us": self.total_us,
            "unattributed_us": self.unattributed_us,
            "unattributed_by_category": {k: float(v) for k, v in by_category.items()},
            "cast_us": self.cast_us,
            "cast_share": self.cast_share,
            "share_16bit": self.share_16bit,
            "layers": split(self.layers),
            "op_types": split(self.op_types),
            "trace_dir": trace_dir,
            "side": self.ops.attrs.get("side", ""),
            "tool": TOOL,
            "bits_rule": (
                "16 for ops of layers computing in float16/bfloat16 (normalization layers compute "
                "in float32 inside); Cast, variable and input-pipeline ops and unattributed ops 32"
            ),
            "layers_dropped": 0,
        }
        # a huge model: keep the layers with the most time so that the record stays under the
        # writer's size limit (the totals above still cover every layer)
        layers = self.layers.sort_values("time_us", ascending=False, kind="stable")
        keep = len(layers)
        while keep > 1 and len(contract.encode_payload(payload)) > contract.MAX_RECORD_BYTES * 0.9:
            keep = keep // 2
            payload["layers"] = split(layers.head(keep))
            payload["layers_dropped"] = int(len(layers) - keep)
        return payload


def op_category(op_name: str) -> str:
    """A rough category of an op outside every layer (for the unattributed breakdown)."""
    low = op_name.lower()
    if op_name.startswith("Iterator::") or "iterator" in low or op_name in ("optional",):
        return "input_pipeline"
    if "compile_loss" in low or "/loss" in low or low.startswith("loss"):
        return "loss"
    parts = set(low.split("/"))
    if parts & {"adam", "sgd", "rmsprop", "adamw", "adagrad", "adafactor", "lion", "nadam"} or (
        "cond" in parts and "then" in parts
    ):
        return "optimizer"
    if "gradient_tape" in parts:
        return "gradients"
    return "other"


def op_bits(op_type: str, layer: LayerInfo | None) -> int:
    """The precision an op ran in (see the module docstring)."""
    if layer is None or op_type in ALWAYS_32BIT_OPS:
        return 32
    return layer.bits


def layer_time(
    ops: pd.DataFrame,
    model: Any,
    dtype_overrides: Mapping[str, str] | None = None,
) -> ProfileResult:
    """Join an :func:`op_table` (or an :func:`xla_op_table`) to a model's layers.

    ``model`` is a Keras model or a :class:`LayerInfo` tree from :func:`describe_model` (None: no
    layers, every op unattributed). TensorFlow op names join by scope (:func:`attribute_ops`), JAX
    op names by their layer scopes (:func:`attribute_jax_ops`).
    ``dtype_overrides`` maps layer paths to the dtype they really compute in, where the caller knows
    better (e.g. the ``effective_dtype`` of mpwatch's layer table).

    The ``layers`` table has one row per layer that has trainable weights or got time: ``layer``
    (its name, the key of mpwatch's layers and probe tables; its path where two nested layers share
    a name), ``time_us = time_16bit_us + time_32bit_us``, ``ops`` (distinct ops), ``share`` (of the
    total), then ``cast_us`` (part of the 32-bit time), ``path`` (``model/outer/inner/dense``, as in
    the layers record), ``class``, ``compute_dtype``, ``bits``, ``trainable_params``. Nested models
    get a row only for ops of their own (their layers have rows). Every op lands in exactly one
    layer or in the unattributed time, so ``layers.time_us.sum() + unattributed_us == total_us``.
    """
    if model is None:  # no model: no layer to join to (every op unattributed)
        root = LayerInfo(name="", path="", cls="", compute_dtype="unknown")
    else:
        root = model if isinstance(model, LayerInfo) else describe_model(model)
    if dtype_overrides:
        for info in iter_layers(root):
            if info.path in dtype_overrides:
                info.compute_dtype = str(dtype_overrides[info.path])
                info.dtype_given = True
    ops = ops.copy()
    owner = attribute_any_ops(ops["op_name"], root)
    layer_of = ops["op_name"].map(owner)
    ops["layer"] = layer_of.map(lambda li: li.path if li is not None else None)
    ops["bits"] = [op_bits(t, li) for t, li in zip(ops["op_type"], layer_of)]
    ops["is_cast"] = ops["op_type"].isin(CAST_OPS)
    total = float(ops["self_time_us"].sum())

    # the ``layer`` column is the layer's name (the join key of mpwatch's layers and probe tables);
    # where two nested layers share a name, their paths instead
    all_layers = list(iter_layers(root))
    name_count: dict[str, int] = {}
    for info in all_layers:
        name_count[info.name] = name_count.get(info.name, 0) + 1
    owned = ops[ops["layer"].notna()]
    n_ops = owned.groupby("layer").size().to_dict()
    t16_of = owned[owned["bits"] == 16].groupby("layer")["self_time_us"].sum().to_dict()
    t32_of = owned[owned["bits"] == 32].groupby("layer")["self_time_us"].sum().to_dict()
    cast_of = owned[owned["is_cast"]].groupby("layer")["self_time_us"].sum().to_dict()
    rows = []
    for info in all_layers:
        count = int(n_ops.get(info.path, 0))
        # containers (nested models) get a row only for their own ops; their layers have theirs
        if count == 0 and (info.trainable_params == 0 or info.children):
            continue
        t16 = float(t16_of.get(info.path, 0.0))
        t32 = float(t32_of.get(info.path, 0.0))
        rows.append(
            [
                info.name if name_count[info.name] == 1 else info.path,
                t16 + t32,
                t16,
                t32,
                count,
                (t16 + t32) / total if total > 0 else float("nan"),
                float(cast_of.get(info.path, 0.0)),
                info.path,
                info.cls,
                info.compute_dtype,
                info.bits,
                info.trainable_params,
            ]
        )
    layers = pd.DataFrame(
        rows,
        columns=list(contract.PROFILE_LAYER_COLUMNS),
    )
    grouped = ops.groupby(["op_type", "bits"], sort=False)
    op_types = grouped.agg(
        time_us=("self_time_us", "sum"), count=("occurrences", "sum"), ops=("op_name", "size")
    ).reset_index()
    op_types["kept_float32_by_amp"] = op_types["op_type"].isin(AMP_FLOAT32_OPS)
    op_types["share"] = op_types["time_us"] / total if total > 0 else float("nan")
    op_types = op_types[list(contract.PROFILE_OP_TYPE_COLUMNS)]
    op_types = op_types.sort_values("time_us", ascending=False).reset_index(drop=True)
    op_types["count"] = op_types["count"].astype("int64")
    side = ops.attrs.get("side", "host")
    return ProfileResult(
        ops=ops,
        layers=layers,
        op_types=op_types,
        total_us=total,
        unattributed_us=float(ops.loc[ops["layer"].isna(), "self_time_us"].sum()),
        cast_us=float(ops.loc[ops["is_cast"], "self_time_us"].sum()),
        device="GPU" if side == "device" else "CPU",
    )


# --- XLA: op names from the trace's HLO metadata -------------------------------------------------
#: op names xprof gives kernels it could not map to a framework op (XLA launched them from a CUDA
#: graph, or outside any op)
_NO_OP_NAMES = frozenset({"", "XlaModule", "XlaModule:"})
_NON_WORD = re.compile(r"[^A-Za-z0-9_]")


class HloIndex:
    """HLO instructions of the traces' compiled programs, by name: the framework op each came from.

    Built from the metadata plane of each trace (:func:`mpwatch.xplane.hlo_ops`). An instruction's
    op name is its own metadata's; a fusion without one takes its fused instructions' op name when
    they all have the same. Where several programs (or instructions whose names differ only in
    punctuation) give different op names, the name is left empty: never guessed.
    """

    def __init__(self, programs: Mapping[str, Mapping[str, xplane.HloOp]]) -> None:
        self.programs = {str(k): dict(v) for k, v in programs.items()}
        self._by_base: dict[str, list[str]] = {}
        for key in self.programs:
            self._by_base.setdefault(xplane.module_base(key), []).append(key)
        self._kernel_names: dict[str, dict[str, list[xplane.HloOp]]] = {}

    @classmethod
    def of_traces(cls, traces: Sequence[str], planes: Any = None) -> tuple[HloIndex, list[Any]]:
        """``(index, spaces)`` of traces (spaces: the decoded :class:`mpwatch.xplane.XSpace` s)."""
        spaces = [xplane.read_xspace(t, planes) for t in traces]
        programs: dict[str, dict[str, xplane.HloOp]] = {}
        for space in spaces:
            programs.update(xplane.hlo_ops(space))
        return cls(programs), spaces

    def __bool__(self) -> bool:
        return bool(self.programs)

    @staticmethod
    def own_op_name(op: xplane.HloOp) -> str:
        """The op name an instruction stands for (its own, else its fused ops' common one)."""
        if op.op_name:
            return op.op_name
        fused = set(op.fused_op_names)
        return next(iter(fused)) if len(fused) == 1 else ""

    def _candidates(self, module: str) -> list[str]:
        if module in self.programs:
            return [module]
        return self._by_base.get(xplane.module_base(module), [])

    def op_name(self, module: str, instruction: str) -> tuple[str, str]:
        """``(op name, HLO opcode)`` of an instruction of a program (``""`` where unknown);
        ``module`` with or without its program id."""
        names, codes = set(), set()
        for key in self._candidates(module):
            op = self.programs[key].get(instruction)
            if op is not None:
                names.add(self.own_op_name(op))
                codes.add(op.opcode)
        name = next(iter(names)) if len(names) == 1 else ""
        return name, next(iter(codes)) if len(codes) == 1 else ""

    def kernel_op_name(self, kernel_name: str, modules: Iterable[str] = ()) -> str:
        """The op name of a GPU kernel XLA named after its HLO instruction
        (``input_reduce_fusion_4`` for ``input_reduce_fusion.4``), searched in ``modules`` (the
        programs the device plane ran it in) or in every program; ``""`` when unknown or
        ambiguous."""
        keys = [k for m in modules for k in self._candidates(m)] or list(self.programs)
        names = set()
        for key in dict.fromkeys(keys):
            table = self._kernel_names.get(key)
            if table is None:
                table = {}
                for op in self.programs[key].values():
                    table.setdefault(_NON_WORD.sub("_", op.name), []).append(op)
                self._kernel_names[key] = table
            for op in table.get(_NON_WORD.sub("_", kernel_name), []):
                names.add(self.own_op_name(op))
        return next(iter(names)) if len(names) == 1 else ""


def xla_op_table(path: str | os.PathLike | Sequence[str]) -> pd.DataFrame:
    """The op table of a trace of XLA's CPU runtime (``jax.profiler`` on a CPU), where xprof's
    ``framework_op_stats`` has no rows: one row per framework op, from the host plane's events
    that carry ``hlo_module``/``hlo_op`` stats, their op names from the trace's HLO metadata
    (:class:`HloIndex`).

    Columns as :func:`op_table` (:data:`OP_COLUMNS`); ``op_type`` is the op name's last component
    (the JAX primitive: ``conv_general_dilated``, ``dot_general``, ``convert_element_type``), or
    the HLO opcode where the metadata names no op (then ``op_name`` is ``<program>/<instruction>``).
    ``self_time_us`` leaves out HLO events nested inside (a conditional's branches).
    ``df.attrs["side"]`` is ``"host"``, ``df.attrs["source"]`` ``"xla_host"``. Raises
    :class:`ProfileError` when the trace holds no XLA op.
    """
    traces = list(path) if isinstance(path, (list, tuple)) else find_traces(path)
    try:
        index, spaces = HloIndex.of_traces(traces, xplane.metadata_and_host)
    except (xplane.XSpaceError, OSError) as e:
        raise ProfileError(f"{traces[0]} is not a readable profiler trace (XSpace): {e}") from e
    rows: dict[tuple[str, str], list[float]] = {}
    for space in spaces:
        for ev in xplane.xla_host_events(space):
            op_name, opcode = index.op_name(ev.module, ev.hlo_op)
            if op_name:
                op_type = _split_top(op_name)[-1] or opcode or ev.hlo_op
            else:
                op_name = f"{xplane.module_base(ev.module)}/{ev.hlo_op}"
                op_type = opcode or ev.hlo_op
            row = rows.setdefault((op_name, op_type), [0, 0.0, 0.0])
            row[0] += 1
            row[1] += ev.duration_ps / 1e6
            row[2] += ev.self_ps / 1e6
    if not rows:
        raise ProfileError(
            f"the trace {traces[0]} holds no XLA ops (no host events with hlo_op stats): was the "
            "profiler started and stopped around training steps?"
        )
    df = pd.DataFrame(
        [
            ("Host", op_type, op_name, int(n), total, own, "XLA")
            for (op_name, op_type), (n, total, own) in rows.items()
        ],
        columns=OP_COLUMNS,
    )
    df = df.sort_values("self_time_us", ascending=False, kind="stable").reset_index(drop=True)
    df.attrs["side"] = "host"
    df.attrs["source"] = "xla_host"
    df.attrs["traces"] = traces
    return df


#: where the op table of :func:`summarize` comes from
OP_SOURCES = ("framework", "xla", "auto")


def trace_ops(traces: Sequence[str], ops: str = "framework") -> pd.DataFrame:
    """The op table of a trace: ``"framework"`` xprof's (:func:`op_table`: TensorFlow's ops),
    ``"xla"`` XLA's host ops (:func:`xla_op_table`: JAX on a CPU), ``"auto"`` xprof's, else XLA's
    when xprof's has none (the first error is raised when neither has ops)."""
    if ops not in OP_SOURCES:
        raise ValueError(f"ops must be one of {OP_SOURCES}, not {ops!r}")
    if ops == "xla":
        return xla_op_table(traces)
    try:
        return op_table(traces)
    except ProfileError:
        if ops == "framework":
            raise
        first = sys.exc_info()[1]
    try:
        return xla_op_table(traces)
    except ProfileError:
        raise first from None


def summarize(
    trace: str | os.PathLike,
    model: Any,
    steps: Sequence[int] | None = None,
    dtype_overrides: Mapping[str, str] | None = None,
    ops: str = "framework",
    dims: Mapping[str, Mapping[str, int]] | None = None,
) -> dict[str, Any]:
    """Trace (file, run directory or logdir) + model → the ``profile`` record payload.

    The op part (``layers``, ``op_types``, ``share_16bit``, ``cast_us``...: :func:`layer_time`)
    comes from :func:`trace_ops` (``ops``). When the trace has GPU kernels, the kernel part is
    added (:meth:`KernelProfile.record_fields`: ``kernel_summary``, ``kernel_layers``,
    ``kernels``; ``dims``: layer name or path -> its Tensor Core dimensions) and ``source`` is
    ``"device_kernels"``: precision and Tensor Core use per layer are then what the GPU ran.
    Otherwise ``source`` is ``"host_ops"`` (CPU: precision from the layer's dtype) or
    ``"device_ops"``. ``model`` None: no layer join for the op part (``share_16bit`` NaN: the ops'
    precision is unknown), the kernel part joins JAX scopes by name.
    """
    traces = find_traces(trace)
    trace_dir = os.path.dirname(traces[0])
    kernels: KernelProfile | None = None
    kernel_note = ""
    try:
        if has_gpu_planes(traces):  # else xprof's kernel tool only logs an error on stderr
            table = kernel_table(traces)
            if len(table):
                kernels = kernel_time(table, model, dims)
    except ProfileError as e:
        kernel_note = f"no GPU kernel figures: {e}"
    try:
        result = layer_time(trace_ops(traces, ops), model, dtype_overrides)
        payload = result.payload(steps=steps, trace_dir=trace_dir)
        if result.ops.attrs.get("source") == "xla_host":
            payload["tool"] = "xla_host_events"
            payload["bits_rule"] += (
                "; ops from the XLA CPU runtime's events (op names from the trace's HLO metadata)"
            )
    except ProfileError:
        if kernels is None:
            raise
        payload = _ops_part_from_kernels(kernels, steps, trace_dir)
    if model is None:
        payload["share_16bit"] = float("nan")
        payload["bits_rule"] += "; no model given: the ops' precision is unknown"
    if kernels is not None:
        payload["source"] = "device_kernels"
        payload.update(kernels.record_fields())
        _trim_kernels(payload, kernels)
    else:
        payload["source"] = "device_ops" if payload.get("side") == "device" else "host_ops"
        if kernel_note:
            payload["kernel_note"] = kernel_note
    return payload


def _ops_part_from_kernels(
    kernels: KernelProfile, steps: Sequence[int] | None, trace_dir: str
) -> dict[str, Any]:
    """The op part of a record when the trace has GPU kernels but no framework op table."""
    s = kernels.summary
    empty = layer_time(pd.DataFrame(columns=OP_COLUMNS), None)
    payload = empty.payload(steps=steps, trace_dir=trace_dir)
    payload.update(
        device="GPU",
        total_us=float(s["total_us"]),
        unattributed_us=float(s["unattributed_us"]),
        unattributed_by_category={},
        cast_us=0.0,
        cast_share=float("nan"),
        share_16bit=float(s["share_16bit"]),
        side="device",
        tool=KERNEL_TOOL,
        bits_rule="no framework op table in the trace: figures from the GPU kernels",
    )
    return payload


def _trim_kernels(payload: dict[str, Any], kernels: KernelProfile) -> None:
    """Keep the whole record under the size limit: the longest kernels stay (the summaries cover
    every kernel; ``kernels_dropped`` says how many went)."""
    table = kernels.kernel_rows()
    keep = len(table)
    while keep > 1 and len(contract.encode_payload(payload)) > contract.MAX_RECORD_BYTES * 0.9:
        keep = keep // 2
        payload["kernels"] = _split(table.head(keep))
        payload["kernels_dropped"] = int(len(table) - keep)


def _split(df: pd.DataFrame) -> dict[str, Any]:
    """A DataFrame as a record table (NaN kept; JSON-safe values)."""
    clean = df.astype(object).where(df.notna(), None)
    return contract.json_safe(
        contract.table(list(df.columns), clean.values.tolist()), nonfinite="keep"
    )


# --- GPU kernels: xprof's kernel_stats, classified by name, joined to layers ----------------------
KERNEL_TOOL = "kernel_stats"

KERNEL_COLUMNS = [
    "kernel_name",
    "op_name",
    "op_name_from",
    "total_duration_us",
    "occurrences",
    "avg_duration_us",
    "min_duration_us",
    "max_duration_us",
    "xprof_tensor_core_eligible",
    "xprof_tensor_core",
    "grid_dim",
    "block_dim",
    "registers_per_thread",
    "shmem_bytes",
    "occupancy_pct",
]
# xprof's column id -> ours
_KERNEL_SOURCE_COLUMNS = {
    "kernel_name": "kernel_name",
    "op_name": "op_name",
    "total_duration_us": "total_duration_us",
    "occurrences": "occurrences",
    "avg_duration_us": "avg_duration_us",
    "min_duration_us": "min_duration_us",
    "max_duration_us": "max_duration_us",
    "is_op_tensor_core_eligible": "xprof_tensor_core_eligible",
    "is_kernel_using_tensor_core": "xprof_tensor_core",
    "grid_dim": "grid_dim",
    "block_dim": "block_dim",
    "registers_per_thread": "registers_per_thread",
    "shmem_bytes": "shmem_bytes",
    "occupancy_pct": "occupancy_pct",
}
_KERNEL_NUMERIC = (
    "total_duration_us",
    "avg_duration_us",
    "min_duration_us",
    "max_duration_us",
    "registers_per_thread",
    "shmem_bytes",
    "occupancy_pct",
)

# Op names of matrix multiplications and convolutions (the last op name component): TensorFlow op
# types (node names repeat them, maybe with _N) and JAX primitives. Tensor Cores can run these.
_MATMUL_CONV_OP = re.compile(
    r"^(?:Conv[123]D\w*|DepthwiseConv2dNative\w*|MatMul\w*|BatchMatMul\w*|Einsum\w*|XlaDot\w*|"
    r"XlaConv\w*|_FusedConv2D|_FusedMatMul|conv_general_dilated|dot_general|dot|ragged_dot)"
    r"(?:_\d+)?$"
)
# JAX transformations that wrap a name scope: jvp(conv2d), transpose(jvp(conv2d)), vmap(...);
# function wrappers (jit(train_step), pjit(...)) name functions, not layers
_JAX_FUNCTION_WRAPPERS = frozenset({"jit", "pjit", "xla_pmap", "pmap", "shard_map", "xla_call"})
_JAX_MARK = re.compile(r"(?:^|/)(?:jit|pjit|xla_pmap|pmap)\(|(?:^|/)(?:transpose|jvp|vmap)\(")
_WRAPPED = re.compile(r"^([A-Za-z_][\w.]*)\((.*)\)$", re.S)

DIRECTIONS = ("forward", "backward", "unknown")
#: JAX name scopes that hold no layer: Keras 3's trainer computes the loss under ``compile_loss``
#: (inside ``jvp``, beside the layers)
JAX_NON_LAYER_SCOPES = frozenset({"compile_loss"})


def kernel_table(path: str | os.PathLike | Sequence[str]) -> pd.DataFrame:
    """The GPU kernel table of a trace (xprof's ``kernel_stats`` tool): one row per kernel and op.

    Columns (:data:`KERNEL_COLUMNS`): ``kernel_name, op_name, op_name_from, total_duration_us,
    occurrences, avg_duration_us, min_duration_us, max_duration_us, xprof_tensor_core_eligible``
    (xprof's "Op is TensorCore eligible"), ``xprof_tensor_core`` (xprof's "Kernel uses
    TensorCore"), ``grid_dim, block_dim, registers_per_thread, shmem_bytes, occupancy_pct``.
    Columns xprof does not give are empty. ``op_name_from``: ``"xprof"``; ``"hlo"`` for kernels
    xprof gave no op (``XlaModule``: XLA launched them from a CUDA graph) whose HLO instruction in
    the trace's metadata names one (:class:`HloIndex`); ``""`` where neither does. A trace without
    GPU kernels gives an empty table. Like :func:`op_table` the converter runs on a copy of the
    trace (it writes cache files beside its input).
    """
    traces = list(path) if isinstance(path, (list, tuple)) else find_traces(path)
    data = convert(traces, KERNEL_TOOL)
    tables = data if isinstance(data, list) else [data]
    tables = [t for t in tables if isinstance(t, Mapping) and "rows" in t]
    if not tables:
        raise ProfileError(f"xprof's {KERNEL_TOOL} output for {traces[0]} has no table")
    frames = [_datatable_frame(t) for t in tables]
    frame = next((f for f in frames if "kernel_name" in f.columns), frames[0])
    if len(frame) and not {"kernel_name", "total_duration_us"} <= set(frame.columns):
        raise ProfileError(
            f"xprof's {KERNEL_TOOL} table lacks columns "
            f"{sorted({'kernel_name', 'total_duration_us'} - set(frame.columns))}"
        )
    out = pd.DataFrame(index=range(len(frame)))
    for src, dst in _KERNEL_SOURCE_COLUMNS.items():
        out[dst] = frame[src].values if src in frame.columns else None
    for col in _KERNEL_NUMERIC:
        out[col] = pd.to_numeric(out[col], errors="coerce").astype(float)
    out["occurrences"] = pd.to_numeric(out["occurrences"], errors="coerce").fillna(0)
    out["occurrences"] = out["occurrences"].astype("int64")
    for col in ("kernel_name", "op_name", "grid_dim", "block_dim"):
        out[col] = out[col].fillna("").astype(str)
    for col in ("xprof_tensor_core_eligible", "xprof_tensor_core"):
        out[col] = out[col].map(_flag)
    out["op_name_from"] = ["" if n in _NO_OP_NAMES else "xprof" for n in out["op_name"]]
    if len(out) and out["op_name_from"].eq("").any():
        _op_names_from_hlo(out, traces)
    out = out[KERNEL_COLUMNS]
    out.attrs["tool"] = KERNEL_TOOL
    out.attrs["trace"] = traces[0]
    return out


def _op_names_from_hlo(table: pd.DataFrame, traces: Sequence[str]) -> None:
    """Give kernels without an op name (xprof's ``XlaModule``: XLA launched them from a CUDA graph)
    the op name of the HLO instruction they are named after (:class:`HloIndex`); ``op_name_from``
    says ``"hlo"`` for those. A trace that cannot be decoded leaves the names as they are."""
    try:
        index, spaces = HloIndex.of_traces(traces, xplane.metadata_and_devices)
    except (xplane.XSpaceError, OSError):
        return
    if not index:
        return
    modules: dict[str, dict[str, int]] = {}
    for space in spaces:
        for kernel, per in xplane.kernel_modules(space).items():
            modules.setdefault(kernel, {}).update(per)
    for i in table.index[table["op_name_from"].eq("")]:
        kernel = str(table.at[i, "kernel_name"])
        name = index.kernel_op_name(kernel, modules.get(kernel, {}))
        if name:
            table.at[i, "op_name"] = name
            table.at[i, "op_name_from"] = "hlo"


def _flag(value: Any) -> bool | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value)


def _split_top(op_name: str) -> list[str]:
    """``op_name`` split at the ``/`` outside parentheses."""
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
    parts = _split_top(op_name or "")
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


def is_matmul_or_conv(op_name: str) -> bool:
    """Whether an op name's last component is a matmul or convolution (TensorFlow or JAX).

    >>> is_matmul_or_conv("jit(train_step)/jvp(conv2d)/conv_general_dilated")
    True
    >>> is_matmul_or_conv("sequential/dense/MatMul_1")
    True
    >>> is_matmul_or_conv("jit(train_step)/jvp(conv2d)/add")
    False
    """
    last = _split_top(op_name or "")[-1]
    return bool(_MATMUL_CONV_OP.match(last))


def _layer_resolver(model: Any) -> tuple[LayerInfo | None, dict[str, LayerInfo], set[str]]:
    """(root, name -> LayerInfo for unique names, all names) of ``model``."""
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
    root, by_name, names = _layer_resolver(model)
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


def classify_kernels(kernels: pd.DataFrame, model: Any = None) -> pd.DataFrame:
    """A :func:`kernel_table` with the classification and the layer join added.

    Added columns: ``precision, tensor_core, pattern, kind, evidence, precision_from`` (from
    :func:`mpwatch.kernels.classify`, xprof's flag included), ``is_16bit`` (float16 or bfloat16;
    never for an unknown precision), ``eligible`` (xprof marks the op TensorCore-eligible, or its
    name is a matmul/convolution), ``eligible_not_tensor_core`` (eligible, and the kernel is a
    float32 or CUDA-core matmul/convolution kernel: ``tensor_core == "no"`` and precision float32
    or kind gemm/conv), ``layer, path, direction``.
    """
    df = kernels.copy()
    flags = df["xprof_tensor_core"] if "xprof_tensor_core" in df else [None] * len(df)
    classes = [classify(k, f, o) for k, f, o in zip(df["kernel_name"], flags, df["op_name"])]
    df["precision"] = [c.precision for c in classes]
    df["tensor_core"] = [c.tensor_core for c in classes]
    df["pattern"] = [c.pattern for c in classes]
    df["kind"] = [c.kind for c in classes]
    df["evidence"] = [c.evidence for c in classes]
    df["precision_from"] = [c.precision_from for c in classes]
    df["is_16bit"] = df["precision"].isin(SIXTEEN_BIT_PRECISIONS)
    xprof_eligible = (
        df["xprof_tensor_core_eligible"].map(lambda v: _flag(v) is True)
        if "xprof_tensor_core_eligible" in df
        else pd.Series(False, index=df.index)
    )
    df["eligible"] = xprof_eligible | df["op_name"].map(is_matmul_or_conv)
    df["eligible_not_tensor_core"] = (
        df["eligible"]
        & df["tensor_core"].eq("no")
        & (df["precision"].eq("float32") | df["kind"].isin(["gemm", "conv"]))
    )
    owners = attribute_kernels(df["op_name"], model)
    df["layer"] = df["op_name"].map(lambda n: owners[str(n)][0])
    df["path"] = df["op_name"].map(lambda n: owners[str(n)][1])
    df["direction"] = df["op_name"].map(lambda n: owners[str(n)][2])
    return df


def _share(part: float, total: float) -> float:
    return part / total if total > 0 else float("nan")


def _time_block(df: pd.DataFrame) -> dict[str, float]:
    """Time sums of a group of classified kernels (the per-layer and run columns)."""
    t = df["total_duration_us"]
    tc_yes = df["tensor_core"].eq("yes")
    out = {"time_us": float(t.sum())}
    out["forward_us"] = float(t[df["direction"].eq("forward")].sum())
    out["backward_us"] = float(t[df["direction"].eq("backward")].sum())
    for p in PRECISIONS:
        out[f"{p}_us"] = float(t[df["precision"].eq(p)].sum())
    out["tensor_core_us"] = float(t[tc_yes].sum())
    out["tensor_core_unknown_us"] = float(t[df["tensor_core"].eq("unknown")].sum())
    out["xprof_tensor_core_us"] = float(
        t[df["xprof_tensor_core"].map(lambda v: _flag(v) is True)].sum()
    )
    out["eligible_us"] = float(t[df["eligible"]].sum())
    out["eligible_not_tensor_core_us"] = float(t[df["eligible_not_tensor_core"]].sum())
    out["eligible_tensor_core_unknown_us"] = float(
        t[df["eligible"] & df["tensor_core"].eq("unknown")].sum()
    )
    return out


#: columns of :attr:`KernelProfile.layers` (the record's ``kernel_layers`` table)
LAYER_KERNEL_COLUMNS = list(contract.PROFILE_KERNEL_LAYER_COLUMNS)
#: columns of the record's ``kernels`` table (the classified kernels, longest first)
RECORD_KERNEL_COLUMNS = list(contract.PROFILE_KERNEL_COLUMNS)

KERNEL_RULES = (
    "precision and tensor_core from the kernel name (mpwatch.kernels; unknown when the name says "
    "nothing); xprof's 'uses TensorCore' True counts as yes, False overrides nothing; eligible = "
    "xprof's 'Op is TensorCore eligible' or a matmul/convolution op name; "
    "eligible_not_tensor_core = eligible kernels that are float32 or CUDA-core "
    "matmul/convolution kernels; op names xprof lacks (XlaModule) from the trace's HLO metadata"
)


@dataclass
class KernelProfile:
    """GPU kernels classified and joined to layers: ``kernels``, ``layers``, ``summary``.

    ``kernels``: :func:`classify_kernels`' table. ``layers``: one row per layer that got device
    time (:data:`LAYER_KERNEL_COLUMNS`: time forward/backward, by precision, on Tensor Cores by
    mpwatch's reading and by xprof's flag, eligible-but-not-Tensor-Core time, the layer's Tensor
    Core dimensions where known). ``summary``: the run totals and shares (see :func:`kernel_time`).
    :meth:`record_fields`: the keys it adds to the ``profile`` record.
    """

    kernels: pd.DataFrame
    layers: pd.DataFrame
    summary: dict[str, Any]

    @property
    def total_us(self) -> float:
        return float(self.summary.get("total_us", 0.0))

    def kernel_rows(self) -> pd.DataFrame:
        """The kernels as the record keeps them (:data:`RECORD_KERNEL_COLUMNS`), longest first."""
        k = self.kernels.sort_values("total_duration_us", ascending=False, kind="stable")
        out = pd.DataFrame(index=k.index)
        for col in RECORD_KERNEL_COLUMNS:
            out[col] = k[col] if col in k.columns else None
        return out.reset_index(drop=True)

    def record_fields(self) -> dict[str, Any]:
        """The ``profile`` record's kernel keys: ``kernel_summary`` (the run's figures),
        ``kernel_layers`` (per layer), ``kernels`` (every kernel, longest first),
        ``kernels_dropped`` (0 here; :func:`summarize` trims a record over the size limit),
        ``kernel_tool``, ``kernel_rules``, ``precisions``."""
        return {
            "kernel_summary": contract.json_safe(self.summary, nonfinite="keep"),
            "kernel_layers": _split(self.layers[LAYER_KERNEL_COLUMNS]),
            "kernels": _split(self.kernel_rows()),
            "kernels_dropped": 0,
            "kernel_tool": KERNEL_TOOL,
            "kernel_rules": KERNEL_RULES,
            "precisions": list(PRECISIONS),
        }

    def payload(self, steps: Sequence[int] | None = None, trace_dir: str = "") -> dict[str, Any]:
        """:meth:`record_fields` with ``steps``, ``trace_dir`` and ``device``, trimmed to stay under
        the record size limit (longest kernels kept; ``kernels_dropped`` says how many went)."""
        payload: dict[str, Any] = {
            "steps": [int(s) for s in steps] if steps else None,
            "device": "GPU",
            "trace_dir": trace_dir,
            "source": "device_kernels",
            **self.record_fields(),
        }
        _trim_kernels(payload, self)
        return payload


def _dims_row(dims: Mapping[str, Mapping[str, int]] | None, path: str, layer: str) -> Any:
    """``(tc_dims, tc_aligned)`` of a layer from ``dims`` (by path, else by name)."""
    if not dims:
        return None, None
    got = dims.get(path) if path in dims else dims.get(layer)
    if not got:
        return None, None
    clean = {str(k): int(v) for k, v in got.items()}
    return clean, all(v % 8 == 0 for v in clean.values())


def kernel_time(
    kernels: pd.DataFrame,
    model: Any = None,
    dims: Mapping[str, Mapping[str, int]] | None = None,
) -> KernelProfile:
    """Classify a :func:`kernel_table` and sum its device time per layer and for the run.

    ``model``: a Keras model, a :class:`LayerInfo` tree, an iterable of layer names, or None (JAX
    scopes are then taken as they are; TensorFlow kernels stay unattributed). ``dims``: layer path
    or name -> the dimensions that decide its Tensor Core use (``{"filters": 30, ...}``, as the
    layers record's ``tc_dims``), for the ``tc_dims``/``tc_aligned`` columns (None where unknown).

    ``summary`` keys: ``total_us``, ``kernels`` (rows), ``by_precision_us`` and
    ``by_precision_share`` (every value of :data:`mpwatch.kernels.PRECISIONS`),
    ``tensor_core_by_precision_us``, ``share_16bit`` (float16 + bfloat16; unknown never counts),
    ``unknown_share`` (precision unknown), ``tensor_core_share`` (mpwatch's reading),
    ``tensor_core_unknown_share``, ``xprof_tensor_core_share`` (xprof's "Kernel uses TensorCore"),
    ``tensor_core_missed_by_xprof_share`` (mpwatch yes, xprof no: why the two differ),
    ``xprof_eligible_share``, ``eligible_share``, ``eligible_not_tensor_core_us`` and ``_share``,
    ``eligible_tensor_core_unknown_us``, ``attributed_us``, ``unattributed_us``, ``forward_us``,
    ``backward_us``, ``direction_unknown_us``, ``op_name_from_hlo_us`` (time of kernels whose op
    name came from the HLO metadata), ``unknown_kernels`` (names of the longest kernels no pattern
    knows, up to 10).
    """
    df = classify_kernels(kernels, model)
    root, by_name, _ = _layer_resolver(model)
    total = float(df["total_duration_us"].sum())
    t = df["total_duration_us"]

    rows = []
    owned = df[df["layer"].notna()]
    info_by_path = {i.path: i for i in iter_layers(root)} if root is not None else {}
    for layer, group in owned.groupby("layer", sort=False):
        block = _time_block(group)
        path = str(group["path"].iloc[0])
        info = info_by_path.get(path) or by_name.get(str(layer))
        path = info.path if info is not None else path
        tc_dims, tc_aligned = _dims_row(dims, path, str(layer))
        rows.append(
            {
                "layer": str(layer),
                **block,
                "share": _share(block["time_us"], total),
                "tensor_core_share": _share(block["tensor_core_us"], block["time_us"]),
                "kernels": int(len(group)),
                "path": path,
                "class": info.cls if info is not None else "",
                "compute_dtype": info.compute_dtype if info is not None else "",
                "tc_dims": tc_dims,
                "tc_aligned": tc_aligned,
            }
        )
    layers = pd.DataFrame(rows, columns=LAYER_KERNEL_COLUMNS)
    layers = layers.sort_values("time_us", ascending=False, kind="stable").reset_index(drop=True)

    run = _time_block(df)
    xprof_yes = df["xprof_tensor_core"].map(lambda v: _flag(v) is True)
    xprof_eligible = df["xprof_tensor_core_eligible"].map(lambda v: _flag(v) is True)
    no_pattern = df[df["pattern"].eq("")].sort_values("total_duration_us", ascending=False)
    summary: dict[str, Any] = {
        "total_us": total,
        "kernels": int(len(df)),
        "by_precision_us": {p: run[f"{p}_us"] for p in PRECISIONS},
        "by_precision_share": {p: _share(run[f"{p}_us"], total) for p in PRECISIONS},
        "tensor_core_by_precision_us": {
            p: float(t[df["tensor_core"].eq("yes") & df["precision"].eq(p)].sum())
            for p in PRECISIONS
        },
        "share_16bit": _share(float(t[df["is_16bit"]].sum()), total),
        "unknown_share": _share(run["unknown_us"], total),
        "tensor_core_us": run["tensor_core_us"],
        "tensor_core_share": _share(run["tensor_core_us"], total),
        "tensor_core_unknown_share": _share(run["tensor_core_unknown_us"], total),
        "xprof_tensor_core_us": run["xprof_tensor_core_us"],
        "xprof_tensor_core_share": _share(run["xprof_tensor_core_us"], total),
        "tensor_core_missed_by_xprof_share": _share(
            float(t[df["tensor_core"].eq("yes") & ~xprof_yes].sum()), total
        ),
        "xprof_eligible_share": _share(float(t[xprof_eligible].sum()), total),
        "eligible_us": run["eligible_us"],
        "eligible_share": _share(run["eligible_us"], total),
        "eligible_not_tensor_core_us": run["eligible_not_tensor_core_us"],
        "eligible_not_tensor_core_share": _share(run["eligible_not_tensor_core_us"], total),
        "eligible_tensor_core_unknown_us": run["eligible_tensor_core_unknown_us"],
        "attributed_us": float(t[df["layer"].notna()].sum()),
        "unattributed_us": float(t[df["layer"].isna()].sum()),
        "forward_us": run["forward_us"],
        "backward_us": run["backward_us"],
        "direction_unknown_us": float(t[df["direction"].eq("unknown")].sum()),
        "op_name_from_hlo_us": float(t[df["op_name_from"].eq("hlo")].sum())
        if "op_name_from" in df
        else 0.0,
        "unknown_kernels": [str(n) for n in no_pattern["kernel_name"].head(10)],
    }
    return KernelProfile(kernels=df, layers=layers, summary=summary)


def summarize_kernels(
    trace: str | os.PathLike,
    model: Any = None,
    steps: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Trace (file, run directory or logdir) [+ model] → the GPU kernel payload (see
    :meth:`KernelProfile.payload`)."""
    traces = find_traces(trace)
    result = kernel_time(kernel_table(traces), model)
    return result.payload(steps=steps, trace_dir=os.path.dirname(traces[0]))
