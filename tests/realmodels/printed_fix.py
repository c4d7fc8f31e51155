"""A finding's printed fix, done as its user does it, on a fresh model (issue 50).

The diagnosis prints each fix for a person: a constructor line to edit, a line to run on the
built model, a global policy to set, an optimizer to wrap. :func:`execute` does exactly that on a
model the example's own code builds afresh, reading only the printed text (never mpwatch's
``Fix``): a constructor line ``keras.layers.Dense(..., dtype="float32", name="d2")`` is that
constructor called with ``dtype="float32"``; ``model.get_layer(...)...`` and ``for`` lines run on
the built model; ``keras.mixed_precision.set_global_policy(...)`` is set before the build;
``optimizer = keras.optimizers.LossScaleOptimizer(optimizer, ...)`` wraps the model's optimizer,
which compiles it again. A line it cannot do is an error: a printed fix must be executable.

:func:`state` reads what a model trains as (every layer's policy, the optimizer's settings), so
a test compares it with what ``mpwatch.apply_recommendations`` made of the same findings.

Keras numbers layer names per session: the fixtures build every model right after
``keras.backend.clear_session()``, so a fresh build has the names its diagnosis printed.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from typing import Any

#: the lines of a fix that begin another way to do it (the first is the one done here)
_OTHER_WAY = re.compile(r"^# or\b")
_POLICY = re.compile(r'^keras\.mixed_precision\.set_global_policy\("(?P<policy>[^"]+)"\)$')
_CONSTRUCTOR = re.compile(
    r'^(?P<ctor>[A-Za-z_][\w.]*)\([^()]*dtype="float32", name="(?P<name>[^"]+)"\)$'
)
_BUILT_AS_IT_IS = re.compile(r"^model = keras\.applications\.\w+\(\.\.\.\)$")
_OPTIMIZER = re.compile(r"^optimizer = keras\.optimizers\.LossScaleOptimizer\(optimizer\b.*\)$")
_ON_THE_MODEL = re.compile(r"^(model\.|for \w+ in model\.)")


def first_way(code: str) -> list[str]:
    """The fix's code lines up to its first ``# or`` (comments cut, blank lines left out)."""
    lines = []
    for line in (code or "").split("\n"):
        if _OTHER_WAY.match(line.strip()):
            break
        body = line.split("  #")[0].rstrip() if not line.lstrip().startswith("#") else ""
        if body:
            lines.append(body)
    return lines


def other_way(code: str, starts: str) -> list[str]:
    """The code lines of the fix's alternative whose ``# or`` line starts with ``starts``."""
    lines = (code or "").split("\n")
    at = next((i for i, ln in enumerate(lines) if ln.startswith(starts)), None)
    assert at is not None, f"no {starts!r} in the printed fix:\n{code}"
    return first_way("\n".join(lines[at + 1 :]))


@contextlib.contextmanager
def _constructed_float32(names: dict[str, str]) -> Iterator[list[str]]:
    """Inside: a layer constructed with one of ``names`` (name -> its printed class) is
    constructed with ``dtype="float32"``, as the printed line writes it. Yields the names
    constructed so."""
    import keras

    layer_init = keras.layers.Layer.__init__
    done: list[str] = []

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("name") in names:
            kwargs["dtype"] = "float32"
        layer_init(self, *args, **kwargs)
        if self.name in names and self.name not in done:
            # a layer Keras named (no name= in the user's code): the same constructor, dtype
            # given, sets its policy before anything builds or calls it
            self.dtype_policy = "float32"
            done.append(self.name)

    keras.layers.Layer.__init__ = init
    try:
        yield done
    finally:
        keras.layers.Layer.__init__ = layer_init


def execute(codes: str | list[str], build: Callable[[str | None], Any]) -> Any:
    """Do the first way of a printed fix (or of several, one after the other) on a fresh model:
    ``build(policy)`` builds and compiles the model under ``policy`` (None: the model's own),
    after ``keras.backend.clear_session()``; returns the model, ready to train."""
    import keras

    code = codes if isinstance(codes, str) else "\n".join(codes)
    lines = [ln for c in ([codes] if isinstance(codes, str) else codes) for ln in first_way(c)]
    policy, constructed, on_model, optimizer = None, {}, [], []
    for i, line in enumerate(lines):
        if m := _POLICY.match(line):
            policy = m["policy"]
        elif m := _CONSTRUCTOR.match(line):
            constructed[m["name"]] = m["ctor"].rsplit(".", 1)[-1]
        elif _BUILT_AS_IT_IS.match(line):
            continue  # the model built as the user builds it: build() does that
        elif _OPTIMIZER.match(line):
            optimizer.append(line)
        elif _ON_THE_MODEL.match(line) or (line.startswith(" ") and on_model):
            on_model.append(line)
        else:
            raise AssertionError(f"the printed fix's line {i + 1} cannot be done: {line!r}\n{code}")
    keras.backend.clear_session()
    with _constructed_float32(constructed) as done:
        model = build(policy)
    missing = set(constructed) - set(done)
    assert not missing, f"the printed fix names layers this model does not build: {missing}"
    by_name = {ly.name: ly for ly in model._flatten_layers()}
    for name, cls in constructed.items():
        assert type(by_name[name]).__name__ == cls, (name, cls, type(by_name[name]).__name__)
    if on_model:
        exec("\n".join(on_model), {"model": model, "keras": keras})  # noqa: S102 - the printed fix
    if optimizer:
        scope: dict[str, Any] = {"keras": keras, "optimizer": _inner(model.optimizer)}
        exec("\n".join(optimizer), scope)  # noqa: S102 - the printed fix
        config = dict(model._compile_config.config)
        config["optimizer"] = scope["optimizer"]
        model.compile(**config)
    return model


def printed_and_applied(findings: list[Any], build: Callable[[str | None], Any]) -> tuple:
    """``(printed, applied)``: the findings' printed fixes done on a fresh model
    (:func:`execute`) and ``mpwatch.apply_recommendations`` of the findings on another fresh
    model, asserted to train alike (:func:`state`). A subclassed model, which applying cannot
    clone, is compared with the fix's own in-place form for it instead; where the fix has none
    (a global policy: set before the model is built), ``applied`` is None."""
    import keras

    import mpwatch

    printed = execute([f.fix for f in findings], build)
    keras.backend.clear_session()
    fresh = build(None)
    try:
        applied = mpwatch.apply_recommendations(fresh, findings).model
    except ValueError as e:
        assert "subclassed" in str(e), e
        for f in findings:  # no fix offers what cannot be done
            assert "apply_recommendations(model" not in f.fix, f.fix
        if not any(_IN_PLACE in f.fix for f in findings):
            return printed, None  # a policy: the printed code is the only way
        in_place = ["\n".join(other_way(f.fix, _IN_PLACE)) for f in findings]
        applied = execute(in_place, build)
    assert state(printed) == state(applied), (state(printed), state(applied))
    return printed, applied


#: how a fix for a subclassed model begins its in-place form (what applying cannot do for it)
_IN_PLACE = "# or, on this model before it trains"


def _inner(optimizer: Any) -> Any:
    return getattr(optimizer, "inner_optimizer", optimizer)


def state(model: Any) -> dict[str, Any]:
    """What the model trains as: every layer's dtype policy and its optimizer's class, its inner
    optimizer's class and learning rate, and the loss scale's settings."""
    opt = getattr(model, "optimizer", None)
    # by name where the user names them (the model's own layers: the names a fix prints); the
    # layers a layer makes in its own __init__ by their place (Keras numbers their names per
    # session, and a clone makes them anew)
    policies = {ly.name: ly.dtype_policy.name for ly in model.layers}
    policies["(every layer, in order)"] = [
        (type(ly).__name__, ly.dtype_policy.name) for ly in model._flatten_layers()
    ]
    if opt is None:  # a model whose train step holds its own optimizers (a GAN)
        return {"policies": policies}
    inner = _inner(opt)
    out: dict[str, Any] = {
        "policies": policies,
        "optimizer": type(opt).__name__,
        "inner": type(inner).__name__,
        "learning_rate": float(inner.get_config()["learning_rate"]),
    }
    if inner is not opt:
        out["initial_scale"] = float(opt.get_config()["initial_scale"])
        out["dynamic_growth_steps"] = int(opt.get_config()["dynamic_growth_steps"])
    return out


def model_changing(findings: list[Any]) -> list[Any]:
    """The findings whose fix changes the model or its optimizer (mpwatch's own reading: what
    applying acts on)."""
    from mpwatch.judge.fixes.fix import Fix

    out = []
    for f in findings:
        fix = Fix.of(f)
        if fix.float32_layers or fix.policy or fix.loss_scale or fix.dynamic_growth_steps:
            out.append(f)
    return out


def same_problem(finding: Any, findings: list[Any]) -> list[Any]:
    """The findings in ``findings`` that are ``finding`` again: its rule, at its layer."""
    return [f for f in findings if f.rule == finding.rule and f.layer == finding.layer]


def every_fix_alike(
    findings: list[Any],
    build: Callable[[str | None], Any],
    retrain: Callable[..., str],
    retrained: Callable[[Any], bool] = lambda f: True,
) -> list[dict[str, Any]]:
    """Each model-changing finding: printed and applied alike (:func:`printed_and_applied`),
    then, where ``retrained(finding)``, each model retrained by ``retrain(model, finding,
    label)`` (it returns the retrain's logdir) and diagnosed: ``[{rule, layer, how, left}]``,
    ``left`` the titles of the findings that are it again (none: the problem is gone). (The
    suite retrains a fix of one kind on one model of a module where more would only cost.)"""
    import mpwatch

    changing = model_changing(findings)
    assert changing, [(f.rule, f.layer) for f in findings]
    out = []
    for i, f in enumerate(changing):
        pair = printed_and_applied([f], build)
        for model, how in zip(pair, ("printed", "applied")) if retrained(f) else ():
            if model is None:  # a subclassed model's policy: the printed code is the one way
                continue
            logdir = retrain(model, f, f"{i}_{how}")
            left = [g.title for g in same_problem(f, mpwatch.diagnose(logdir))]
            out.append({"rule": f.rule, "layer": f.layer, "how": how, "left": left})
    return out
