"""The twin of a model under another dtype policy: the probe's float32 reference.

:func:`build_twin` rebuilds a model's architecture with every layer under ``policy``
(``"float32"`` for
the reference of a mixed model; ``"mixed_float16"`` for the pre-flight of a float32 model):

- **Sequential and Functional** models (nested ones too) are cloned with
  ``keras.models.clone_model(..., recursive=True)`` and a ``clone_function`` that rebuilds each
  layer
  from its ``get_config()`` with the dtype policy replaced;
- **subclassed** models are rebuilt with ``cls.from_config(get_config())``, the config's dtype
policies
  replaced, under the target global policy (so sublayers created in ``__init__`` get it too). This
  works where Keras can rebuild the model from its config (Keras generates ``get_config`` for models
  whose constructor takes plain arguments).

Layers whose policy is already pinned to something else than the source policies (a ``float32``
output layer of a mixed model, an integer ``InputLayer``) keep it. The twin must come out with the
same weights (count and shapes, in order) as the model; otherwise :class:`TwinUnavailable` says why.

:class:`Twin` keeps the rebuilt model and copies the model's weights into it at each probe with one
``tf.function`` traced once (assignments into the existing variables: no retracing, no new graph).

Example:
    >>> import keras  # doctest: +SKIP
    >>> keras.mixed_precision.set_global_policy("mixed_float16")  # doctest: +SKIP
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])  # doctest: +SKIP
    >>> twin = Twin.build(model, "float32")  # doctest: +SKIP
    >>> twin.model.layers[0].compute_dtype  # doctest: +SKIP
    'float32'
    >>> twin.sync()  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

logger = logging.getLogger("mpwatch")

MIXED_POLICIES = ("mixed_float16", "mixed_bfloat16", "float16", "bfloat16")


class TwinUnavailable(Exception):
    """No twin can be built; the message says why (it goes into the probe record's note)."""


def model_kind(model: Any) -> str:
    """``"sequential"``, ``"functional"`` or ``"subclassed"``."""
    import keras

    if isinstance(model, keras.Sequential):
        return "sequential"
    try:
        from keras.src.models.functional import Functional
    except ImportError:  # pragma: no cover
        Functional = ()  # noqa: N806
    if Functional and isinstance(model, Functional):
        return "functional"
    return "subclassed"


@contextlib.contextmanager
def global_policy(policy: str) -> Iterator[None]:
    """Temporarily set Keras' global dtype policy."""
    import keras

    old = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(old)


def _policy_name(value: Any) -> str | None:
    """The policy name of a layer config's ``dtype`` entry (a string or a serialized policy)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        cfg = value.get("config")
        if isinstance(cfg, dict) and isinstance(cfg.get("name"), str):
            return cfg["name"]
    return None


def rewrite_policies(config: Any, sources: tuple[str, ...], target: str) -> Any:
    """A copy of a (nested) config with every serialized dtype *policy* named in ``sources``
    replaced by ``target``. Plain tensor dtypes (an InputLayer's ``"int32"``) are left alone unless
    they are a source name inside a policy dict."""
    if isinstance(config, dict):
        out = {}
        for k, v in config.items():
            if k == "dtype" and isinstance(v, dict) and v.get("class_name", "").endswith("Policy"):
                name = _policy_name(v)
                out[k] = target if name in sources else v
            elif k == "dtype" and isinstance(v, str) and v.startswith("mixed_") and v in sources:
                out[k] = target
            else:
                out[k] = rewrite_policies(v, sources, target)
        return out
    if isinstance(config, list):
        return [rewrite_policies(v, sources, target) for v in config]
    return config


def _sources_for(target: str) -> tuple[str, ...]:
    return ("float32",) if target.startswith("mixed_") else MIXED_POLICIES


def build_twin(model: Any, policy: str = "float32", example_inputs: Any = None) -> Any:
    """A new, built model with the same architecture under ``policy``; raises TwinUnavailable.

    ``example_inputs`` (a batch of model inputs) builds a rebuilt subclassed model whose input
    shape Keras did not record."""
    import keras

    sources = _sources_for(policy)
    kind = model_kind(model)
    errors = []

    def clone_layer(layer: Any) -> Any:
        cfg = layer.get_config()
        cfg = rewrite_policies(cfg, sources, policy)
        return layer.__class__.from_config(cfg)

    twin = None
    with global_policy(policy):
        if kind in ("sequential", "functional"):
            try:
                twin = keras.models.clone_model(model, clone_function=clone_layer, recursive=True)
            except Exception as e:  # noqa: BLE001
                errors.append(f"clone_model: {type(e).__name__}: {e}")
        if twin is None:
            try:
                cfg = rewrite_policies(model.get_config(), sources, policy)
                twin = model.__class__.from_config(cfg)
            except Exception as e:  # noqa: BLE001
                errors.append(f"from_config(get_config()): {type(e).__name__}: {e}")
        if twin is None:
            raise TwinUnavailable(
                f"cannot rebuild {type(model).__name__} {model.name!r} under {policy}: "
                + "; ".join(errors)
            )
        if not twin.built or len(twin.weights) != len(model.weights):
            _build_like(twin, model, example_inputs)
    check_same_weights(model, twin)
    return twin


def _build_like(twin: Any, model: Any, inputs: Any) -> None:
    """Build a rebuilt (subclassed) twin: by calling it on example inputs when there are some (a
    subclassed model's ``build(shape)`` may mark it built without creating its sublayers' weights),
    else with the model's recorded input shape(s)."""
    if inputs is not None:
        twin(inputs)
        return
    shapes = getattr(model, "_build_shapes_dict", None)
    try:
        if shapes and len(shapes) == 1:
            twin.build(next(iter(shapes.values())))
            return
        if shapes:
            twin.build(**shapes)
            return
    except Exception as e:  # noqa: BLE001
        raise TwinUnavailable(f"the rebuilt twin of {model.name!r} does not build: {e!r}") from e
    raise TwinUnavailable(
        f"the rebuilt twin of {model.name!r} is not built and the model's input shape is unknown"
    )


def check_same_weights(model: Any, twin: Any) -> None:
    """Raise TwinUnavailable unless both have the same weights, in order, of the same shapes."""
    a, b = model.weights, twin.weights
    if len(a) != len(b):
        raise TwinUnavailable(
            f"the rebuilt twin has {len(b)} weights, the model {len(a)}: the architecture did not "
            "survive get_config/from_config"
        )
    for va, vb in zip(a, b):
        if tuple(va.shape) != tuple(vb.shape):
            raise TwinUnavailable(
                f"weight {getattr(va, 'path', va.name)} has shape {tuple(va.shape)} in the model "
                f"but {tuple(vb.shape)} in the rebuilt twin"
            )


class Twin:
    """A model's twin under another policy, with a weight sync traced once.

    ``Twin.build(model, policy)`` raises :class:`TwinUnavailable`; ``sync()`` copies every weight
    (trainable and not, e.g. BatchNormalization statistics) of the model into the twin.
    """

    def __init__(self, model: Any, twin: Any) -> None:
        import tensorflow as tf

        self.source = model
        self.model = twin
        self.policy = twin.dtype_policy.name if hasattr(twin, "dtype_policy") else None
        pairs = [(dst, src) for dst, src in zip(twin.weights, model.weights)]

        def _value(v: Any) -> Any:
            return getattr(v, "value", v)

        @tf.function(autograph=False)
        def sync() -> None:
            for dst, src in pairs:
                _value(dst).assign(tf.cast(_value(src), _value(dst).dtype))

        self._sync = sync

    @classmethod
    def build(cls, model: Any, policy: str = "float32", example_inputs: Any = None) -> Twin:
        return cls(model, build_twin(model, policy, example_inputs))

    def sync(self) -> None:
        self._sync()
