"""GPU kernels → device time per layer and for the run, by precision and Tensor Core use.

:func:`kernel_time` takes a :func:`~mpwatch.profile.traces.kernel_table` (xprof's ``kernel_stats``:
one row per GPU kernel), classifies each kernel by its name (:mod:`mpwatch.profile.kernel_classes`:
precision and Tensor Core use; xprof's own "Kernel uses TensorCore" misses most Ampere/Hopper
kernel names), joins it to a layer through its op name
(:func:`mpwatch.profile.attribution.attribute_kernels`: TensorFlow scopes, JAX scopes, forward or
backward) and sums the time per layer and for the run. :class:`KernelProfile` holds the result;
:meth:`KernelProfile.record_fields` are the keys it adds to the ``profile`` record (its kernel
part).

Example (needs xprof and a GPU trace):
    >>> from mpwatch import profile  # doctest: +SKIP
    >>> gpu = profile.kernel_time(profile.kernel_table("logs/run1"), model)  # doctest: +SKIP
    >>> gpu.summary["tensor_core_share"], gpu.summary["xprof_tensor_core_share"]  # doctest: +SKIP
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from mpwatch import contract
from mpwatch.profile.attribution import iter_layers, layer_resolver, split_op_name
from mpwatch.profile.kernel_classes import classify
from mpwatch.profile.kernel_patterns import PRECISIONS, SIXTEEN_BIT_PRECISIONS
from mpwatch.profile.kernel_truth import kernel_owners, merge_hlo
from mpwatch.profile.step_parts import PARTS
from mpwatch.profile.traces import KERNEL_TOOL, xprof_flag

# Op names of matrix multiplications and convolutions (the last op name component): TensorFlow op
# types (node names repeat them, maybe with _N) and JAX primitives. Tensor Cores can run these.
_MATMUL_CONV_OP = re.compile(
    r"^(?:Conv[123]D\w*|DepthwiseConv2dNative\w*|MatMul\w*|BatchMatMul\w*|Einsum\w*|XlaDot\w*|"
    r"XlaConv\w*|_FusedConv2D|_FusedMatMul|conv_general_dilated|dot_general|dot|ragged_dot)"
    r"(?:_\d+)?$"
)


def is_matmul_or_conv(op_name: str) -> bool:
    """Whether an op name's last component is a matmul or convolution (TensorFlow or JAX).

    >>> is_matmul_or_conv("jit(train_step)/jvp(conv2d)/conv_general_dilated")
    True
    >>> is_matmul_or_conv("sequential/dense/MatMul_1")
    True
    >>> is_matmul_or_conv("jit(train_step)/jvp(conv2d)/add")
    False
    """
    last = split_op_name(op_name or "")[-1]
    return bool(_MATMUL_CONV_OP.match(last))


#: the prefixes TensorFlow's rewrites put before an op type (oneDNN's ``_Mkl``/``Native``, the
#: fused ops' ``_Fused``)
_OP_TYPE_PREFIX = re.compile(r"^_?(?:Mkl)?(?:Native)?(?:Fused)?")


def is_math_op_type(op_type: str) -> bool:
    """Whether an op type (not a name) is a matmul or a convolution, TensorFlow's (oneDNN's and
    fused ones too), XLA's (``convolution``, ``dot``) or JAX's: :func:`is_matmul_or_conv`'s
    names, after the rewrites' prefixes.

    >>> [is_math_op_type(t) for t in ("Conv2DBackpropFilter", "_FusedMatMul", "dot", "Cast",
    ...                               "_MklNativeFusedConv2D", "_MklMatMul")]
    [True, True, True, False, True, True]
    """
    base = _OP_TYPE_PREFIX.sub("", op_type or "")
    return base == "convolution" or bool(_MATMUL_CONV_OP.match(base))


def classify_kernels(kernels: pd.DataFrame, model: Any = None) -> pd.DataFrame:
    """A :func:`~mpwatch.profile.traces.kernel_table` with the classification and the layer join.

    Added columns: ``precision, tensor_core, pattern, kind, evidence, precision_from`` (from
    :func:`mpwatch.profile.kernel_classes.classify`, xprof's flag included), ``is_16bit`` (float16
    or bfloat16; never for an unknown precision), ``eligible`` (xprof marks the op
    TensorCore-eligible, or its name is a matmul/convolution), ``eligible_not_tensor_core``
    (eligible, and the kernel is a float32 or CUDA-core matmul/convolution kernel:
    ``tensor_core == "no"`` and precision float32 or kind gemm/conv), ``layer, path, direction``.
    Where the table has the ``hlo_*`` columns (:func:`mpwatch.profile.hlo_kernels.hlo_columns`)
    the HLO decides precision and Tensor Core use (:func:`mpwatch.profile.kernel_truth.merge_hlo`:
    ``precision_source``, ``name_precision``, ``precision_disagrees``, ``tensor_core_why``,
    ``is_cast``) and the owner (:func:`mpwatch.profile.kernel_truth.kernel_owners`: ``part``, the
    named part of the step of a kernel outside every layer).
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
        df["xprof_tensor_core_eligible"].map(lambda v: xprof_flag(v) is True)
        if "xprof_tensor_core_eligible" in df
        else pd.Series(False, index=df.index)
    )
    df["eligible"] = xprof_eligible | df["op_name"].map(is_matmul_or_conv)
    df["eligible_not_tensor_core"] = (
        df["eligible"]
        & df["tensor_core"].eq("no")
        & (df["precision"].eq("float32") | df["kind"].isin(["gemm", "conv"]))
    )
    df = merge_hlo(df)
    df["is_16bit"] = df["precision"].isin(SIXTEEN_BIT_PRECISIONS)
    hlo_math = df["hlo_math"] if "hlo_math" in df else pd.Series("", index=df.index)
    df["eligible"] = df["eligible"] | hlo_math.fillna("").astype(str).ne("")
    df["eligible_not_tensor_core"] = (
        df["eligible"]
        & df["tensor_core"].eq("no")
        & (df["precision"].isin(["float32", "tf32"]) | df["kind"].isin(["gemm", "conv"]))
        & ~df["tensor_core_why"].astype(str).str.startswith("helper kernel")
    )
    return kernel_owners(df, model)


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
        t[df["xprof_tensor_core"].map(lambda v: xprof_flag(v) is True)].sum()
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
    "precision and tensor_core from the HLO instruction the kernel runs where the trace has it "
    "(mpwatch.profile.hlo_kernels: dot/convolution operand types and the GPU's compute "
    "capability; other work by the types it reads and writes), else from the kernel name "
    "(mpwatch.profile.kernel_classes; unknown when the name says nothing); owner: a layer or a "
    "named part of the step (mpwatch.profile.kernel_truth); xprof's 'uses TensorCore' True "
    "counts as yes, False overrides nothing; eligible = xprof's 'Op is TensorCore eligible' or a "
    "matmul/convolution op name; "
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
        ``kernels_dropped`` (0 here; :func:`mpwatch.profile.summary.summarize` trims a record over
        the size limit), ``kernel_tool``, ``kernel_rules``, ``precisions``."""
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
        trim_kernels(payload, self)
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
    """Classify a :func:`~mpwatch.profile.traces.kernel_table`, sum its time per layer and run.

    ``model``: a Keras model, a :class:`LayerInfo` tree, an iterable of layer names, or None (JAX
    scopes are then taken as they are; TensorFlow kernels stay unattributed). ``dims``: layer path
    or name -> the dimensions that decide its Tensor Core use (``{"filters": 30, ...}``, as the
    layers record's ``tc_dims``), for the ``tc_dims``/``tc_aligned`` columns (None where unknown).

    ``summary`` keys: ``total_us``, ``kernels`` (rows), ``by_precision_us`` and
    ``by_precision_share`` (every value of :data:`mpwatch.profile.kernel_patterns.PRECISIONS`),
    ``tensor_core_by_precision_us``, ``share_16bit`` (float16 + bfloat16; unknown never counts),
    ``unknown_share`` (precision unknown), ``tensor_core_share`` (mpwatch's reading),
    ``tensor_core_unknown_share``, ``xprof_tensor_core_share`` (xprof's "Kernel uses TensorCore"),
    ``tensor_core_missed_by_xprof_share`` (mpwatch yes, xprof no: why the two differ),
    ``xprof_eligible_share``, ``eligible_share``, ``eligible_not_tensor_core_us`` and ``_share``,
    ``eligible_tensor_core_unknown_us``, ``attributed_us`` (in layers), ``part_us`` and
    ``by_part_us`` (outside every layer, in a named part of the step:
    :data:`mpwatch.profile.step_parts.PARTS`), ``unattributed_us`` (no owner at all),
    ``owned_us``/``owned_share`` (a layer's or a part's), ``unowned_ops`` (the time without owner,
    by op, up to 10), ``forward_us``, ``backward_us``, ``direction_unknown_us``,
    ``op_name_from_hlo_us`` (time of kernels whose op name came from the HLO metadata),
    ``unknown_kernels`` (names of the longest kernels no pattern knows, up to 10),
    ``precision_from_hlo_share``/``precision_from_name_share``, ``precision_disagreements`` (name
    and HLO disagree, up to 10), ``cast_us``/``cast_share`` (kernels that only cast),
    ``compute_capability`` (``"9.0"``; ``""`` unknown) and ``compute_capability_from``.
    """
    df = classify_kernels(kernels, model)
    root, by_name, _ = layer_resolver(model)
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
    xprof_yes = df["xprof_tensor_core"].map(lambda v: xprof_flag(v) is True)
    xprof_eligible = df["xprof_tensor_core_eligible"].map(lambda v: xprof_flag(v) is True)
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
        "unattributed_us": float(t[df["layer"].isna() & df["part"].isna()].sum()),
        **_owner_summary(df, total),
        "forward_us": run["forward_us"],
        "backward_us": run["backward_us"],
        "direction_unknown_us": float(t[df["direction"].eq("unknown")].sum()),
        "op_name_from_hlo_us": float(t[df["op_name_from"].eq("hlo")].sum())
        if "op_name_from" in df
        else 0.0,
        "unknown_kernels": [str(n) for n in no_pattern["kernel_name"].head(10)],
        **_hlo_summary(df, total, kernels.attrs),
    }
    return KernelProfile(kernels=df, layers=layers, summary=summary)


def _owner_summary(df: pd.DataFrame, total: float) -> dict[str, Any]:
    """Who owns the device time: layers, the named parts of the step, nobody (listed by op)."""
    t = df["total_duration_us"]
    in_part = df["layer"].isna() & df["part"].notna()
    nobody = df[df["layer"].isna() & df["part"].isna()]
    by_op: dict[str, float] = {}
    for o, k, us in zip(nobody["op_name"], nobody["kernel_name"], nobody["total_duration_us"]):
        key = str(o) if str(o) not in ("", "XlaModule", "XlaModule:") else f"kernel {k}"
        by_op[key] = by_op.get(key, 0.0) + float(us)
    longest = sorted(by_op.items(), key=lambda kv: -kv[1])[:10]
    owned = float(t[df["layer"].notna() | in_part].sum())
    return {
        "part_us": float(t[in_part].sum()),
        "by_part_us": {p: float(t[in_part & df["part"].eq(p)].sum()) for p in PARTS},
        "owned_us": owned,
        "owned_share": _share(owned, total),
        "unowned_ops": [{"op": k, "us": v} for k, v in longest],
    }


def _hlo_summary(df: pd.DataFrame, total: float, attrs: Mapping[str, Any]) -> dict[str, Any]:
    """Where precision came from (HLO or name), where the two disagree, casts, the GPU."""
    t = df["total_duration_us"]
    src = df["precision_source"]
    odd = df[df["precision_disagrees"].astype(bool)].sort_values(
        "total_duration_us", ascending=False
    )
    return {
        "precision_from_hlo_share": _share(float(t[src.eq("hlo")].sum()), total),
        "precision_from_name_share": _share(float(t[src.eq("name")].sum()), total),
        "precision_disagreements": [
            {
                "kernel": str(r["kernel_name"]),
                "name_precision": str(r["name_precision"]),
                "hlo_precision": str(r["precision"]),
                "us": float(r["total_duration_us"]),
            }
            for _, r in odd.head(10).iterrows()
        ],
        "cast_us": float(t[df["is_cast"].astype(bool)].sum()),
        "cast_share": _share(float(t[df["is_cast"].astype(bool)].sum()), total),
        "compute_capability": str(attrs.get("compute_capability", "")),
        "compute_capability_from": str(attrs.get("compute_capability_from", "")),
        **({"hlo_note": str(attrs["hlo_note"])} if attrs.get("hlo_note") else {}),
    }


def trim_kernels(payload: dict[str, Any], kernels: KernelProfile) -> None:
    """Keep the whole record under the size limit: the longest kernels stay (the summaries cover
    every kernel; ``kernels_dropped`` says how many went). ``payload``: a ``profile`` record
    payload with the kernel keys of ``kernels``."""
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
