"""Which Keras backend trains the model, and the facts only a backend can give: the device (GPU
name, compute capability, peak memory), whether this process writes (the chief), library versions.

mpwatch records on Keras 3's TensorFlow backend (the reference) and its JAX backend, with the same
records. Everything backend-specific that is not the in-graph tap
(:mod:`mpwatch.record.runtime.state` for TensorFlow, :mod:`mpwatch.record.tap.jax_tap` for JAX)
lives here, so the callbacks ask one place. Nothing here imports TensorFlow unless the backend is
TensorFlow: a JAX machine may not have it.

Example:
    >>> from mpwatch.record.runtime import backend
    >>> backend.name() in backend.SUPPORTED or backend.name() == "torch"
    True
"""

from __future__ import annotations

import os
import platform
import resource
import sys
from typing import Any

import numpy as np

TENSORFLOW = "tensorflow"
JAX = "jax"
SUPPORTED = (TENSORFLOW, JAX)


class UnsupportedBackendError(NotImplementedError):
    """The Keras backend is one mpwatch does not record on (yet)."""


def name() -> str:
    """Keras' backend: ``"tensorflow"``, ``"jax"``, ``"torch"`` or ``"numpy"``."""
    import keras

    return keras.backend.backend()


def check_supported(who: str = "mpwatch") -> str:
    """The backend's name, or :class:`UnsupportedBackendError` saying what to do."""
    backend = name()
    if backend not in SUPPORTED:
        raise UnsupportedBackendError(
            f"{who}: Keras' {backend!r} backend is not supported yet; mpwatch records on the "
            "'tensorflow' and 'jax' backends (set KERAS_BACKEND=tensorflow or KERAS_BACKEND=jax "
            "before importing keras). Training is not started."
        )
    return backend


def is_chief(model: Any = None) -> bool:
    """True where this process should write: always in one process; under TensorFlow's
    multi-worker training the chief (task ``chief``, or worker 0 without one); under JAX process
    0 of a multi-process run."""
    if name() == JAX:
        import jax

        return jax.process_index() == 0
    return tf_is_chief(getattr(model, "distribute_strategy", None))


def tf_is_chief(strategy: Any = None) -> bool:
    """True where this TensorFlow process should write (always, outside multi-worker training).
    The backend-neutral question is :func:`mpwatch.record.runtime.backend.is_chief`."""
    import tensorflow as tf

    strategy = strategy or tf.distribute.get_strategy()
    extended = getattr(strategy, "extended", None)
    in_multi = getattr(extended, "_in_multi_worker_mode", None)
    if not callable(in_multi) or not in_multi():
        return True
    resolver = getattr(strategy, "cluster_resolver", None)
    task_type = getattr(resolver, "task_type", None)
    task_id = getattr(resolver, "task_id", 0) or 0
    if task_type in (None, "chief"):
        return True
    if task_type == "worker" and task_id == 0:
        try:
            return "chief" not in resolver.cluster_spec().as_dict()
        except Exception:  # noqa: BLE001
            return True
    return False


def jax_processes() -> int:
    """How many JAX processes train together (``jax.distributed``); 1 on TensorFlow."""
    if name() != JAX:
        return 1
    import jax

    return int(jax.process_count())


def host(value: Any) -> Any:
    """A backend array (or a Keras variable) on the host as numpy. A JAX array replicated over
    several processes' devices is read from this process' own copy (every copy is the same)."""
    value = getattr(value, "value", value)  # a Keras variable: its backend array
    if getattr(value, "is_fully_addressable", True):
        return np.asarray(value.numpy() if hasattr(value, "numpy") else value)
    return np.asarray(value.addressable_shards[0].data)


def broadcast(values: tuple[int, ...]) -> tuple[int, ...]:
    """Process 0's ``values`` in every JAX process (a collective: every process calls it at the
    same point); ``values`` as they are in one process."""
    if jax_processes() == 1:
        return values
    from jax.experimental import multihost_utils

    got = multihost_utils.broadcast_one_to_all(np.asarray(values, np.int64))
    return tuple(int(v) for v in np.asarray(got))


def strategy_facts(model: Any) -> tuple[str, int]:
    """(the distribution's class name, replicas in sync) of a model."""
    if name() == JAX:
        import keras

        dist = keras.distribution.distribution()
        if dist is None:
            return "None", 1
        import numpy as np

        return type(dist).__name__, int(np.size(dist.device_mesh.devices))
    strategy = model.distribute_strategy
    return type(strategy).__name__, int(strategy.num_replicas_in_sync)


# --- the device ---------------------------------------------------------------------------------
def gpu_device() -> str | None:
    """The first visible GPU (``"GPU:0"``), None without one."""
    if name() == JAX:
        import jax

        try:
            gpus = jax.devices("gpu")
        except RuntimeError:  # no GPU backend
            return None
        return f"GPU:{gpus[0].id}" if gpus else None
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    return gpus[0].name.replace("/device:", "") if gpus else None


def jax_on_accelerator() -> bool:
    """Keras' JAX backend computing on a GPU or TPU (not the host's CPU)."""
    if name() != JAX:
        return False
    import jax

    try:
        return jax.default_backend() != "cpu"
    except Exception:  # noqa: BLE001
        return False


def _jax_gpu() -> Any:
    import jax

    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        return None
    return gpus[0] if gpus else None


def device_info() -> dict[str, Any]:
    """The device trained on: type, name, compute capability, whether it has Tensor Cores."""
    gpu = gpu_device()
    if gpu is None:
        return {
            "type": "CPU",
            "name": platform.processor() or platform.machine(),
            "compute_capability": None,
            "tensor_cores": False,
        }
    cc: str | None = None
    device_name = gpu
    if name() == JAX:
        dev = _jax_gpu()
        device_name = getattr(dev, "device_kind", None) or gpu
        cc = getattr(dev, "compute_capability", None)
    else:
        import tensorflow as tf

        try:
            details = tf.config.experimental.get_device_details(
                tf.config.list_physical_devices("GPU")[0]
            )
        except Exception:  # noqa: BLE001
            details = {}
        device_name = details.get("device_name", gpu)
        pair = details.get("compute_capability")
        cc = f"{pair[0]}.{pair[1]}" if pair else None
    major = int(str(cc).split(".")[0]) if cc else None
    return {
        "type": "GPU",
        "name": str(device_name),
        "compute_capability": str(cc) if cc else None,
        "tensor_cores": bool(major is not None and major >= 7),
    }


def process_peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB (``/proc`` VmHWM, else ``getrusage``)."""
    try:
        with open(f"/proc/{os.getpid()}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes
    return rss / (1024.0 * 1024.0) if sys.platform == "darwin" else rss / 1024.0


def peak_memory_mb(device: str | None) -> float:
    """Device peak memory on a GPU (the backend's allocator: TensorFlow's ``get_memory_info``,
    JAX's ``memory_stats()["peak_bytes_in_use"]``), the process's peak RSS otherwise."""
    if device is None:
        return process_peak_rss_mb()
    if name() == JAX:
        stats = (_jax_gpu().memory_stats() or {}) if _jax_gpu() is not None else {}
        peak = stats.get("peak_bytes_in_use")
        return peak / (1024.0 * 1024.0) if peak is not None else process_peak_rss_mb()
    import tensorflow as tf

    return tf.config.experimental.get_memory_info(device)["peak"] / (1024.0 * 1024.0)


def reset_peak_memory(device: str | None) -> None:
    """Reset the device's peak where the backend can (TensorFlow; JAX keeps a process peak)."""
    if device is None or name() == JAX:
        return
    import tensorflow as tf

    try:
        tf.config.experimental.reset_memory_stats(device)
    except (ValueError, RuntimeError):
        pass


def versions() -> dict[str, str | None]:
    """Versions of the libraries in play (None for one not installed)."""
    import keras

    from mpwatch._version import __version__

    out: dict[str, str | None] = {"mpwatch": __version__, "keras": keras.__version__}
    for lib in ("tensorflow", "jax"):
        mod = sys.modules.get(lib)
        if mod is None and lib == name():
            import importlib

            mod = importlib.import_module(lib)
        out[lib] = getattr(mod, "__version__", None) if mod is not None else None
    return out
