"""Profile: a profiler trace → per-layer time by the precision it ran in, Tensor Core use on a GPU.

The path of a trace (``<logdir>/plugins/profile/<run>/<host>.xplane.pb``, written by
``tf.profiler`` or ``jax.profiler``) to the ``profile`` record, one module a step:

- ``traces``: finding a run's traces, xprof's converter on a copy, the op table
  (:func:`op_table`; XLA's CPU ops: ``xla_op_table``) and the GPU kernel table
  (:func:`kernel_table`), op names from the trace's HLO metadata (``HloIndex``);
- ``xplane``: the XSpace protobuf read without TensorFlow (planes, events, HLO metadata);
- ``hlo``: a compiled program's HLO (instructions, operands, fused computations, op names);
- ``hlo_kernels``: a GPU kernel → the HLO instruction it runs → its precision, Tensor Core use
  (with the GPU's compute capability), casts and op names (:data:`HLO_COLUMNS`);
- ``step_parts``: op name → a named part of the step (optimizer update, loss scaling, loss,
  metrics, input);
- ``kernel_truth``: the HLO's word over the name's, and every kernel's owner (a layer or a part);
- ``kernel_patterns``: the catalogue of GPU kernel name families and type tokens;
- ``kernel_classes``: a kernel's precision and Tensor Core use from its name (the rules,
  ``docs/kernels.md``);
- ``attribution``: op name → layer (TensorFlow scopes, JAX scopes) and direction;
- ``ops``: op time per layer by precision, the cost of casts (:func:`layer_time`);
- ``kernel_time``: GPU kernel time per layer and for the run (:func:`kernel_time`);
- ``summary``: trace + model → the record payload (:func:`summarize`).

The record stage (``record/callbacks/profile_capture.py``) calls :func:`summarize` with the model;
the reader (``read/traces.py``) calls it without one for a run that holds a raw trace and no profile
record.

Example (the trace needs xprof; the op name nothing):
    >>> from mpwatch import profile
    >>> profile.op_name_direction("jit(train_step)/transpose(jvp(dense))/dot_general")
    'backward'
    >>> payload = profile.summarize("logs/run1", model)  # doctest: +SKIP
    >>> payload["source"], payload["share_16bit"], payload["kernel_summary"]  # doctest: +SKIP
"""

from mpwatch.profile.attribution import (
    LayerInfo,
    attribute_kernels,
    attribute_ops,
    describe_model,
    is_jax_op_name,
    jax_scopes,
    match_scopes,
    op_name_direction,
    scope_candidates,
)
from mpwatch.profile.hlo_kernels import HLO_COLUMNS
from mpwatch.profile.kernel_time import (
    LAYER_KERNEL_COLUMNS,
    KernelProfile,
    is_matmul_or_conv,
    kernel_time,
)
from mpwatch.profile.ops import AMP_FLOAT32_OPS, ProfileResult, layer_time
from mpwatch.profile.summary import summarize, summarize_kernels
from mpwatch.profile.traces import (
    KERNEL_COLUMNS,
    ProfileError,
    find_traces,
    kernel_table,
    op_table,
)

__all__ = [
    "AMP_FLOAT32_OPS",
    "HLO_COLUMNS",
    "KERNEL_COLUMNS",
    "LAYER_KERNEL_COLUMNS",
    "KernelProfile",
    "LayerInfo",
    "ProfileError",
    "ProfileResult",
    "attribute_kernels",
    "attribute_ops",
    "describe_model",
    "find_traces",
    "is_jax_op_name",
    "is_matmul_or_conv",
    "jax_scopes",
    "kernel_table",
    "kernel_time",
    "layer_time",
    "match_scopes",
    "op_name_direction",
    "op_table",
    "scope_candidates",
    "summarize",
    "summarize_kernels",
]
