"""The :class:`Rule` type, and the small helpers the rules in :mod:`mpwatch.judge.rules` share.

A rule is one module of :mod:`mpwatch.judge.rules`: a module docstring in ruff's shape (the
sections of :data:`SECTIONS`, each under a ``## `` heading), ``RULE = Rule(...)`` and
``check(run) -> list[Finding]`` (or ``check_pair(mixed, fp32)`` for a rule about two runs). The
docstring is a template: ``{NAME}`` fields are filled from ``Rule.thresholds`` (the rule's
constants), so the documented thresholds are the ones the code uses.

Every helper here reads only the :class:`~mpwatch.read.run.Run`.

Example:
    >>> from mpwatch.judge.rules import output_16bit
    >>> output_16bit.RULE.id, output_16bit.RULE.severities
    ('output-16bit', ('warning', 'error'))
    >>> fmt(65504.0), fmt(1e-6), pct(0.05)
    ('65504', '1.00e-06', '5.00%')
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from mpwatch import contract, words
from mpwatch.formats import FLOAT16, SIXTEEN_BIT
from mpwatch.judge.finding import SEVERITIES, Finding
from mpwatch.read.run import ProbeResult, Run

__all__ = [
    "Rule",
    "SECTIONS",
    "PUBLIC_REFERENCES",
    "HEADROOM_WARN_BITS",
    "UNDERFLOW_WARN",
    "finite",
    "fmt",
    "pct",
    "policy",
    "compute_dtype",
    "effective_float32",
    "layer_row",
    "keep_float32_fix",
    "class_module",
    "is_keras_class",
    "layer_constructor",
    "application_of",
    "inside_application",
    "APPLICATIONS",
    "computes_float32",
    "fast_16bit",
    "Overflow",
    "probe_overflow",
    "contiguous_blocks",
    "names_list",
]

# --- shared thresholds (each is used by more than one rule) --------------------------------------
# activation-overflow warns below this headroom; try-mixed-precision lists the layers a pre-flight
# probe puts above 65504 / 2**HEADROOM_WARN_BITS as ones to keep in float32
HEADROOM_WARN_BITS = 3.0  # activations within 3 doublings of 65504 (> 8188)
# gradient-underflow warns above this model-wide underflow fraction; loss-scale calls a scale far
# below the recommended one a warning (not info) only when the underflow reaches it
UNDERFLOW_WARN = 0.01

#: the sections of a rule's docstring, in order
SECTIONS = ("What it finds", "Why it matters", "Threshold", "Example evidence", "Fix", "References")

#: the public documents rules cite: URL -> title (a rule's references use these titles and URLs)
PUBLIC_REFERENCES = {
    "https://www.tensorflow.org/guide/mixed_precision": "TensorFlow mixed precision guide",
    "https://keras.io/api/mixed_precision/": "Keras mixed precision API",
    "https://keras.io/api/optimizers/loss_scale_optimizer/": "Keras LossScaleOptimizer",
    "https://arxiv.org/abs/1710.03740": "Micikevicius et al. 2017, Mixed Precision Training",
    "https://keras.io/examples/timeseries/timeseries_weather_forecasting/": (
        "keras.io, Timeseries forecasting for weather prediction"
    ),
    "https://docs.nvidia.com/deeplearning/performance/mixed-precision-training/index.html": (
        "NVIDIA, Train With Mixed Precision"
    ),
    "https://docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication/"
    "index.html": "NVIDIA Deep Learning Performance guide, Matrix Multiplication",
    "https://www.tensorflow.org/guide/profiler": "TensorFlow Profiler guide",
    "https://github.com/openxla/xprof/blob/master/xprof/utils/kernel_stats_utils.cc": (
        "openxla/xprof, kernel_stats_utils.cc"
    ),
    "https://github.com/tensorflow/tensorflow/issues/51812": "tensorflow/tensorflow#51812",
    "https://keras.io/api/quantizers/": "Keras quantizers API",
    "https://arxiv.org/abs/2209.05433": "Micikevicius et al. 2022, FP8 Formats for Deep Learning",
    "https://www.tensorflow.org/tutorials/load_data/tfrecord": (
        "TensorFlow, TFRecord and tf.train.Example"
    ),
}

_HEADING = re.compile(r"^## (.+?)\s*$")
_URL = re.compile(r"<(https?://[^>\s]+)>")


class _Listed(tuple):
    """A tuple constant in a docstring: ``{NAME}`` renders as ``a, b, c``."""

    def __format__(self, spec: str) -> str:
        return ", ".join(format(v, spec) for v in self)


def _plain(text: str) -> str:
    """A section as one line of plain text (whitespace collapsed)."""
    return " ".join(text.split())


@dataclass(frozen=True)
class Rule:
    """One rule: its id, title, the severities it can give, and its documentation.

    Attributes:
        id: the id findings carry (``Finding.rule``); the rule's module is named after it, with
            ``_`` for ``-``.
        title: one line.
        severities: the severities its findings can have, least severe first.
        doc: the rule module's docstring (a template: ``{NAME}`` fields come from ``thresholds``).
        thresholds: the constants the rule uses, by name (rendered into ``text``; a tuple renders
            as its items joined by ``", "``).
        text: ``doc`` rendered.
        sections: ``text``'s sections by heading (see :data:`SECTIONS`).
    """

    id: str
    title: str
    severities: tuple[str, ...]
    doc: str
    thresholds: Mapping[str, Any] = field(default_factory=dict, hash=False)
    text: str = field(init=False, repr=False, hash=False, compare=False)
    sections: Mapping[str, str] = field(init=False, repr=False, hash=False, compare=False)

    def __post_init__(self) -> None:
        bad = [s for s in self.severities if s not in SEVERITIES]
        if bad or not self.severities:
            raise ValueError(f"rule {self.id!r}: severities must be among {SEVERITIES}: {bad}")
        values = {k: _Listed(v) if isinstance(v, (tuple, list)) else v
                  for k, v in self.thresholds.items()}  # fmt: skip
        text = (self.doc or "").format(**values)
        sections: dict[str, list[str]] = {"": []}
        current = ""
        for line in text.splitlines():
            m = _HEADING.match(line.strip())
            if m:
                current = m.group(1)
                sections[current] = []
            else:
                sections[current].append(line)
        rendered = {k: "\n".join(v).strip() for k, v in sections.items()}
        missing = [s for s in SECTIONS if not rendered.get(s)]
        if missing:
            raise ValueError(f"rule {self.id!r}: docstring lacks sections {missing}")
        object.__setattr__(self, "text", text)
        object.__setattr__(self, "sections", rendered)

    @property
    def summary(self) -> str:
        """The docstring's first line (``Rule `id`: ...``)."""
        return self.sections[""].partition("\n")[0].strip()

    @property
    def why(self) -> str:
        """Why it matters, as one line (what findings carry in ``Finding.why``)."""
        return _plain(self.sections["Why it matters"])

    @property
    def threshold(self) -> str:
        """The threshold, as one line, with the rule's constants filled in."""
        return _plain(self.sections["Threshold"])

    @property
    def references(self) -> list[tuple[str, str | None, str]]:
        """``(title, url or None, note)`` of each item of the References section (items are
        ``- Title: note <URL>``, the URL on the item's last line)."""
        items: list[str] = []
        for line in self.sections["References"].splitlines():
            s = line.strip()
            if s.startswith("- "):
                items.append(s[2:].strip())
            elif s and items:
                items[-1] += " " + s
        out: list[tuple[str, str | None, str]] = []
        for item in items:
            m = _URL.search(item)
            url = m.group(1) if m else None
            title, _, note = _URL.sub("", item).partition(": ")
            out.append((_plain(title).replace("`", ""), url, _plain(note)))
        return out

    @property
    def source(self) -> str:
        """The references as one line: ``title: note (url); ...`` (what ``Finding.source``
        carries)."""
        parts = []
        for title, url, note in self.references:
            s = title + (f": {note}" if note else "")
            parts.append(s + (f" ({url})" if url else ""))
        return "; ".join(parts).replace("`", "")

    def finding(self, severity: str, title: str, evidence: str, **kw: Any) -> Finding:
        """A :class:`Finding` of this rule (its ``why`` and ``source`` filled in)."""
        return Finding(
            rule=self.id, severity=severity, title=title, evidence=evidence, why=self.why,
            source=self.source, **kw,
        )  # fmt: skip


# --- formatting ----------------------------------------------------------------------------------
finite = contract.finite_float  # the one definition, in the contract


#: a number, and a fraction as a percentage, for a title or an evidence line: the one formatter
#: (:mod:`mpwatch.words`; a loss scale: ``words.loss_scale``, a duration: ``words.duration_ms``)
fmt = words.number
pct = words.percent


# --- reading the run -----------------------------------------------------------------------------
def policy(run: Run) -> str:
    """The run's global policy name (``""`` when not recorded)."""
    return str(run.info.get("policy") or "")


def compute_dtype(run: Run) -> str:
    """The run's compute dtype: from run_info, else from the policy name, else from the layer
    table (its first 16-bit compute dtype, else its first one); ``""`` when nothing says."""
    cd = run.info.get("compute_dtype")
    if cd:
        return str(cd)
    pol = policy(run)
    if pol.startswith("mixed_"):
        return pol[len("mixed_") :]
    if pol:
        return pol
    if len(run.layers) and "compute_dtype" in run.layers:
        vals = run.layers["compute_dtype"].dropna().astype(str)
        if (vals.isin(SIXTEEN_BIT)).any():
            return str(vals[vals.isin(SIXTEEN_BIT)].iloc[0])
        if len(vals):
            return str(vals.iloc[0])
    return ""


def effective_float32(run: Run) -> set[str]:
    """Layers that compute in float32 inside although their policy is 16-bit."""
    lt = run.layers
    if not len(lt) or "effective_dtype" not in lt or "name" not in lt:
        return set()
    m = (lt["effective_dtype"].astype(str) == "float32") & (
        lt.get("compute_dtype", pd.Series(index=lt.index, dtype=object))
        .astype(str)
        .isin(SIXTEEN_BIT)
    )
    return set(lt.loc[m, "name"].astype(str))


def layer_row(run: Run, name: str) -> dict[str, Any] | None:
    """The layer table's first row of that name (rules look rows up many times: the name index
    is built once per layer table and kept on the run)."""
    lt = run.layers
    if not len(lt) or "name" not in lt:
        return None
    cached = run.__dict__.get("_judge_layer_rows")
    if cached is None or cached[0] is not lt:
        rows: dict[str, dict[str, Any]] = {}
        for rec in lt.to_dict("records"):
            rows.setdefault(str(rec["name"]), rec)
        cached = run.__dict__["_judge_layer_rows"] = (lt, rows)
    return cached[1].get(str(name))


def computes_float32(run: Run, name: str) -> bool:
    """Whether layer ``name`` already computes in float32: its compute dtype is float32 (its own
    ``dtype="float32"``, or a float32 model), or it normalises in float32 inside a 16-bit policy
    (see :func:`effective_float32`). Unknown layers: False."""
    row = layer_row(run, name)
    if row is None:
        return False
    return row_computes_float32(row)


def row_computes_float32(row: Mapping[str, Any]) -> bool:
    """:func:`computes_float32` of one row of the layers table."""
    return "float32" in (str(row.get("compute_dtype") or ""), str(row.get("effective_dtype") or ""))


# --- fixes written as the user's code ------------------------------------------------------------
def class_module(run: Run, cls: str | None) -> str | None:
    """The module layer class ``cls`` was defined in (``"keras.src.layers.core.dense"``,
    ``"__main__"``, ``"my_project.layers"``), from the latest ``layers`` record's
    ``class_modules``; None where the record does not say (recorded before mpwatch wrote it)."""
    if not cls:
        return None
    recs = run.records.get(contract.KIND_LAYERS) or []
    if not recs:
        return None
    mods = recs[-1][1].get("class_modules")
    if not isinstance(mods, Mapping):
        return None
    mod = mods.get(str(cls))
    return str(mod) if mod else None


def is_keras_class(run: Run, cls: str | None) -> bool | None:
    """Whether layer class ``cls`` is Keras' own (its module is ``keras`` or under it); None when
    the run does not say."""
    mod = class_module(run, cls)
    if mod is None:
        return None
    return mod == "keras" or mod.startswith(("keras.", "tf_keras.", "tensorflow.python.keras."))


def layer_constructor(run: Run, cls: str | None) -> str:
    """How the user's code names layer class ``cls``: ``keras.layers.Dense`` for Keras' own
    classes, the bare class name (``LogSumExpPool``) for the user's own; ``keras.layers.<cls>``
    where the run does not record the class's module."""
    cls = str(cls or "Layer")
    return cls if is_keras_class(run, cls) is False else f"keras.layers.{cls}"


#: keras.applications: the model name each builder gives its model (a regular expression) -> the
#: builder's name, and the name of the layer that applies ``classifier_activation``
APPLICATIONS: tuple[tuple[str, Callable[[re.Match[str]], str], str], ...] = (
    (r"resnet(50|101|152)(v2)?", lambda m: f"ResNet{m[1]}{'V2' if m[2] else ''}", "predictions"),
    (r"densenet(121|169|201)", lambda m: f"DenseNet{m[1]}", "predictions"),
    (r"efficientnetb([0-7])", lambda m: f"EfficientNetB{m[1]}", "predictions"),
    (r"efficientnetv2-(b[0-3]|s|m|l)", lambda m: f"EfficientNetV2{m[1].upper()}", "predictions"),
    (r"inception_v3", lambda m: "InceptionV3", "predictions"),
    (r"inception_resnet_v2", lambda m: "InceptionResNetV2", "predictions"),
    (r"mobilenet_\d\.\d\d_\d+", lambda m: "MobileNet", "predictions"),
    (r"mobilenetv2_\d\.\d\d_\d+", lambda m: "MobileNetV2", "predictions"),
    (r"MobileNetV3(Small|Large)", lambda m: f"MobileNetV3{m[1]}", "predictions"),
    (r"nasnet_(mobile|large)", lambda m: f"NASNet{m[1].capitalize()}", "predictions"),
    (r"vgg(16|19)", lambda m: f"VGG{m[1]}", "predictions"),
    (r"xception", lambda m: "Xception", "predictions"),
    (r"convnext_(tiny|small|base|large|xlarge)",
     lambda m: "ConvNeXt" + {"xlarge": "XLarge"}.get(m[1], m[1].capitalize()),
     "{model}_head_dense"),
)  # fmt: skip


def application_of(run: Run, name: str) -> str | None:
    """The ``keras.applications`` builder (``"ResNet50"``) whose classifier layer ``name`` is, or
    None.

    The evidence, all from the layer table and run_info: the layer's parent in its path (the root
    model, or a nested model) is a ``Functional`` model named as that builder names its models
    (``resnet50``, ``mobilenetv2_1.00_96``, ...; :data:`APPLICATIONS`), and the layer has the name
    the builder gives the layer that applies ``classifier_activation`` (``predictions``). A model
    the user renamed is not recognised (the generic fix applies).
    """
    row = layer_row(run, name)
    if row is None:
        return None
    path = str(row.get("path") or name).split("/")
    if len(path) < 2:
        return None
    parent = path[-2]
    if len(path) == 2:  # the root model
        cls = str((run.info.get("model") or {}).get("class") or "Functional")
    else:
        lt = run.layers
        prow = lt[lt["path"].astype(str) == "/".join(path[:-1])] if "path" in lt else lt[:0]
        cls = str(prow["class"].iloc[0]) if len(prow) else ""
    if cls not in ("Functional", "Model"):
        return None
    for pattern, builder, head in APPLICATIONS:
        m = re.fullmatch(pattern, parent)
        if m and path[-1] == head.format(model=parent):
            return builder(m)
    return None


def inside_application(run: Run, name: str) -> str | None:
    """The ``keras.applications`` builder (``"EfficientNetB0"``) whose architecture the layer
    ``name`` is part of (an enclosing model in its path is named as that builder names its
    models, :data:`APPLICATIONS`), or None: such a layer's widths are the architecture's."""
    row = layer_row(run, name)
    if row is None:
        return None
    for part in str(row.get("path") or name).split("/")[:-1]:
        for pattern, builder, _ in APPLICATIONS:
            m = re.fullmatch(pattern, part)
            if m:
                return builder(m)
    return None


def keep_float32_fix(name: str, cls: str | None, run: Run | None = None) -> str:
    """The fix, as code, that keeps one layer in float32, written as the user's code is: Keras'
    own classes as ``keras.layers.<cls>``, the user's own classes by their name (with ``run``: the
    layers record says which is which), the classifier of a ``keras.applications`` model through
    ``classifier_activation=None`` and a float32 ``Activation`` (see :func:`application_of`), a
    layer that holds layers with all of them
    (:func:`mpwatch.judge.fixes.containers.container_float32_fix`)."""
    app = application_of(run, name) if run is not None else None
    if app is not None:
        row = (layer_row(run, name) or {}) if run is not None else {}
        act = row.get("activation")
        apply = "model = mpwatch.apply_recommendations(model, findings).model"
        tail = "# or, without editing the model code:\n" + apply
        path = str(row.get("path") or name).split("/")
        getter = "model" + "".join(f'.get_layer("{p}")' for p in path[1:])
        built = (f"model = keras.applications.{app}(...)  # as you build it, then before compile:"
                 if len(path) <= 2 else
                 f"# your model, built as it is ({app} inside it), then before compile:")
        whole = f'{built}\n{getter}.dtype_policy = "float32"'
        if str(row.get("class") or cls) == "Activation":
            # the builder's classifier is an Activation of its own (MobileNetV3): no matmul in
            # it, nothing else to split off
            what = act if isinstance(act, str) else "activation"
            return f"{whole}  # its {what} in float32\n{tail}"
        if act == "linear":  # classifier_activation=None already: only its Dense can change
            return f"{whole}  # its {name!r} Dense (logits) in float32\n{tail}"
        code = f'"{act}"' if isinstance(act, str) and act.isidentifier() else '"softmax"'
        note = "" if isinstance(act, str) else "  # the builder's default: yours if you passed one"
        fn = code.strip('"')
        return (
            f"{whole}  # its matmul and {fn} in float32\n"
            f"# or keep its matmul in 16 bits and apply {fn} in float32:\n"
            f"model = keras.applications.{app}(..., classifier_activation=None)\n"
            f'outputs = keras.layers.Activation({code}, dtype="float32")(model.output){note}\n'
            "model = keras.Model(model.input, outputs)\n" + tail
        )
    cls = cls or "Layer"
    ctor = layer_constructor(run, cls) if run is not None else f"keras.layers.{cls}"
    from mpwatch.judge.fixes.containers import container_float32_fix, sublayer_names

    subs = sublayer_names(run, name) if run is not None else []
    if subs and run is not None:
        return container_float32_fix(name, ctor, subs, run)
    own = ctor == cls
    line = f'{ctor}(..., dtype="float32", name="{name}")  # keep {name!r} in float32'
    if own:
        line += f"\n# {cls} is your class: its __init__ must pass **kwargs (dtype) to Layer"
    return line + (
        "\n# or, without editing the model code:\n"
        "model = mpwatch.apply_recommendations(model, findings).model"
    )


# --- the device ----------------------------------------------------------------------------------
#: the compute capability from which a GPU has fast math in each 16-bit dtype (Tensor Cores)
MIN_COMPUTE_CAPABILITY = {"float16": 7.0, "bfloat16": 8.0}


def fast_16bit(run: Run, dtype: str | None = None) -> bool | None:
    """Whether the run's device has fast math in ``dtype`` (default: the run's compute dtype):
    float16 on a GPU with Tensor Cores (compute capability 7.0 or more), bfloat16 on one of
    compute capability 8.0 or more. False on a CPU and on older GPUs; None when run_info records
    no device (or a GPU without its compute capability or Tensor Core flag)."""
    dev = run.info.get("device") or {}
    if not isinstance(dev, Mapping) or not dev:
        return None
    dtype = dtype or compute_dtype(run)
    if str(dev.get("type")) == "CPU":
        return False
    if str(dev.get("type")) != "GPU":
        return None
    cc = finite(str(dev.get("compute_capability") or "").split(" ")[0] or None)
    if cc is None:  # the recorder sets tensor_cores False when it cannot read the capability
        return None
    return cc >= MIN_COMPUTE_CAPABILITY["bfloat16" if dtype == "bfloat16" else "float16"]


# --- one finding per root cause ------------------------------------------------------------------
@dataclass
class Overflow:
    """Where a probe's 16-bit forward pass first went out of range, and what followed.

    Attributes:
        root: the first layer (forward order) whose output is non-finite or above float16's
            maximum: the cause. ``"loss"`` when only the loss is non-finite.
        kind: ``"non-finite"`` or ``"overflow"`` (finite but above 65504: a constructed record).
        downstream: later layers (forward order) whose output is non-finite or above 65504
            too: consequences of the root, evidence in its finding.
        after: every layer after the root (forward order): their measurements rest on the root's
            non-finite output and say nothing on their own.
        nonfinite_gradients: layers with non-finite gradients (a non-finite loss makes every
            gradient non-finite): consequences too.
    """

    root: str
    kind: str
    downstream: list[str]
    after: set[str]
    nonfinite_gradients: list[str]


def _is_nonfinite_count(v: Any) -> bool:
    if v is None or isinstance(v, bool) and not v:
        return False
    try:
        x = float(v)
    except (TypeError, ValueError):
        return False
    return x != 0 and not math.isnan(x)


def _overflows(r: Mapping[str, Any], run: Run, preflight: bool = False) -> bool:
    """A probe layer row's output is out of float16's range (and the layer's output is 16-bit; in
    a pre-flight probe, a mixed_float16 twin of a float32 model, every layer's is)."""
    raw = r.get("max_abs_activation")
    try:
        x = float(raw) if raw is not None else None
    except (TypeError, ValueError):
        x = None
    if x is None or math.isnan(x):
        return False
    if math.isinf(x):
        return True
    if x <= FLOAT16.max:
        return False
    if preflight:
        return True
    row = layer_row(run, str(r.get("layer"))) or {}
    out = str(row.get("output_dtype") or row.get("compute_dtype") or "")
    return out != "float32"  # a float32 output holds values above 65504


def probe_overflow(run: Run, probe: ProbeResult | None) -> Overflow | None:
    """The probe's overflow cascade (see :class:`Overflow`), or None when its forward pass stayed
    in range. The root is the probe's ``first_nonfinite_layer`` (the first layer, forward order,
    with a non-finite output, else ``"loss"``, else the first layer in backward order with a
    non-finite gradient); without one, the first layer whose output is above 65504."""
    if probe is None:
        return None
    layers = probe.layers
    rows = layers.to_dict("records") if len(layers) and "layer" in layers else []
    order = [str(r["layer"]) for r in rows]
    pre = str(probe.model.get("mode")) == "preflight"
    first = probe.model.get("first_nonfinite_layer")
    root, kind = None, "non-finite"
    if isinstance(first, str) and first:
        root = first
    else:
        for r in rows:
            if _overflows(r, run, pre):
                root, kind = str(r["layer"]), "overflow"
                break
    if root is None:
        return None
    after: set[str] = set(order[order.index(root) + 1 :]) if root in order else set()
    downstream = [
        str(r["layer"])
        for r in rows
        if str(r["layer"]) in after
        and (_overflows(r, run, pre) or _is_nonfinite_count(r.get("nonfinite")))
    ]
    grads = [
        str(r["layer"])
        for r in rows
        if str(r["layer"]) not in after
        and str(r["layer"]) != root
        and _is_nonfinite_count(r.get("nonfinite"))
    ]
    return Overflow(root=root, kind=kind, downstream=downstream, after=after,
                    nonfinite_gradients=grads)  # fmt: skip


def contiguous_blocks(order: Iterable[str], flagged: Mapping[str, bool | None]) -> list[list[str]]:
    """Maximal runs of flagged layers in ``order``: ``flagged[name]`` True joins the current run,
    False ends it, None (or absent: not measured, e.g. a layer without weights) passes through.

    >>> contiguous_blocks("abcdef", {"a": True, "b": None, "c": True, "d": False, "e": True})
    [['a', 'c'], ['e']]
    """
    out: list[list[str]] = []
    cur: list[str] = []
    for name in order:
        f = flagged.get(name)
        if f is None:
            continue
        if f:
            cur.append(name)
        elif cur:
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out


def names_list(names: list[str], limit: int = 3) -> str:
    """``'a', 'b', 'c' and 4 more``."""
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
