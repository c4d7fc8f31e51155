"""The record stage: what happens inside the user's ``fit``, in five wings.

- ``callbacks``: the Keras surface, one callback a file: ``monitor.MixedPrecisionMonitor`` (every
  part below in one callback), ``loss_scale``, ``gradient_health``, ``input_health``,
  ``layer_dtypes``, ``step_time``, ``train_step``, ``probe_monitor`` and ``profile_capture``, on
  ``base``; ``loop.TrainingLoopRecorder`` for custom training loops.
- ``runtime``: what one fit shares: the model's state (``state``), the cost budget (``budget``),
  the event writer (``writer``), resuming a run (``resume``), the backend seam (``backend``),
  mpwatch's compiled XLA programs (``program_cache``).
- ``tap``: the in-step taps (``tf_tap``, ``jax_tap``, ``tap_common``, ``jax_programs``), what the
  optimizer decided (``step_decision``), and their statistics (``stats``, ``lost_updates``,
  ``tf_chunks``, ``jax_blocks``).
- ``probe``: the float32-reference probe (``probe``, its backends ``probe_tf`` and ``probe_jax``,
  ``probe_payload``, ``probe_stats_each``, ``probe_memory``, the math in ``underflow``, the twin in
  ``twin``), its fix checks (``fix_check``, ``fix_gate``, ``op_overflow``) and float8 readiness
  (``float8``, ``float8_blocks``, ``float8_capture``).
- ``model``: static facts of the model (``memory``, ``layer_graph``, ``inputs``).
"""
