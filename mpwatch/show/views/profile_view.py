"""What a profile's figures are and what it could not join, for the reports and the TensorBoard
tab alike: the figures' source in words (:func:`source_label`), the share of a host-op profile's
time in matmul and convolution ops that no layer holds (``contract.PROFILE_UNJOINED_MATH``: a
train step's own math, whose precision the profile did not read from a layer), and the share
from which both say it.

Example:
    >>> unjoined_math_share({"total_us": 200.0, "unattributed_by_category": {
    ...     "matmul/conv joined to no layer": 50.0, "optimizer update": 20.0}})
    0.25
    >>> source_label({"tool": "xla_host_events"}, "host_ops")
    "host ops (precision from each XLA op's HLO)"
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mpwatch import contract

#: the share of a profile's time in matmul/conv ops joined to no layer that the reports and the
#: tab say (below it, the time is left in "outside layers" unremarked)
UNJOINED_SAID = 0.01


def unjoined_math_share(prof: Mapping[str, Any]) -> float | None:
    """The share of a ``profile`` record's time in matmul and convolution ops joined to no layer
    (counted 32-bit: their precision not read); None without a total."""
    total = contract.finite_float(prof.get("total_us"))
    by = prof.get("unattributed_by_category")
    if not total or not isinstance(by, Mapping):
        return None
    return (contract.finite_float(by.get(contract.PROFILE_UNJOINED_MATH)) or 0.0) / total


#: the trace reader whose ops carry their XLA instruction (JAX, or TensorFlow with XLA, on a CPU)
XLA_HOST_TOOL = "xla_host_events"


def source_label(prof: Mapping[str, Any], source: str | None) -> str:
    """What a ``profile`` record's figures are, by its ``source`` (``contract.PROFILE_SOURCES``)
    and, for host ops, whether each op's precision came from its XLA instruction (``tool``)."""
    if source == "device_kernels":
        return (
            "GPU kernels (precision and Tensor Core use from the HLO each kernel runs where the "
            "trace holds it, else from its name)"
        )
    if source == "host_ops":
        if prof.get("tool") == XLA_HOST_TOOL:
            return "host ops (precision from each XLA op's HLO)"
        return "host ops (each op counted in its layer's dtype; no GPU kernels in the trace)"
    if source == "device_ops":
        return "device ops (each op counted in its layer's dtype; no kernel table)"
    return str(source)
