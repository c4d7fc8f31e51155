"""A model cloned layer by layer with some layers' policies changed: what
:func:`mpwatch.apply_recommendations` builds its new model with.

Keras' ``clone_model`` rebuilds each layer from its config. Users' layers do not always allow
that, and here each case is met as its user would meet it: a ``Lambda`` keeps its function
object (a function defined in a script cannot be found again by name), a layer whose
``__init__`` takes no ``**kwargs`` is made as the user's code makes it and then given its name
and policy, a layer the fix leaves alone that its config cannot rebuild at all is shared, and the
inputs keep their names. A subclassed model cannot be cloned: :func:`clonable` says so first.

Example:
    >>> import keras
    >>> inputs = keras.Input((4,))
    >>> model = keras.Model(inputs, keras.layers.Dense(2, name="d")(inputs))
    >>> shared = []
    >>> new = clone(model, {"d"}, None, None, shared)
    >>> new.get_layer("d").dtype_policy.name, [ly.name for ly in new.layers], shared
    ('float32', ['input_layer', 'd'], [])
"""

from __future__ import annotations

from typing import Any

from mpwatch.layers import walk

__all__ = ["clonable", "clone", "policy_name"]


def policy_name(obj: Any) -> str | None:
    """The name of ``obj``'s dtype policy, or None."""
    name = getattr(getattr(obj, "dtype_policy", None), "name", None)
    return name if isinstance(name, str) else None


def _from_config(layer: Any, config: dict[str, Any]) -> Any:
    """A new layer like ``layer`` from ``config``. A ``Lambda`` keeps its function, mask and
    arguments as the objects they are (its config names a function by name only, which Keras
    cannot find again for a function defined in a script: keras.io's Siamese network's
    ``euclidean_distance``); a layer its config cannot rebuild, from the arguments its
    constructor was called with."""
    import keras

    if type(layer) is keras.layers.Lambda:
        return keras.layers.Lambda(
            layer.function, output_shape=layer._output_shape, mask=layer.mask,
            arguments=layer.arguments, name=config["name"], dtype=config.get("dtype"),
        )  # fmt: skip
    try:
        return layer.__class__.from_config(config)
    except TypeError:
        args = getattr(getattr(layer, "_auto_config", None), "config", None)
        if args is None:
            raise
    # a user's layer whose __init__ takes no **kwargs (keras.io's TokenAndPositionEmbedding), or
    # whose get_config leaves out an argument (keras.io's ViT PatchEncoder): made with the
    # arguments its constructor was called with (Keras keeps them, where they are plain values),
    # then given the name, trainability and policy the config says, before anything builds it
    base = ("name", "trainable", "dtype")
    new = layer.__class__(**{k: v for k, v in dict(args).items() if k not in base})
    new.name = config.get("name") or layer.name  # a config may leave the name out too
    new.trainable = config.get("trainable", layer.trainable)
    if config.get("dtype") is not None:
        new.dtype_policy = config["dtype"]
    return new


def _inputs_named(model: Any) -> Any:
    """A Functional model's inputs made anew with its input layers' names (Keras' clone names
    each after its tensor, ``keras_tensor``: the clone's calls then warn that their inputs do not
    match ``['keras_tensor']``), or None (a Sequential model keeps its names)."""
    import keras
    from keras.src.models.functional import Functional

    if not isinstance(model, Functional) or isinstance(model, keras.Sequential):
        return None

    def named(x: Any) -> Any:
        history = getattr(x, "_keras_history", None)
        layer = getattr(history, "operation", None) or (history[0] if history else None)
        name = getattr(layer, "name", None) or x.name
        return keras.Input(batch_shape=x.shape, dtype=x.dtype, name=name)

    return keras.tree.map_structure(named, model.input)


def clone(model: Any, float32: set[str], old: str | None, policy: str | None,
           shared: list[str]) -> Any:  # fmt: skip
    """``model`` cloned layer by layer under ``policy``: the ``float32`` layers in float32, the
    layers that had the model's policy ``old`` in ``policy`` (as building the model under the
    new global policy gives them), the others (pinned by the user) as they were; not compiled.
    A layer left as it was that its config cannot rebuild is the model's own, shared (named in
    ``shared``)."""
    import keras

    switch = policy is not None and policy != old

    def clone_function(layer: Any) -> Any:
        changed = layer.name in float32 or (switch and policy_name(layer) == old)
        try:
            config = layer.get_config()
        except NotImplementedError:  # made with an object no config holds, no get_config
            if changed:
                raise
            shared.append(f"{type(layer).__name__} {layer.name!r}")
            return layer
        if layer.name in float32:
            config["dtype"] = "float32"
            if walk(layer):  # it holds layers: those it creates take the global policy
                before = keras.mixed_precision.global_policy()
                keras.mixed_precision.set_global_policy("float32")
                try:
                    return _from_config(layer, config)
                finally:
                    keras.mixed_precision.set_global_policy(before)
        elif switch and policy_name(layer) == old:
            config["dtype"] = policy
            new = _from_config(layer, config)
            for sub, _, _ in walk(new):  # a wrapper's layers rebuilt from their own configs
                if policy_name(sub) == old:  # (Bidirectional's LSTMs) switch with it
                    sub.dtype_policy = policy
            return new
        try:
            return _from_config(layer, config)
        except (TypeError, ValueError):
            if changed:  # the fix changes it: sharing it as it is would drop the change
                raise
            # a layer the fix leaves as it is that nothing rebuilds: shared, not rebuilt
            shared.append(f"{type(layer).__name__} {layer.name!r}")
            return layer

    global_before = keras.mixed_precision.global_policy()
    compiled = getattr(model, "compiled", False)
    try:
        if policy is not None:  # the models clone_model creates (the clone, nested ones) take
            keras.mixed_precision.set_global_policy(policy)  # the global policy
        # Keras' clone_model compiles a compiled model's clone from its serialized config: with
        # a new optimizer of the old values, and failing on an unregistered custom loss. The
        # clone is compiled here instead (_compile_like), with the optimizer the advice says
        model.compiled = False
        # a Lambda's function is this process' own object, cloned in memory, never read from
        # a file: Keras' safe mode (which refuses to deserialize a Python lambda) is for files
        from keras.src.saving.serialization_lib import SafeModeScope

        with SafeModeScope(safe_mode=False):
            return keras.models.clone_model(
                model, clone_function=clone_function, input_tensors=_inputs_named(model),
                recursive=True,
            )  # fmt: skip
    except (ValueError, TypeError, NotImplementedError) as e:
        graph = isinstance(model, (keras.Sequential, keras.Model)) and type(model).__name__ in (
            "Functional", "Sequential"
        )
        how = (
            "one of its layers cannot be rebuilt from its config: change the layers in the "
            "model's code"
            if graph
            else "a subclassed model must be changed in its code"
        )
        raise ValueError(
            f"mpwatch: cannot clone {type(model).__name__} layer by layer ({e}); {how}: see "
            "apply_recommendations(None, findings).snippet"
        ) from e
    finally:
        model.compiled = compiled
        keras.mixed_precision.set_global_policy(global_before)


def clonable(model: Any) -> None:
    """Raise the clear error for a model Keras cannot clone layer by layer (subclassed: its
    layers are made by its own code) before anything is built from it."""
    import keras
    from keras.src.models.functional import Functional

    if isinstance(model, (keras.Sequential, Functional)) or not isinstance(model, keras.Model):
        return
    raise ValueError(
        f"mpwatch: cannot clone {type(model).__name__} layer by layer (a subclassed model: its "
        "layers are made by its own code); a subclassed model must be changed in its code, or "
        "its layers' policies set before it trains: see the findings' fix and "
        "apply_recommendations(None, findings).snippet"
    )
