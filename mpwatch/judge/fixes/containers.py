"""Layers that hold layers (a subclassed block, a nested model), kept in float32 whole.

Keras gives a layer's ``dtype`` to none of the layers it creates: ``dtype="float32"`` on a
container leaves its sublayers in 16 bits, and on TensorFlow its own ops then fail to add their
float16 outputs to its float32 inputs (the keras.io Transformer's ``TransformerBlock``:
``AddV2``). Advice that keeps such a layer in float32 switches all of it, in code as in the
probe's check (:class:`mpwatch.record.probe.twin.PolicyView` with ``only``). Which layers hold
layers the layer table's paths say.
"""

from __future__ import annotations

from mpwatch.read.run import Run

__all__ = ["sublayer_names", "container_float32_fix"]


def sublayer_names(run: Run, name: str) -> list[str]:
    """The layers under layer ``name`` (the layers it holds, theirs, ...), from the layer table's
    paths; ``[]`` for a layer that holds none, or a run without paths."""
    lt = run.layers
    if not len(lt) or "path" not in lt or "name" not in lt:
        return []
    rows = lt[lt["name"].astype(str) == str(name)]
    path = rows["path"].iloc[0] if len(rows) else None
    if not isinstance(path, str):
        return []
    under = lt["path"].astype(str).str.startswith(path + "/")
    return [str(n) for n in lt.loc[under, "name"]]


def container_float32_fix(name: str, ctor: str, subs: list[str], run: Run) -> str:
    """The fix, as code, that keeps a layer *that holds layers* in float32: Keras gives a layer's
    ``dtype`` to none of the layers it creates, so ``dtype="float32"`` on the container alone
    leaves its sublayers in 16 bits (on TensorFlow its own ops then fail to add their float16
    outputs to its float32 inputs). The whole of it is switched: after the model is built (each
    layer's ``dtype_policy``), or by creating it under the float32 global policy."""
    pol = str(run.info.get("policy") or "") or "mixed_float16"
    shown = ", ".join(repr(n) for n in subs[:4])
    if len(subs) > 4:
        shown += f" and {len(subs) - 4} more"
    var = name if name.isidentifier() else "layer"
    cls = ctor.rsplit(".", 1)[-1]
    build = (
        f"{var} = ...  # build the {cls} model {name!r} here"
        if cls in ("Functional", "Sequential", "Model")
        else f'{var} = {ctor}(..., name="{name}")'
    )
    return "\n".join(
        [
            f"# {name!r} holds layers of its own ({shown}): a dtype given to a layer does not",
            "# reach the layers it creates, so keep all of it in float32. Once the model is built,",
            "# before it is compiled:",
            f'for sub in model.get_layer("{name}")._flatten_layers():  # it and all under it',
            '    sub.dtype_policy = "float32"',
            "# or create it under the float32 policy (the layers it creates in __init__ take it):",
            'keras.mixed_precision.set_global_policy("float32")',
            build,
            f'keras.mixed_precision.set_global_policy("{pol}")',
            "# or, without editing the model code:",
            "model = mpwatch.apply_recommendations(model, findings).model",
        ]
    )
