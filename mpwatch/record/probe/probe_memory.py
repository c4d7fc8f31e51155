"""Whether the probe fits in the device's free memory, asked before it runs.

Users size the batch to fill the device: a probe that needs more than is free turns their fit
into an out-of-memory crash, possibly hours in. So before each probe the monitor compares

- **what the probe needs** (:func:`need`): on JAX, XLA's own memory analysis of the probe's
  compiled program (its temporary buffers and outputs; the arguments are the training state and
  the batch, already in memory), on one device; on TensorFlow (whose graph executor plans no
  memory ahead), an estimate: a second set of gradients in float32 (the reference pass'), both
  passes' tapped layer outputs and their gradients for the probe batch, and the statistics'
  pieces (:data:`mpwatch.record.tap.tf_chunks.CHUNK` elements, a few float64 copies);
- **what is free** (:func:`free`): ``$MPWATCH_DEVICE_FREE_BYTES`` where set (a limit you give
  mpwatch, or a simulated device in a test), else the device's own report (JAX's
  ``memory_stats()``: its limit less what is in use, on a GPU or TPU); None where nothing says
  (a CPU: the host's memory is not checked).

A probe that would not fit is skipped: its budget decision says ``skipped`` with the two figures,
the run's notices say it once with what would make it fit, and the diagnosis names it.

Example:
    >>> import os  # doctest: +SKIP
    >>> os.environ["MPWATCH_DEVICE_FREE_BYTES"] = str(256 * 2**20)  # doctest: +SKIP
    >>> free()  # doctest: +SKIP
    (268435456, 'MPWATCH_DEVICE_FREE_BYTES')
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any

logger = logging.getLogger("mpwatch")

ENV = "MPWATCH_DEVICE_FREE_BYTES"
#: the share of the free memory the probe may take (the rest for the allocator's fragmentation)
SHARE = 0.9


def free() -> tuple[int | None, str]:
    """(free bytes on the training's device, where the figure comes from); (None, why) where
    nothing reports it."""
    raw = os.environ.get(ENV)
    if raw:
        try:
            return int(float(raw)), ENV
        except ValueError:
            logger.warning("mpwatch: %s=%r is not a number of bytes; ignored", ENV, raw)
    from mpwatch.record.runtime import backend

    if backend.name() == backend.JAX:
        try:
            import jax

            device = jax.local_devices()[0]
            stats = device.memory_stats() if device.platform != "cpu" else None
            if stats and stats.get("bytes_limit"):
                return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0)), (
                    f"{device.platform} memory_stats"
                )
        except Exception:  # noqa: BLE001 - no figure is not a failure
            logger.debug("mpwatch: probe: no free-memory figure", exc_info=True)
    return None, "the device reports no free memory (the host's is not checked)"


def need(probe: Any, x: Any, y: Any, sw: Any) -> tuple[int | None, str]:
    """(bytes the probe needs beyond the training's state, how it was found); None where it
    cannot be said."""
    from mpwatch.record.runtime import backend

    if backend.name() == backend.JAX:
        fn = getattr(probe, "_fn", None)
        analysis = fn.memory_analysis(x, y, sw) if hasattr(fn, "memory_analysis") else None
        if analysis is None:
            return None, "no memory analysis of the probe's program"
        temp = int(getattr(analysis, "temp_size_in_bytes", 0) or 0)
        out = int(getattr(analysis, "output_size_in_bytes", 0) or 0)
        return temp + out, "XLA's memory analysis of the probe's program"
    return tf_estimate(probe, x), "an estimate (gradients, tapped outputs, statistics' pieces)"


def tf_estimate(probe: Any, x: Any) -> int:
    """The TensorFlow probe's bytes beyond training (see the module doc)."""
    from mpwatch.record.tap import tf_chunks

    model = probe.model
    grads = sum(_elements(v.shape) for v in model.trainable_variables) * 4
    batch = _leading(x)
    acts = 0
    for layer in getattr(probe, "tapped_layers", None) or []:
        for t in _flat(getattr(layer, "output", None)):
            shape = list(getattr(t, "shape", ()) or ())
            if shape and shape[0] is None:
                shape[0] = batch or 1
            acts += _elements(shape)
    # each output: the 16-bit pass' (2 bytes) and the reference's (4), with their gradients
    largest = max((_elements(v.shape) for v in model.trainable_variables), default=0)
    return int(grads + acts * (2 + 4) * 2 + min(tf_chunks.CHUNK, max(largest, acts)) * 8 * 6)


def _elements(shape: Any) -> int:
    return int(math.prod(int(d or 1) for d in shape)) if shape is not None else 0


def _flat(t: Any) -> list[Any]:
    if t is None:
        return []
    import keras

    return list(keras.tree.flatten(t))


def _leading(x: Any) -> int | None:
    for t in _flat(x):
        shape = getattr(t, "shape", None)
        if shape is not None and len(shape) and shape[0] is not None:
            return int(shape[0])
    return None


def mib(n: float) -> str:
    """Bytes for a person (MiB, KiB below one MiB, bytes below one KiB)."""
    if n < 2**10:
        return f"{int(n)} B"
    return f"{n / 2**10:.1f} KiB" if n < 2**20 else f"{n / 2**20:,.1f} MiB"


def verdict(needed: int | None, free_bytes: int | None) -> bool:
    """Whether a probe needing ``needed`` bytes fits ``free_bytes`` (at :data:`SHARE` of it);
    True where either is unknown."""
    return needed is None or free_bytes is None or needed <= SHARE * free_bytes
