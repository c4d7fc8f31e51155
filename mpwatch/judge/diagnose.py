"""Run the rules: :func:`diagnose` (a Run, several, or a logdir), :func:`diagnose_run`,
:func:`diagnose_runs`, :func:`compare_all`. Findings come back most severe first.

No TensorFlow here: every rule reads the tables of a :class:`~mpwatch.read.run.Run` (see
``mpwatch/contract/`` for schemas), so the rules run in milliseconds and are tested on constructed
tables. The TensorBoard tab and ``mpwatch diagnose`` both call :func:`diagnose`: a recommendation
is computed in one place.

Example:
    >>> import mpwatch  # doctest: +SKIP
    >>> for f in mpwatch.diagnose("logs/run1"):  # doctest: +SKIP
    ...     print(f.severity, f.title)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from mpwatch.judge.finding import Finding, most_severe_first, severity_rank
from mpwatch.judge.rule import policy
from mpwatch.judge.rules import PAIR_RULES, RUN_RULES, damaged_logs
from mpwatch.judge.rules.activation_overflow import NORMALIZE_ALTERNATIVE
from mpwatch.judge.rules.skipped_steps import WARMUP_SKIP_ALLOWANCE
from mpwatch.read import Run, load_run, load_runs

__all__ = [
    "diagnose",
    "diagnose_run",
    "diagnose_runs",
    "compare_all",
    "compare_runs",
    "model_structure",
    "one_per_layer",
    "fold_overflow_consequences",
    "fold_into_root",
    "fold_shared_advice",
    "fold_tensor_core_use",
    "fold_train_step",
    "no_forward_pass",
    "fold_input_range",
    "checked_fixes",
    "fold_skips_into_their_layer",
]


#: rules whose findings keep one layer float32 (``action["dtype"] == "float32"``) for a cause in
#: that layer: several of them on one layer are one cause, one finding (:func:`one_per_layer`)
LAYER_CAUSE_RULES = (
    "output-16bit",
    "activation-overflow",
    "id-rounding",
    "output-rel-error",
    "gradient-error",
    "input-range",  # (only its cast-constants finding names a layer: a float16 Normalization)
    "bad-batches",  # (only its input-scale finding names a layer: the one taking it in float16)
)


def one_per_layer(findings: list[Finding]) -> list[Finding]:
    """Findings of :data:`LAYER_CAUSE_RULES` about the same layer of the same run merged into the
    most severe one (then the earliest rule of that list): the others' titles (and what they had
    absorbed) become its evidence (``"; also: ..."``), ``data["also"]`` lists their rules and
    ``data["also_titles"]`` ``(rule, title)`` pairs."""
    keep: dict[tuple[str | None, str], Finding] = {}
    out: list[Finding] = []
    rank = {r: i for i, r in enumerate(LAYER_CAUSE_RULES)}
    mergeable = [f for f in findings if f.rule in rank and f.layer]
    mergeable.sort(key=lambda f: (-severity_rank(f.severity), rank[f.rule]))
    merged: set[int] = set()
    for f in mergeable:
        key = (f.run, str(f.layer))
        head = keep.get(key)
        if head is None:
            keep[key] = f
            continue
        _absorb(head, f)
        merged.add(id(f))
    for f in findings:
        if id(f) not in merged:
            out.append(f)
    return _into_grown_sets(out, rank)


def _into_grown_sets(findings: list[Finding], rank: dict[str, int]) -> list[Finding]:
    """A layer finding whose layer another finding of the run keeps float32 too (its checked,
    grown set: "keep 'd3', 'd2' float32"), no less severe, becomes that one's evidence: one
    change, one finding."""
    from mpwatch.judge.fix import Fix

    grown = [
        (f, set(Fix.of(f).float32_layers)) for f in findings
        if f.rule in rank and len(Fix.of(f).float32_layers) > 1
    ]  # fmt: skip
    out = []
    for f in findings:
        head = next(
            (
                g for g, names in grown
                if g is not f and g.run == f.run and f.layer in names
                and severity_rank(g.severity) >= severity_rank(f.severity)
            ),
            None,
        )  # fmt: skip
        if head is not None and f.rule in rank and f.action.get("dtype") == "float32":
            _absorb(head, f)
        else:
            out.append(f)
    return out


#: rules whose findings follow from a forward pass that leaves float16's range (non-finite
#: gradients at any scale: skipped steps, a scale driven down, meaningless gradient measures)
OVERFLOW_CONSEQUENCES = ("skipped-steps", "loss-scale", "gradient-underflow", "gradient-error")


def fold_overflow_consequences(findings: list[Finding]) -> list[Finding]:
    """Where ``activation-overflow`` found what no loss scale changes (an error with
    ``data["any_scale"]``: an activation out of float16's range, or gradients non-finite at a
    scale of 1 or less), or ``bad-batches`` found the features' own scale beyond float16's
    range taken in float16 (``cause`` ``input_scale``, with the layers: inf at any scale), or
    ``output-rel-error`` found an op inside a layer that overflows (run op by op), the
    findings of :data:`OVERFLOW_CONSEQUENCES` of the same run become its evidence (``"; also:
    ..."``, ``data["also"]``) instead of findings of their own."""
    return fold_into_root(
        findings,
        lambda f: (
            f.severity == "error"
            and (
                (f.rule == "activation-overflow" and bool(f.data.get("any_scale")))
                or (
                    f.rule == "bad-batches"
                    and f.data.get("cause") == "input_scale"
                    and bool(f.data.get("layers"))
                )
                or (f.rule == "output-rel-error" and bool(f.data.get("op_overflow")))
            )
        ),
        lambda f: f.rule in OVERFLOW_CONSEQUENCES,
    )


def fold_into_root(
    findings: list[Finding],
    is_root: Callable[[Finding], bool],
    rests_on_it: Callable[[Finding], bool],
    worst: bool = False,
) -> list[Finding]:
    """In each run, the findings that rest on that run's root finding (the most severe one for
    which ``is_root`` holds, the last of equals) become its evidence (:func:`_absorb`) instead
    of findings of their own: the one mechanism of every cause-and-consequence fold. ``worst``:
    the root takes the severity of the worst finding it absorbs (a cause whose consequences are
    errors is one)."""
    roots: dict[Any, Finding] = {}
    for f in findings:
        if is_root(f):
            had = roots.get(f.run)
            if had is None or severity_rank(f.severity) >= severity_rank(had.severity):
                roots[f.run] = f
    if not roots:
        return findings
    out = []
    for f in findings:
        root = roots.get(f.run)
        if root is not None and f is not root and rests_on_it(f):
            _absorb(root, f)
            if worst and severity_rank(f.severity) > severity_rank(root.severity):
                root.severity = f.severity
            continue
        out.append(f)
    return out


def fold_shared_advice(findings: list[Finding]) -> list[Finding]:
    """A run's ``loss-scale`` finding whose action is the one its model-wide
    ``gradient-underflow`` finding already gives (the two rules share
    :mod:`mpwatch.judge.scale_evidence`) is the same advice for the same cause: it is dropped,
    its rule listed in the underflow finding's ``data["also"]`` (whose evidence quotes the
    advice already)."""
    heads = {
        f.run: f
        for f in findings
        if f.rule == "gradient-underflow" and f.layer is None and f.action
    }
    out = []
    for f in findings:
        head = heads.get(f.run)
        if head is not None and f.rule == "loss-scale" and f.action == head.action:
            head.data = {**head.data, "also": [*head.data.get("also", []), f.rule]}
            continue
        out.append(f)
    return out


#: rules whose finding about a layer is the same cause as ``tensor-core-use``'s finding about it
#: (the static dimension check, and the profile's float32-layer time)
TENSOR_CORE_FOLDED = ("tensor-core-alignment", "profile")


def fold_tensor_core_use(findings: list[Finding]) -> list[Finding]:
    """A layer's ``tensor-core-use`` finding (its matrix math measured off the Tensor Cores) is the
    head of the same run's and layer's :data:`TENSOR_CORE_FOLDED` findings: they become its
    evidence (``"; also: ..."``, ``data["also"]``). A ``tensor-core-alignment`` finding about a
    layer whose matrix math the profile shows on Tensor Cores (the summary's
    ``data["matrix_math_on_tensor_cores_layers"]``) becomes info, with that measurement in its
    evidence: the kernels ran on Tensor Cores with those dimensions."""
    heads = {(f.run, f.layer): f for f in findings if f.rule == "tensor-core-use" and f.layer}
    on_tc: dict[str | None, set[str]] = {}
    for f in findings:
        if f.rule == "tensor-core-use" and f.layer is None:
            on_tc[f.run] = set(f.data.get("matrix_math_on_tensor_cores_layers") or [])
    out = []
    for f in findings:
        head = heads.get((f.run, f.layer)) if f.layer else None
        if head is not None and f.rule in TENSOR_CORE_FOLDED:
            _absorb(head, f)
            continue
        if f.rule == "tensor-core-alignment" and f.layer and f.layer in on_tc.get(f.run, set()):
            f.severity = "info"
            f.evidence += (
                "; the profile shows this layer's matrix multiplies/convolutions on Tensor Cores "
                "with these dimensions (rounding them may still save padding work)"
            )
            f.data = {**f.data, "measured_on_tensor_cores": True}
        out.append(f)
    return out


def fold_train_step(findings: list[Finding]) -> list[Finding]:
    """Where ``train-step`` found the train step's contract broken (an unscaled loss, an
    optimizer stepping without loss scaling, 16-bit variables), the findings that rest on that
    contract (:data:`~mpwatch.judge.rules.train_step.RESTS_ON_CONTRACT`, and an
    ``activation-overflow`` found only in the gradients, at a scale the train step never used)
    become its evidence: they measured a train step that does not exist."""
    from mpwatch.judge.rules.train_step import RESTS_ON_CONTRACT

    return fold_into_root(
        findings,
        lambda f: (
            f.rule == "train-step"
            and (f.severity == "error" or f.data.get("cause") == "loss_not_scaled")
        ),
        lambda f: (
            f.rule in RESTS_ON_CONTRACT
            or (f.rule == "activation-overflow" and not f.data.get("forward", True))
        ),
        worst=True,
    )


def fold_input_range(findings: list[Finding]) -> list[Finding]:
    """Where ``target-range`` found (by the probe's fix checks) that a regression target's range
    makes the backward pass overflow, the same run's overflow findings, their consequences and
    an ``input-range`` finding about the inputs' range
    (:func:`~mpwatch.judge.rules.target_range.rests_on_it`) become its evidence; else, where
    ``input-range`` found that the inputs' range makes the model overflow, those of
    :data:`~mpwatch.judge.rules.input_range.CONSEQUENCES`."""
    from mpwatch.judge.rules import input_range, target_range

    findings = fold_into_root(
        findings, lambda f: f.rule == "target-range", target_range.rests_on_it
    )
    return fold_into_root(
        findings, lambda f: f.rule == "input-range", lambda f: f.rule in input_range.CONSEQUENCES
    )


def checked_fixes(run: Run, findings: list[Finding]) -> list[Finding]:
    """A finding that keeps a layer float32 (``action["dtype"] == "float32"``), where the probe
    checked that fix on the batch that showed the problem (:mod:`mpwatch.judge.fix_checks`): its
    evidence says what the check saw; when the layer alone did not make the pass finite but a
    few more layers did, the advice (action and fix) grows to those layers; when none did, the
    finding keeps no float32 action (a fix that does not fix is not offered), unless the checks
    stopped before their end (mpwatch's cost budget): then the advice stands, said unchecked."""
    from mpwatch.judge.fix import Fix, layers_code
    from mpwatch.judge.fix_checks import checked_layers, latest_checks, normalizing_works, stopped

    latest = latest_checks(run)
    why = stopped(latest[2]) if latest else None  # the checks the advice is judged by stopped

    for f in findings:
        if not f.layer or f.action.get("dtype") != "float32":
            continue
        if f.rule == "gradient-error":
            _checked_gradient(run, f)
            continue
        got = checked_layers(run, f.layer)
        if got is None:
            continue
        layers, text = got
        f.evidence += f"; {text}"
        f.data = {**f.data, "checked_layers": layers}
        if layers is None and why:  # not reached: not checked, and not refuted either
            f.evidence += "; so keeping these layers float32 is not checked"
            f.data = {**f.data, "fix_unchecked": why}
            continue
        if normalizing_works(run) is False:  # checked, and it did not fix: not offered
            f.fix = "\n".join(ln for ln in f.fix.split("\n") if ln != NORMALIZE_ALTERNATIVE)
        if layers is None:
            f.action = {}
            f.fix = (
                "# keeping this layer (or the next ones) in float32 did not make it finite:\n"
                "# see the evidence for what the probe tried on the batch that overflowed"
            )
        elif layers != [f.layer]:  # one advice, printed and applied: the same layers
            f.action = Fix.of(f).with_layers(layers).action()
            f.fix = layers_code(layers, run)
    return findings


def _checked_gradient(run: Run, f: Finding) -> None:
    """A gradient-error advice the probe checked (:func:`mpwatch.judge.fix_checks.
    checked_gradient`): shown with what the check saw, or, where float32 left the error as it
    was, withdrawn (info, no action): the error comes with the gradient from elsewhere."""
    from mpwatch.judge.fix_checks import checked_gradient

    got = checked_gradient(run, str(f.layer))
    if got is None:
        return
    fixed, text = got
    f.evidence += f"; {text}"
    f.data = {**f.data, "checked_fixed": fixed}
    if fixed is False:
        f.severity = "info"
        f.title = (
            f"Gradient of layer {f.layer!r} differs from float32; float32 there does not fix it"
        )
        f.action = {}
        f.fix = (
            "# keeping this layer in float32 does not fix its gradient error (checked): the\n"
            "# error comes with the gradient from the layers after it, 16-bit arithmetic over\n"
            "# the network rather than one layer"
        )


def fold_skips_into_their_layer(findings: list[Finding]) -> list[Finding]:
    """A run's ``skipped-steps`` finding whose skips after the scale's descent are all failed
    doublings or overflows a probe saw start in one layer (``data["overflow_layers"]``, none
    unexplained, and not raised by a descent too long on its own) is a consequence of that
    layer's finding, when the run has one: it becomes its evidence."""
    heads: dict[tuple[str | None, str], Finding] = {}
    for f in findings:
        if f.layer and f.severity in ("warning", "error"):
            heads.setdefault((f.run, str(f.layer)), f)
    out = []
    for f in findings:
        layers = f.data.get("overflow_layers") or [] if f.rule == "skipped-steps" else []
        causes = f.data.get("by_cause") or {}
        head = heads.get((f.run, layers[0])) if len(layers) == 1 else None
        raised_by_descent = len(causes.get("descent") or []) > WARMUP_SKIP_ALLOWANCE
        if (
            head is not None
            and not causes.get("unexplained")
            and causes.get("model_overflow")
            and not raised_by_descent
        ):
            _absorb(head, f)
            continue
        out.append(f)
    return out


def no_forward_pass(run: Run, findings: list[Finding]) -> list[Finding]:
    """A model without a forward pass of its own (a GAN whose ``train_step`` runs sub-models:
    the ``train_step`` record's ``has_call`` False) has no output of its own: an
    ``output-16bit`` finding about a sub-model's output becomes info, saying so (which output
    reaches a loss in float16 is that train step's business)."""
    lt = run.layers
    paths = dict(zip(lt["name"].astype(str), lt["path"].astype(str))) if "path" in lt else {}
    if run.train_step.get("has_call") is not False:
        # a model holding several models (a Distiller's teacher and student): each output said
        # with the sub-model it is the output of
        outs = [f for f in findings if f.rule == "output-16bit"]
        owners = {f.layer: paths.get(str(f.layer), "").split("/")[-2:-1] for f in outs}
        if len({tuple(o) for o in owners.values() if o}) > 1:
            for f in outs:
                if owners[f.layer]:
                    f.evidence = f.evidence.replace(
                        "it is the model's output",
                        f"it is the output of sub-model {owners[f.layer][0]!r}",
                    )
        return findings
    for f in findings:
        if f.rule == "output-16bit":
            f.severity = "info"
            f.title = f"Sub-model output {f.layer!r} is computed in float16"
            # the printed code, applied as printed (by name: not "the model's output")
            f.action = {k: v for k, v in f.action.items() if k != "output"}
            owner = paths.get(str(f.layer), "").split("/")[-2:-1]  # the sub-model holding it
            if owner:
                f.evidence = f.evidence.replace(
                    "it is the model's output", f"it is the output of sub-model {owner[0]!r}"
                )
            f.evidence += (
                "; the model has no forward pass of its own (its train_step runs sub-models): "
                "whether this output reaches a loss in float16 depends on that train_step"
            )
            f.data = {**f.data, "no_forward_pass": True}
    return findings


def _absorb(head: Finding, f: Finding) -> None:
    """``f`` becomes evidence of ``head``: its title (and what it had absorbed) in ``head``'s
    evidence, its rule (and theirs) in ``head.data["also"]``."""
    absorbed = [(f.rule, f.title), *f.data.get("also_titles", [])]
    head.evidence += "".join(f"; also: {t} ({r})" for r, t in absorbed)
    head.data = {
        **head.data,
        "also": [*head.data.get("also", []), *(r for r, _ in absorbed)],
        "also_titles": [*head.data.get("also_titles", []), *absorbed],
    }


def diagnose_run(run: Run) -> list[Finding]:
    """Every run-level rule on one Run, most severe first, one finding per cause
    (:func:`fold_train_step`, :func:`one_per_layer`, :func:`fold_overflow_consequences`,
    :func:`fold_shared_advice`, :func:`fold_tensor_core_use`)."""
    out: list[Finding] = []
    for rule in RUN_RULES:
        for f in rule.check(run):
            if f.run is None:
                f.run = run.name
            out.append(f)
    out = fold_tensor_core_use(
        fold_shared_advice(
            fold_overflow_consequences(
                fold_input_range(fold_train_step(no_forward_pass(run, checked_fixes(run, out))))
            )
        )
    )
    out = most_severe_first(fold_skips_into_their_layer(one_per_layer(out)))
    return one_advice(in_place_for_subclassed(run, out))


def in_place_for_subclassed(run: Run, findings: list[Finding]) -> list[Finding]:
    """On a subclassed model (``run_info``'s model kind), which ``apply_recommendations`` cannot
    clone layer by layer (it says so and raises), a fix's "without editing the model code" way
    is the layers' policies set on the model itself before it trains, the same layers as the
    advice (:class:`~mpwatch.judge.fix.Fix`), never a call that fails."""
    from mpwatch.judge.fix import Fix
    from mpwatch.judge.graph import APPLY_TAIL

    if ((run.info.get("model") or {}).get("kind")) != "subclassed":
        return findings
    tail = "\n".join(APPLY_TAIL)
    for f in findings:
        names = Fix.of(f).float32_layers
        if tail not in (f.fix or "") or not names:
            continue
        listed = ", ".join(f'"{n}"' for n in names) + ("," if len(names) == 1 else "")
        f.fix = f.fix.replace(
            tail,
            "# or, on this model before it trains (a subclassed model: apply_recommendations\n"
            "# cannot clone it), each of these layers and the layers under it:\n"
            "for layer in model._flatten_layers():\n"
            f"    if layer.name in ({listed}):\n"
            "        for sub in layer._flatten_layers():\n"
            '            sub.dtype_policy = "float32"',
        )
    return findings


#: set (the test suite does) to make a finding whose printed code and applied advice disagree
#: an error instead of a logged warning
STRICT_ENV = "MPWATCH_STRICT_ADVICE"


def one_advice(findings: list[Finding]) -> list[Finding]:
    """Each finding's printed code keeps the same layers in float32 as its applied advice
    (:func:`mpwatch.judge.fix.disagreement`); where not, a bug of mpwatch's: said, and kept in
    the finding's data (``fix_disagrees``), or raised under :data:`STRICT_ENV`."""
    import logging

    from mpwatch.judge.fix import disagreement

    for f in findings:
        why = disagreement(f)
        if why is None:
            continue
        if os.environ.get(STRICT_ENV):
            raise AssertionError(f"finding {f.rule} ({f.layer}): {why}")
        logging.getLogger("mpwatch").warning("mpwatch: finding %s: %s", f.rule, why)
        f.data = {**f.data, "fix_disagrees": why}
    return findings


def compare_runs(mixed: Run, fp32: Run) -> list[Finding]:
    """Every rule about two runs on a mixed run and a float32 run of the same model (today:
    ``mixed-vs-float32``: step time, memory and loss)."""
    out: list[Finding] = []
    for rule in PAIR_RULES:
        out.extend(rule.check_pair(mixed, fp32))
    return out


def model_structure(run: Run) -> tuple[Any, ...] | None:
    """What makes two runs the same model: the parameter count and, layer by layer in the layer
    table, the class and parameter count (names are left out: Keras numbers them per session);
    without a layer table, the model's name, class and parameter count. None when the run records
    neither."""
    m = run.info.get("model") or {}
    lt = run.layers
    if len(lt) and "class" in lt and "params" in lt:
        layers = tuple(
            (str(c), int(p) if p == p and p is not None else None)
            for c, p in zip(lt["class"], lt["params"])
        )
        return ("layers", m.get("params"), layers)
    if m:
        return ("model", m.get("name"), m.get("class"), m.get("params"))
    return None


def compare_all(runs: Iterable[Run]) -> list[Finding]:
    """Pair each mixed run with the first float32 run of the same model
    (:func:`model_structure`: same parameter count and the same layer classes and parameter
    counts) and compare them (:func:`compare_runs`)."""
    runs = [r for r in runs if r.info]
    out = []
    f32 = [r for r in runs if policy(r) == "float32"]
    mixed = [r for r in runs if policy(r).startswith("mixed_")]
    for m in mixed:
        key = model_structure(m)
        if key is None:
            continue
        partner = [f for f in f32 if model_structure(f) == key]
        if partner:
            out.extend(compare_runs(m, partner[0]))
    return out


def diagnose_runs(runs: Mapping[str, Run] | Iterable[Run]) -> list[Finding]:
    """Every rule on every run with mpwatch data, plus the mixed-vs-float32 comparisons (a
    measured step-time comparison replaces the run's ``no-tensor-cores`` finding). A run without
    data gets ``damaged-logs``' findings alone: what in it could not be read."""
    items = list(runs.values()) if isinstance(runs, Mapping) else list(runs)
    out: list[Finding] = []
    for r in items:
        if r.has_data:
            out.extend(diagnose_run(r))
        else:
            out.extend(replace(f, run=r.name) for f in damaged_logs.check(r))
    pairs = compare_all(r for r in items if r.has_data)
    measured = {f.run for f in pairs if "step_time_ratio" in f.data}
    out = [f for f in out if not (f.rule == "no-tensor-cores" and f.run in measured)]
    out.extend(pairs)
    return most_severe_first(out)


def diagnose(
    run_or_logdir: Run | str | os.PathLike[str] | Mapping[str, Run] | Iterable[Run],
    run: str | None = None,
) -> list[Finding]:
    """Findings for a Run, several Runs, or a logdir (every run in it, or the one named ``run``).

    Most severe first. Each Finding's ``run`` names the run it is about.

    Example:
        >>> findings = diagnose("logs")  # doctest: +SKIP
        >>> [f.title for f in findings if f.severity == "error"]  # doctest: +SKIP
    """
    if isinstance(run_or_logdir, Run):
        return diagnose_run(run_or_logdir)
    if isinstance(run_or_logdir, (str, os.PathLike)):
        if run is not None:
            return diagnose_run(load_run(run_or_logdir, run, warn=False))
        return diagnose_runs(load_runs(run_or_logdir))
    return diagnose_runs(run_or_logdir)
