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

Example (needs TensorFlow and xprof):
    >>> from mpwatch import profile  # doctest: +SKIP
    >>> ops = profile.op_table("logs/run1")  # doctest: +SKIP
    >>> result = profile.layer_time(ops, model)  # doctest: +SKIP
    >>> result.layers.sort_values("time_us", ascending=False).head()  # doctest: +SKIP
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from mpwatch.formats import FLOAT32_INSIDE, is_16bit
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

CAST_OPS = frozenset({"Cast"})
# Op types that never compute in the layer's dtype: variables are float32, input pipeline is host
# code.
ALWAYS_32BIT_OPS = frozenset(
    {
        "Cast",
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
    """Why a trace is no XSpace at all (None when it parses, or when that cannot be checked)."""
    try:
        from google.protobuf.message import DecodeError
        from tensorflow.tsl.profiler.protobuf import xplane_pb2
    except ImportError:
        return None
    for path in traces:
        space = xplane_pb2.XSpace()
        try:
            with open(path, "rb") as f:
                space.ParseFromString(f.read())
        except (DecodeError, OSError) as e:
            return f"{path} is not a readable profiler trace (XSpace): {e}"
        if not space.planes:
            return f"{path} is not a profiler trace: it holds no planes"
    return None


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
        from mpwatch import contract

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
    """Join an :func:`op_table` to a model's layers.

    ``model`` is a Keras model or a :class:`LayerInfo` tree from :func:`describe_model`.
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
    root = model if isinstance(model, LayerInfo) else describe_model(model)
    if dtype_overrides:
        for info in iter_layers(root):
            if info.path in dtype_overrides:
                info.compute_dtype = str(dtype_overrides[info.path])
                info.dtype_given = True
    ops = ops.copy()
    owner = attribute_ops(ops["op_name"], root)
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
        columns=[
            "layer",
            "time_us",
            "time_16bit_us",
            "time_32bit_us",
            "ops",
            "share",
            "cast_us",
            "path",
            "class",
            "compute_dtype",
            "bits",
            "trainable_params",
        ],
    )
    grouped = ops.groupby(["op_type", "bits"], sort=False)
    op_types = grouped.agg(
        time_us=("self_time_us", "sum"), count=("occurrences", "sum"), ops=("op_name", "size")
    ).reset_index()
    op_types["kept_float32_by_amp"] = op_types["op_type"].isin(AMP_FLOAT32_OPS)
    op_types["share"] = op_types["time_us"] / total if total > 0 else float("nan")
    op_types = op_types[
        ["op_type", "time_us", "bits", "count", "kept_float32_by_amp", "ops", "share"]
    ]
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


def summarize(
    trace: str | os.PathLike,
    model: Any,
    steps: Sequence[int] | None = None,
    dtype_overrides: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Trace (file, run directory or logdir) + model → the ``profile`` record payload."""
    traces = find_traces(trace)
    result = layer_time(op_table(traces), model, dtype_overrides)
    return result.payload(steps=steps, trace_dir=os.path.dirname(traces[0]))
