"""What the layer table says of the model's graph, for fixes that fit the model.

From the layers record's graph columns (``contract.LAYERS_GRAPH_COLUMNS``: a layer's real inbound
layers, its activation, its output width; absent in records written before issue 24, where each
helper says what it falls back to):

- :func:`inputs_of`: the layers feeding a layer (a name the table lacks is a model input);
- :func:`output_fix`: the fix, as code, that makes a 16-bit model output float32, from the
  layer's real class, activation and units (a sigmoid output gets a sigmoid, a linear one none);
- :func:`task_fixed`: the layers whose width the task fixes (it is the model output's width: the
  number of classes or targets; or it is added to a model input: the data's feature count);
- :func:`id_inputs`: the model inputs that carry integer ids (they stay int32, never float16).

Example:
    >>> act_code("sigmoid"), act_code("my_gelu")
    ('"sigmoid"', 'my_gelu')
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mpwatch.judge.rule import layer_constructor, layer_row
from mpwatch.read.run import Run

#: Keras' own activations, by the name ``keras.activations.get`` takes
KERAS_ACTIVATIONS = frozenset(
    "celu elu exponential gelu glu hard_shrink hard_sigmoid hard_silu hard_swish hard_tanh "
    "leaky_relu linear log_sigmoid log_softmax mish relu relu6 selu sigmoid silu soft_shrink "
    "softmax softplus softsign sparse_plus sparse_sigmoid sparsemax squareplus swish tanh "
    "tanh_shrink threshold".split()
)
#: layer classes that apply their ``activation`` argument last, after their matmul/convolution
ACTIVATION_LAST = ("Dense", "EinsumDense")
#: the tc_dims that set a layer's output width (the argument a fix would change)
WIDTH_DIMS = ("units", "filters", "output_dim")
#: classes that pass their input's width on unchanged (for records without the graph columns)
PASS_THROUGH = ("Activation", "Softmax", "Dropout", "GaussianNoise", "GaussianDropout",
                "AlphaDropout", "ReLU", "LeakyReLU", "ELU", "PReLU", "LayerNormalization",
                "BatchNormalization", "UnitNormalization", "RMSNormalization")  # fmt: skip
#: element-wise merges: every input has the output's width
MERGES = ("Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum")
#: layers that take integer ids (the vocabulary is the data's, the ids stay integers)
ID_LAYERS = ("Embedding", "IntegerLookup", "StringLookup", "CategoryEncoding", "Hashing")
#: a nested model's row (its width is its output layer's)
MODEL_CLASSES = ("Sequential", "Functional", "Model")


def act_code(act: str) -> str:
    """An activation as code: Keras' own by its quoted name, the user's function by its name."""
    return f'"{act}"' if act in KERAS_ACTIVATIONS else act


def _known(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and value != value)


def inputs_of(run: Run, name: str) -> list[str] | None:
    """The names of the layers feeding layer ``name`` (Keras' graph, recorded); None where the
    record does not say (an older record, a subclassed model)."""
    row = layer_row(run, name) or {}
    got = row.get("inputs")
    return [str(n) for n in got] if isinstance(got, (list, tuple)) else None


def is_conv(cls: str) -> bool:
    """A convolution class (its activation argument is applied last, like Dense's)."""
    return "Conv" in cls and not cls.startswith("ConvLSTM")


def _width_arg(row: Mapping[str, Any]) -> int | None:
    dims = row.get("tc_dims") if isinstance(row.get("tc_dims"), Mapping) else {}
    for k in ("units", "filters"):
        if isinstance(dims.get(k), (int, float)):
            return int(dims[k])
    w = row.get("output_width")
    return int(w) if _known(w) and str(row.get("class")) == "Dense" else None


def output_fix(run: Run, row: Mapping[str, Any], tail: bool = True) -> str:
    """The fix, as the user's code, that makes the model output ``row`` (a layer-table row)
    float32: the layer itself with ``dtype="float32"`` (its units and activation as recorded);
    for a Dense or convolution with a non-linear activation, also the layer with
    ``activation=None`` and that activation as a float32 ``Activation`` after it, named as the
    output was (never an activation the model did not have: a linear output gets none)."""
    name = str(row.get("name"))
    cls = str(row.get("class") or "Layer")
    ctor = layer_constructor(run, cls)
    act = row.get("activation") if _known(row.get("activation")) else None
    lines: list[str] = []
    if cls == "Activation":
        lines.append(
            f'{ctor}({act_code(str(act))}, dtype="float32", name="{name}")'
            if act
            else f'{ctor}(..., dtype="float32", name="{name}")  # its activation, in float32'
        )
    elif cls == "Softmax":
        lines.append(f'{ctor}(..., dtype="float32", name="{name}")')
    elif cls in ACTIVATION_LAST or is_conv(cls):
        width = _width_arg(row)
        head = f"{width}, ..." if width is not None else "..."
        kw = f", activation={act_code(str(act))}" if act and act != "linear" else ""
        note = "  # a linear output: the layer itself in float32" if act == "linear" else ""
        lines.append(f'{ctor}({head}{kw}, dtype="float32", name="{name}"){note}')
        if act and act != "linear":
            lines += [
                f"# or keep its {'matmul' if cls in ACTIVATION_LAST else 'convolution'} in 16 "
                f"bits and apply {act} in float32:",
                f'x = {ctor}({head}, activation=None, name="{name}_logits")(x)',
                f'outputs = keras.layers.Activation({act_code(str(act))}, dtype="float32", '
                f'name="{name}")(x)',
            ]
        elif act is None:  # an older record: the activation is not known
            lines.append(
                "# or, where it applies an activation: the layer with activation=None, then that "
                'activation as keras.layers.Activation(<its activation>, dtype="float32")'
            )
    else:
        lines.append(f'{ctor}(..., dtype="float32", name="{name}")')
    if ctor == cls:
        lines.append(f"# {cls} is your class: its __init__ must pass **kwargs (dtype) to Layer")
    if tail:  # (a fix of several layers gives it once, after them all)
        lines += APPLY_TAIL
    return "\n".join(lines)


def _width_dims(row: Mapping[str, Any]) -> dict[str, int]:
    dims = row.get("tc_dims") if isinstance(row.get("tc_dims"), Mapping) else {}
    return {k: int(v) for k, v in dims.items() if k in WIDTH_DIMS and isinstance(v, (int, float))}


def _rows(run: Run) -> list[dict[str, Any]]:
    lt = run.layers
    if not len(lt) or "name" not in lt:
        return []
    return lt.to_dict("records")


def task_fixed(run: Run) -> dict[str, str]:
    """Layer name -> why its width (units, filters, output_dim) is not the user's to change: it is
    the width of a model output (the number of classes or targets), reached through layers that
    keep the width (an Activation, a Dropout, a normalization, an element-wise merge); or it is
    merged element-wise with a model input (the data's feature count). Without the graph columns
    (older records): the layers before an output in table order, through :data:`PASS_THROUGH`
    classes only."""
    rows = _rows(run)
    if not rows:
        return {}
    by_name = {str(r["name"]): r for r in reversed(rows)}
    graph = "inputs" in run.layers
    fixed: dict[str, str] = {}

    def visit(name: str, width: int | None, why: str, seen: set[str]) -> None:
        r = by_name.get(name)
        if r is None or name in seen:
            return
        seen.add(name)
        w = r.get("output_width")
        if _known(w) and width is not None and int(w) != width:
            return  # another width: not tied to this one
        if _width_dims(r):
            fixed.setdefault(name, why)
            return
        cls = str(r.get("class"))
        if cls in MODEL_CLASSES or isinstance(r.get("tc_dims"), Mapping) and r["tc_dims"]:
            return
        ins = r.get("inputs") if graph else None
        if isinstance(ins, (list, tuple)):
            for n in ins:
                visit(str(n), width, why, seen)
        elif not graph and cls in PASS_THROUGH:
            i = rows.index(r)
            if i > 0:
                visit(str(rows[i - 1]["name"]), width, why, seen)

    outs = [r for r in rows if bool(r.get("is_output"))] or rows[-1:]
    for r in outs:
        w = r.get("output_width")
        width = int(w) if _known(w) else (next(iter(_width_dims(r).values()), None))
        why = (f"the width of the model's output {str(r['name'])!r}"
               + (f" ({width})" if width is not None else "")
               + ": the number of classes or targets, fixed by the task")  # fmt: skip
        visit(str(r["name"]), width, why, set())
    if graph:
        for r in rows:
            ins = r.get("inputs")
            if str(r.get("class")) not in MERGES or not isinstance(ins, (list, tuple)):
                continue
            given = [str(n) for n in ins if str(n) not in by_name]
            if not given:
                continue
            w = r.get("output_width")
            why = (f"merged with the model input {given[0]!r} in {str(r['name'])!r}: the data's "
                   "feature count, fixed by the data")  # fmt: skip
            for n in ins:
                visit(str(n), int(w) if _known(w) else None, why, {str(r["name"])})
    return fixed


def id_inputs(run: Run) -> list[str]:
    """The model inputs that carry integer ids: fed to an :data:`ID_LAYERS` layer (an Embedding)
    straight from the model's input (graph columns), or found integer-valued by the probe; an
    older record with an Embedding but no graph: ``["ids"]``."""
    found: list[str] = []
    rows = _rows(run)
    names = {str(r["name"]) for r in rows}
    graph = "inputs" in run.layers if rows else False
    for r in rows:
        if str(r.get("class")) not in ID_LAYERS:
            continue
        ins = r.get("inputs") if graph else None
        if isinstance(ins, (list, tuple)):
            found += [str(n) for n in ins if str(n) not in names and str(n) not in found]
        elif not graph and not found:
            found.append("ids")
    probe = run.latest_probe()
    table = getattr(probe, "inputs", None)
    if table is not None and len(table) and "integer_valued" in table:
        for r in table.to_dict("records"):
            n = str(r.get("input"))
            if r.get("integer_valued") and n not in found:
                found.append(n)
    return found


#: the last lines of a fix: the same advice without editing the model code
APPLY_TAIL = ["# or, without editing the model code:",
              "model = mpwatch.apply_recommendations(model, findings).model"]  # fmt: skip

#: the fix for raw features: a Normalization first in the model, in float32 (in float16 Keras
#: casts its variance of raw features to inf once, and it gives 0 for them)
NORMALIZE_FIX = (
    'norm = keras.layers.Normalization(dtype="float32")  # float32: in float16 its variance '
    "of raw features is inf\n"
    "norm.adapt(x_train)               # the training features, once\n"
    "x = norm(inputs)                  # first thing the model does with them"
)

#: layers that bring raw features into range (kept float32, they take the raw values)
NORMALIZING = ("Normalization", "Rescaling", "BatchNormalization", "LayerNormalization",
               "GroupNormalization", "UnitNormalization")  # fmt: skip


def input_layers(run: Run) -> list[dict[str, Any]] | None:
    """The layers that take a model input straight from the data (their recorded inputs name a
    layer the table lacks: a model's ``InputLayer``); None where the record does not say (no
    graph columns, a subclassed model)."""
    rows = _rows(run)
    if not rows or "inputs" not in run.layers:
        return None
    names = {str(r["name"]) for r in rows}
    out = [
        r
        for r in rows
        if isinstance(r.get("inputs"), (list, tuple))
        and any(str(n) not in names for n in r["inputs"])
    ]
    return out or None
