"""Op time per layer by the precision it ran in, and the cost of casts: the op part of the record.

:func:`layer_time` joins an op table (:func:`mpwatch.profile.traces.op_table`, or
:func:`~mpwatch.profile.traces.xla_op_table` for JAX on a CPU) to the model's layers by op name
(:mod:`mpwatch.profile.attribution`) and splits each layer's time by the precision the op really
ran in; :meth:`ProfileResult.payload` is the ``profile`` record's op part.

Precision of an op (``bits``): 16 when it belongs to a layer that computes in float16 or bfloat16
(bfloat16 counts as 16-bit, unlike the overview page of TensorBoard's Profile tab), 32 otherwise.
Exceptions, by op type: ``Cast`` (a conversion, not 16-bit compute), variable reads and writes
(variables are float32 under the mixed policies) and input-pipeline ops count as 32. Normalization
layers (BatchNormalization, LayerNormalization, GroupNormalization, RMSNormalization) compute in
float32 inside under a 16-bit policy, so their ops count as 32 too. Ops outside every layer (loss,
optimizer, input pipeline, the model's input casts) are *unattributed* and count as 32.
XLA's CPU ops (an :func:`~mpwatch.profile.traces.xla_op_table` with ``hlo_precision``) instead
count as what their HLO instruction computes in: 16 where float16/bfloat16 only, else 32
(casts: 32); ``unattributed_by_category`` names the step's part an unattributed op belongs to
(:func:`owner_category`).

Time is the op's *self* time (time in the op minus time in ops nested inside it), so that rows add
up to the time of the captured steps without double counting.

Example (needs TensorFlow and xprof):
    >>> from mpwatch import profile  # doctest: +SKIP
    >>> result = profile.layer_time(profile.op_table("logs/run1"), model)  # doctest: +SKIP
    >>> result.layers.sort_values("time_us", ascending=False).head()  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from mpwatch import contract
from mpwatch.profile.attribution import (
    LayerInfo,
    attribute_any_ops,
    attribute_kernels,
    describe_model,
    iter_layers,
)
from mpwatch.profile.kernel_time import is_math_op_type
from mpwatch.profile.step_parts import step_part
from mpwatch.profile.traces import TOOL

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
        """The ``profile`` record payload (``mpwatch/contract/profile.py``)."""

        def split(df: pd.DataFrame) -> dict[str, Any]:
            return contract.table(list(df.columns), df.astype(object).values.tolist())

        unattributed = self.ops[self.ops["layer"].isna()]
        category = unattributed["op_name"].map(owner_category)
        if "part" in unattributed:  # the op table knows the part (the input pipeline)
            given = unattributed["part"].fillna("").astype(str)
            category = category.where(given == "", given)
        math = unattributed["op_type"].astype(str).map(is_math_op_type) & category.isin(
            ("gradients", "other")
        )
        category = category.where(~math, UNJOINED_MATH)
        by_category = unattributed.groupby(category)["self_time_us"].sum().to_dict()
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


UNJOINED_MATH = contract.PROFILE_UNJOINED_MATH
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


def owner_category(op_name: str) -> str:
    """The named part of the step an op outside every layer belongs to
    (:data:`mpwatch.profile.step_parts.PARTS`), else its rough :func:`op_category`."""
    return step_part(op_name) or op_category(op_name)


def _layers_by_jax_scope(op_names: Any) -> list[LayerInfo]:
    """Without a model, the layers JAX op names say (the innermost scope inside ``jvp`` or
    ``transpose``: :func:`mpwatch.profile.attribution.attribute_kernels`), dtype unknown (an
    op's precision is then its HLO's)."""
    found = attribute_kernels([str(n) for n in op_names], None)
    names = sorted({layer for layer, _, _ in found.values() if layer})
    return [LayerInfo(name=n, path=n, cls="", compute_dtype="unknown") for n in names]


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
        if ops.attrs.get("source") == "xla_host":  # XLA's CPU ops: layers by their JAX scopes
            root.children = _layers_by_jax_scope(ops["op_name"])
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
    if "hlo_precision" in ops:  # XLA on a CPU: what the op's HLO instruction computes in
        known = ops["hlo_precision"].fillna("").astype(str) != ""
        hlo_cast = ops["hlo_is_cast"].fillna(False).astype(bool)
        hlo_bits = [
            16 if p in ("float16", "bfloat16") and not c else 32
            for p, c in zip(ops["hlo_precision"], hlo_cast)
        ]
        ops.loc[known, "bits"] = pd.Series(hlo_bits, index=ops.index)[known]
        ops["is_cast"] = ops["is_cast"] | (known & hlo_cast)
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
