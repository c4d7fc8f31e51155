"""The names on disk: the plugin name, the schema version, every scalar tag and every record kind.

Scalars are ``tf.summary.scalar`` values under these ``mpwatch/...`` tags; each structured record is
written under ``mpwatch/record/<kind>`` (:func:`record_tag`).
"""

from __future__ import annotations

PLUGIN_NAME = "mpwatch"
SCHEMA_VERSION = 1
ENCODING = "json+zlib"
PREFIX = "mpwatch/"

# --- scalar tags -------------------------------------------------------------------------------
# loss scale and skipped steps (record/callbacks/loss_scale.py)
LOSS_SCALE = "mpwatch/loss_scale"  # dynamic_scale after each step; at 0: before the first
STEP_SKIPPED = "mpwatch/step_skipped"  # 1.0 at a step whose update was dropped, else 0.0
SKIPPED_STEPS = "mpwatch/skipped_steps"  # skipped steps in the log interval ending here
SKIPPED_STEPS_TOTAL = "mpwatch/skipped_steps_total"  # cumulative, across fit calls
# gradient health of the real (scaled) training gradients (record/callbacks/gradient_health.py)
GRAD_ZERO_FRACTION = "mpwatch/grad/zero_fraction"  # share of elements of g*S exactly 0
GRAD_SUBNORMAL_FRACTION = "mpwatch/grad/subnormal_fraction"  # 0 < |g*S| < 2**-14
GRAD_NONFINITE_COUNT = "mpwatch/grad/nonfinite_count"  # elements inf or nan
GRAD_MAX_ABS = "mpwatch/grad/max_abs"  # max |g*S| over finite elements
GRAD_HEADROOM_BITS = "mpwatch/grad/headroom_bits"  # log2(65504 / max|g*S|)
# speed and memory (record/callbacks/step_time.py)
STEP_TIME_MS = "mpwatch/perf/step_time_ms"  # median step time over the interval, ms per batch
PEAK_MEMORY_MB = "mpwatch/perf/peak_memory_mb"  # device peak (GPU) or process peak RSS (CPU), MiB
# training loss as Keras reports it (for comparing a mixed run with a float32 run)
TRAIN_LOSS = "mpwatch/train/loss"
# the probe against a float32 reference (record/probe/probe.py)
PROBE_UNDERFLOW_FRACTION = "mpwatch/probe/underflow_fraction"
PROBE_GRAD_REL_ERROR = "mpwatch/probe/grad_rel_error"
PROBE_RECOMMENDED_SCALE = "mpwatch/probe/recommended_scale"
PROBE_ACTIVATION_HEADROOM_BITS = "mpwatch/probe/activation_headroom_bits"
# per-batch input health, from the train step's own input (record/tap/tf_tap.py, jax_tap.py: the
# tap; record/callbacks/input_health.py)
INPUT_MAX_ABS = "mpwatch/input/max_abs"  # max |x| over the batch's finite float inputs
INPUT_NONFINITE_COUNT = "mpwatch/input/nonfinite_count"  # elements of the float inputs inf or nan
# updates lost to rounding in 16-bit variables (record/tap/lost_updates.py, gradient_health.py)
UPDATES_LOST_FRACTION = "mpwatch/updates/lost_fraction"  # unchanged / meant to move, model-wide

SCALAR_TAGS = (
    LOSS_SCALE,
    STEP_SKIPPED,
    SKIPPED_STEPS,
    SKIPPED_STEPS_TOTAL,
    GRAD_ZERO_FRACTION,
    GRAD_SUBNORMAL_FRACTION,
    GRAD_NONFINITE_COUNT,
    GRAD_MAX_ABS,
    GRAD_HEADROOM_BITS,
    STEP_TIME_MS,
    PEAK_MEMORY_MB,
    TRAIN_LOSS,
    PROBE_UNDERFLOW_FRACTION,
    PROBE_GRAD_REL_ERROR,
    PROBE_RECOMMENDED_SCALE,
    PROBE_ACTIVATION_HEADROOM_BITS,
    INPUT_MAX_ABS,
    INPUT_NONFINITE_COUNT,
    UPDATES_LOST_FRACTION,
)

#: what each scalar tag means. The ``mpwatch/probe/*`` scalars repeat four numbers of the ``probe``
#: record (model-wide underflow and gradient error, recommended scale, activation headroom) so that
#: TensorBoard's own Scalars tab can chart them; the judge, the reports and the tab read the record.
SCALAR_DOCS = {
    LOSS_SCALE: "`LossScaleOptimizer.dynamic_scale` after each step, the scale the next step "
    "uses; at step 0 the scale before the run's first step (its initial scale). mixed_float16 "
    "only",
    STEP_SKIPPED: "1.0 at a step whose update the optimizer dropped (non-finite gradients), "
    "else 0.0",
    SKIPPED_STEPS: "skipped steps in the logging interval ending at this step (a count, not a "
    "per-step flag)",
    SKIPPED_STEPS_TOTAL: "skipped steps since the run began, across `fit` calls",
    GRAD_ZERO_FRACTION: "share of the scaled training gradients' elements that are exactly 0",
    GRAD_SUBNORMAL_FRACTION: "share with 0 < \\|g·S\\| < 2^-14 (float16 subnormal)",
    GRAD_NONFINITE_COUNT: "gradient elements that are inf or NaN",
    GRAD_MAX_ABS: "max \\|g·S\\| over finite elements",
    GRAD_HEADROOM_BITS: "log2(65504 / max \\|g·S\\|): doublings left before float16 overflows",
    STEP_TIME_MS: "median step time over the logging interval, ms per batch",
    PEAK_MEMORY_MB: "peak device memory (GPU) or process peak RSS (CPU), MiB",
    TRAIN_LOSS: "the training loss as Keras reports it",
    PROBE_UNDERFLOW_FRACTION: "probe: model-wide underflow fraction at the scale used (also in the "
    "probe record)",
    PROBE_GRAD_REL_ERROR: "probe: model-wide gradient relative error against float32 (also in the "
    "probe record)",
    PROBE_RECOMMENDED_SCALE: "probe: the recommended loss scale (also in the probe record)",
    PROBE_ACTIVATION_HEADROOM_BITS: "probe: smallest activation headroom below 65504, in "
    "doublings (also in the probe record)",
    INPUT_MAX_ABS: "max \\|x\\| over the finite elements of the batch's floating-point inputs "
    "(the features the train step receives), at every step",
    INPUT_NONFINITE_COUNT: "elements of the batch's floating-point inputs that are inf or NaN, at "
    "every step",
    UPDATES_LOST_FRACTION: "share of the 16-bit variables' elements the step meant to move "
    "(nonzero gradient, step applied) whose value stayed the same: updates lost to rounding",
}

# --- record kinds (tag = "mpwatch/record/" + kind) ------------------------------------------------
KIND_RUN_INFO = "run_info"  # policy, loss-scale facts, versions, device, strategy (dict)
KIND_LAYERS = "layers"  # the per-layer dtype table (split table)
KIND_GRAD_VARIABLES = "grad_variables"  # per-variable gradient health (split table)
KIND_PROBE = "probe"  # probe results at one step (dict of tables, histogram, sweep)
KIND_PROFILE = "profile"  # profiler summary: per-layer time by dtype, op types (dict)
KIND_NOTICE = "notice"  # a recording part that stopped or is unavailable, and why (dict)
KIND_TRAIN_STEP = "train_step"  # the train step's contract: who steps, who scales (dict)
KIND_BUDGET = "budget"  # mpwatch's own cost in a fit, the budget's decisions (dict)
KIND_UPDATES = "updates"  # updates lost to rounding per 16-bit variable (split table)
KIND_MEMORY = "memory"  # training memory by kind and dtype, and under other policies (dict)

RECORD_KINDS = (
    KIND_RUN_INFO,
    KIND_LAYERS,
    KIND_GRAD_VARIABLES,
    KIND_PROBE,
    KIND_PROFILE,
    KIND_NOTICE,
    KIND_TRAIN_STEP,
    KIND_BUDGET,
    KIND_UPDATES,
    KIND_MEMORY,
)
RECORD_PREFIX = "mpwatch/record/"


def record_tag(kind: str) -> str:
    """The tag a record kind is written under."""
    if kind not in RECORD_KINDS:
        raise ValueError(f"unknown mpwatch record kind {kind!r}; known: {', '.join(RECORD_KINDS)}")
    return RECORD_PREFIX + kind


def kind_of_tag(tag: str) -> str | None:
    """The record kind of a tag, or None when the tag is no mpwatch record."""
    if tag.startswith(RECORD_PREFIX):
        kind = tag[len(RECORD_PREFIX) :]
        return kind if kind in RECORD_KINDS else None
    return None
