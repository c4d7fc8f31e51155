"""The ``run_info`` record: the run's facts (policy, loss scale, model, versions, device)."""

from __future__ import annotations

from mpwatch.contract.schema import (
    _DTYPE,
    _MODEL_KIND,
    _bool,
    _enum,
    _int,
    _num,
    _obj,
    _record_schema,
    _str,
)
from mpwatch.contract.tags import KIND_RUN_INFO

#: the ``run_info`` record's payload schema
SCHEMA = _record_schema(
    KIND_RUN_INFO,
    "The run's facts, written when each fit starts (record/monitor.py: run_info).",
    {
        "policy": _str("the model's dtype policy: mixed_float16, mixed_bfloat16, float32, ..."),
        "compute_dtype": _str(_DTYPE),
        "variable_dtype": _str(_DTYPE),
        "loss_scale": _obj(
            {
                "kind": _enum(["dynamic", "none"]),
                "reason": _str("why there is none", nullable=True),
                "initial": _num("the initial scale", nullable=True),
                "growth_interval": _int("steps between doublings", nullable=True),
            },
            "the loss scale's facts",
        ),
        "model": _obj(
            {
                "name": _str(),
                "class": _str(),
                "kind": _enum(_MODEL_KIND),
                "params": _int("parameters"),
            },
            "the model",
        ),
        "optimizer": _str('"LossScaleOptimizer(Adam)", or the optimizer\'s class'),
        "backend": _enum(
            ["tensorflow", "jax"], "Keras' backend (absent in older records: tensorflow)"
        ),
        "strategy": _str(
            "the tf.distribute strategy's class (TensorFlow), the keras.distribution's class or "
            '"None" (JAX)'
        ),
        "num_replicas": _int("replicas in sync"),
        "steps_per_execution": _int("batches per train-function call"),
        "batch_size": _int("Keras' batch size (None when unknown)", nullable=True),
        "log_every": _int("interval of the interval scalars and the gradient health, steps"),
        "chief": _bool("this process writes (the chief under multi-worker training)"),
        "start": _obj(
            {
                "iterations": _int("the optimizer's iterations"),
                "loss_scale": _num("the loss scale", nullable=True),
            },
            "the optimizer's state before the fit's first batch (the record's step is the step "
            "before it): how a resumed run finds its step (record/resume.py)",
            nullable=True,
        ),
        "device": _obj(
            {
                "type": _enum(["GPU", "CPU"]),
                "name": _str(),
                "compute_capability": _str('"8.0" (None on a CPU)', nullable=True),
                "tensor_cores": _bool(),
            },
            "the device trained on",
        ),
        "versions": _obj(
            {
                "mpwatch": _str(),
                "keras": _str(),
                "tensorflow": _str("None where TensorFlow is not in play", nullable=True),
                "jax": _str("None where JAX is not in play", nullable=True),
            },
            "library versions",
            required=["mpwatch", "keras", "tensorflow"],
        ),
    },
    [
        "policy",
        "compute_dtype",
        "variable_dtype",
        "loss_scale",
        "model",
        "optimizer",
        "strategy",
        "num_replicas",
        "steps_per_execution",
        "batch_size",
        "log_every",
        "chief",
        "start",
        "device",
        "versions",
    ],
)
