"""The probe's twin: the *same* model, its layers switched to another dtype policy for one pass.

The probe compares the gradients Keras' train step gets with those of a float32 reference of the
same network on the same batch with the same weights (or, in a pre-flight of a float32 model, with
a ``mixed_float16`` version). Rebuilding a copy from ``get_config()`` fails on exactly the models
users write (a custom layer whose ``__init__`` takes no ``**kwargs``, a ``Lambda``, a subclassed
model), and needs a second copy of the weights. So the twin is not a copy: :class:`PolicyView`
switches, for the duration of a ``with`` block, the dtype policy of the model and of every layer
under it whose policy is one of the *source* policies, and restores them afterwards. Inside the
block, calling the model runs the same layers, the same variables and the same user code, computing
in the target dtype (Keras casts inputs and variables to a layer's ``compute_dtype`` at call time).

- Reference of a mixed model: ``PolicyView(model, "float32")`` switches ``mixed_float16``,
  ``mixed_bfloat16``, ``float16`` and ``bfloat16`` layers to ``float32``.
- Pre-flight of a float32 model: ``PolicyView(model, "mixed_float16")`` switches ``float32`` layers.

Layers pinned to anything else (an integer input, a quantized layer) keep their policy. A layer
pinned to ``float32`` in a mixed model is float32 in both passes, as it is in training. Code that
hard-codes a dtype (``ops.cast(x, "float16")``) keeps it in both passes: the reference is float32
wherever the user's code follows its layer's ``compute_dtype``.

The probe traces both passes inside one ``tf.function``: the view is active while Python traces the
reference pass, so the traced graph holds a float32 pass and a mixed pass of the same variables.

Example:
    >>> import keras  # doctest: +SKIP
    >>> keras.mixed_precision.set_global_policy("mixed_float16")  # doctest: +SKIP
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])  # doctest: +SKIP
    >>> with PolicyView(model, "float32"):  # doctest: +SKIP
    ...     model.layers[0].compute_dtype
    'float32'
    >>> model.layers[0].compute_dtype  # doctest: +SKIP
    'float16'
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from mpwatch.layers import recast_constants, walk

#: held while mpwatch switches a model's layers (a policy view, random layers off, float8's
#: wrapped calls): another thread that traces the model's train step (the JAX tap's counting
#: program, :mod:`mpwatch.record.tap.jax_programs`) traces under it too, so it never sees a
#: switched layer. Reentrant: the switches nest.
SWITCHING = threading.RLock()

MIXED_POLICIES = ("mixed_float16", "mixed_bfloat16", "float16", "bfloat16")


class TwinUnavailable(Exception):
    """No twin pass can be run; the message says why (it goes into the probe record's note)."""


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


def sources_for(target: str) -> tuple[str, ...]:
    """The policies a view to ``target`` switches: float32 for a mixed target, else mixed ones."""
    return ("float32",) if target.startswith("mixed_") else MIXED_POLICIES


def _policy_name(layer: Any) -> str | None:
    policy = getattr(layer, "dtype_policy", None)
    name = getattr(policy, "name", None)
    if getattr(policy, "quantization_mode", None):
        return None  # a quantized layer keeps its policy
    return name if isinstance(name, str) else None


class PolicyView:
    """Switch ``model`` and every layer under it from the source policies to ``policy``.

    Usable as a context manager any number of times (each ``with`` switches and restores). The
    layers switched are fixed at construction (``layers``: the names, for the record's note).

    Example:
        >>> import keras
        >>> model = keras.Sequential(
        ...     [keras.Input((3,)), keras.layers.Dense(2, dtype="mixed_float16", name="d")]
        ... )
        >>> view = PolicyView(model, "float32")
        >>> with view:
        ...     model.get_layer("d").compute_dtype
        'float32'
        >>> model.get_layer("d").compute_dtype
        'float16'
    """

    def __init__(
        self,
        model: Any,
        policy: str,
        only: set[str] | None = None,
        sources: tuple[str, ...] | None = None,
    ) -> None:
        """``only``: switch just the layers of these names *and every layer under them* (a fix
        kept to a few layers). Keras gives a layer's dtype to none of the layers it holds: a
        container switched alone would compute in float32 around sublayers still in 16 bits
        (TensorFlow then fails to add their outputs), so keeping a container in float32 is
        keeping all of it, as the advice's code does
        (:func:`mpwatch.judge.fixes.containers.container_float32_fix`). ``sources``: the
        policies switched (default :func:`sources_for` the target; a pre-flight of a
        ``mixed_float16`` model under ``mixed_bfloat16`` switches ``mixed_float16`` only, so
        the layers pinned to float32 stay so)."""
        self.model = model
        self.policy = policy
        sources = sources if sources is not None else sources_for(policy)
        candidates = [model] + [layer for layer, _, _ in walk(model)]
        if only is not None:
            named = [layer for layer in candidates if layer.name in only]
            candidates = named + [sub for layer in named for sub, _, _ in walk(layer)]
        seen: set[int] = set()
        self._targets: list[Any] = []
        for layer in candidates:
            if id(layer) in seen or not hasattr(layer, "dtype_policy"):
                continue
            seen.add(id(layer))
            if _policy_name(layer) in sources:
                self._targets.append(layer)
        self.layers = [layer.name for layer in self._targets]
        self._saved: list[tuple[Any, Any]] | None = None

    def __enter__(self) -> PolicyView:
        if self._saved is not None:
            raise RuntimeError("mpwatch: a PolicyView is not re-entrant")
        SWITCHING.acquire()
        self._saved = [(layer, layer.dtype_policy) for layer in self._targets]
        self._constants: list[tuple[Any, tuple[Any, Any]]] = []
        try:
            for layer in self._targets:
                layer.dtype_policy = self.policy
                old = recast_constants(layer)
                if old is not None:
                    self._constants.append((layer, old))
        except Exception:
            self._restore()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self._restore()

    def _restore(self) -> None:
        if self._saved is None:
            return
        try:
            for layer, old in self._saved:
                layer.dtype_policy = old
            for layer, (mean, variance) in getattr(self, "_constants", []):
                layer.mean, layer.variance = mean, variance
        finally:
            self._saved, self._constants = None, []
            SWITCHING.release()


def random_layers(model: Any) -> list[Any]:
    """The layers under ``model`` that draw random numbers of their own in training (Dropout,
    GaussianNoise, random augmentation, ...: any layer owning a Keras ``SeedGenerator``)."""
    out = []
    for layer, _, _ in walk(model):
        if getattr(layer, "_seed_generators", None):
            out.append(layer)
    return out


@contextlib.contextmanager
def random_layers_off(layers: list[Any]) -> Iterator[None]:
    """Call ``layers`` with ``training=False`` while the block runs (Python-level: it acts on what
    is traced inside the block). The probe's two passes then see no random masks: identical
    networks, the rest of the model (BatchNormalization on batch statistics) in training mode."""

    patched = []
    with SWITCHING:
        try:
            for layer in layers:
                original = layer.call

                def call(*args: Any, __original: Any = original, **kwargs: Any) -> Any:
                    if "training" in kwargs:
                        kwargs["training"] = False
                    return __original(*args, **kwargs)

                had_own = "call" in vars(layer)
                object.__setattr__(layer, "call", call)
                patched.append((layer, had_own, original))
            yield
        finally:
            for layer, had_own, original in reversed(patched):
                if had_own:
                    object.__setattr__(layer, "call", original)
                else:
                    object.__delattr__(layer, "call")


def backend_value(v: Any) -> Any:
    """The backend variable under a Keras variable."""
    return getattr(v, "value", v)


def state_variables(model: Any) -> list[Any]:
    """Every variable of ``model`` that a forward pass and ``compute_loss`` may write: its
    non-trainable variables (moving statistics, seed states) and its metrics' variables (the
    compiled loss's per-output trackers among them), each once."""
    seen: set[int] = set()
    out = []
    for v in list(model.non_trainable_variables) + list(model.metrics_variables):
        if id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out
