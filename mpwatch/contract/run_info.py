"""The ``run_info`` record: the run's facts (policy, loss scale, model, versions, device)."""

from __future__ import annotations

from mpwatch.contract import schema as s
from mpwatch.contract.tags import KIND_RUN_INFO

#: the ``run_info`` record's payload schema
SCHEMA = s._record_schema(
    KIND_RUN_INFO,
    "The run's facts, written when each fit starts (record/callbacks/monitor.py: run_info).",
    {
        "policy": s._str("the model's dtype policy: mixed_float16, mixed_bfloat16, float32, ..."),
        "compute_dtype": s._str(s._DTYPE),
        "variable_dtype": s._str(s._DTYPE),
        "loss_scale": s._obj(
            {
                "kind": s._enum(["dynamic", "none"]),
                "reason": s._str("why there is none", nullable=True),
                "initial": s._num("the initial scale", nullable=True),
                "growth_interval": s._int("steps between doublings", nullable=True),
            },
            "the loss scale's facts",
        ),
        "model": s._obj(
            {
                "name": s._str(),
                "class": s._str(),
                "kind": s._enum(s._MODEL_KIND),
                "params": s._int("parameters"),
            },
            "the model",
        ),
        "optimizer": s._str('"LossScaleOptimizer(Adam)", or the optimizer\'s class'),
        "backend": s._enum(
            ["tensorflow", "jax"], "Keras' backend (absent in older records: tensorflow)"
        ),
        "strategy": s._str(
            "the tf.distribute strategy's class (TensorFlow), the keras.distribution's class or "
            '"None" (JAX)'
        ),
        "num_replicas": s._int("replicas in sync"),
        "steps_per_execution": s._int("batches per train-function call"),
        "batch_size": s._int("Keras' batch size (None when unknown)", nullable=True),
        "log_every": s._int("interval of the interval scalars and the gradient health, steps"),
        "chief": s._bool("this process writes (the chief under multi-worker training)"),
        "start": s._obj(
            {
                "iterations": s._int("the optimizer's iterations"),
                "loss_scale": s._num("the loss scale", nullable=True),
            },
            "the optimizer's state before the fit's first batch (the record's step is the step "
            "before it): how a resumed run finds its step (record/runtime/resume.py)",
            nullable=True,
        ),
        "device": s._obj(
            {
                "type": s._enum(["GPU", "CPU"]),
                "name": s._str(),
                "compute_capability": s._str('"8.0" (None on a CPU)', nullable=True),
                "tensor_cores": s._bool(),
            },
            "the device trained on",
        ),
        "versions": s._obj(
            {
                "mpwatch": s._str(),
                "keras": s._str(),
                "tensorflow": s._str("None where TensorFlow is not in play", nullable=True),
                "jax": s._str("None where JAX is not in play", nullable=True),
            },
            "library versions",
            required=["mpwatch", "keras", "tensorflow"],
        ),
        "preflight": s._obj(
            {
                "of": s._str("the policy the model was built under"),
                "float32_layers": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "layers kept in float32 (a change the pre-flight applied)",
                },
                "scale": s._num("the probe's loss scale (1 without one)"),
            },
            "a pre-flight's candidate (mpwatch.preflight): no fit ran; the model built under "
            "`of` seen under `policy` on one batch. Absent in a fit's record",
            nullable=True,
            required=["of", "float32_layers", "scale"],
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
