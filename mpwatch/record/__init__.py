"""The record stage: what happens inside the user's ``fit``.

- The Keras callbacks, one a file: ``monitor.MixedPrecisionMonitor`` (every part below in one
  callback), ``loss_scale``, ``gradient_health``, ``input_health``, ``layer_dtypes``,
  ``step_time``, ``train_step``, ``probe_monitor`` and ``profile_capture``, on ``base``.
- What one fit shares: the model's state (``state``), the cost budget (``budget``), the event
  writer (``writer``), resuming a run (``resume``), the backend seam (``backend``).
- The in-step taps (``tf_tap``, ``jax_tap``, ``tap_common``, the statistics ``stats``).
- The float32-reference probe (``probe*``, ``twin``, ``underflow``, ``tf_chunks``,
  ``jax_blocks``, ``fix_check``, ``fix_gate``, ``float8*``, ``program_cache``).
- Static model facts (``memory``, ``layer_graph``).
"""
