"""The ``probe`` record: the probe against a float32 reference at one step, its tables' columns
(variables, layers, inputs, the scale sweep) and their types."""

from __future__ import annotations

from typing import Any

from mpwatch.contract import schema as s
from mpwatch.contract.tags import KIND_PROBE

# Column names of the record's tables, in order (writers build rows in this order).
PROBE_VARIABLE_COLUMNS = [
    "variable",
    "layer",
    "size",
    "ref_nonzero",
    "underflow_count",
    "underflow_fraction",
    "grad_rel_error",
    "ref_max_abs",
]
PROBE_LAYER_COLUMNS = [
    "layer",
    "ref_nonzero",
    "underflow_count",
    "underflow_fraction",
    "grad_rel_error",
    "output_rel_error",
    "max_abs_activation",
    "activation_headroom_bits",
    "act_grad_underflow_fraction",
    "nonfinite",
]
PROBE_INPUT_COLUMNS = [
    "input",
    "dtype",
    "size",
    "integer_valued",
    "max_abs",
    "consumers",
    "cast_to",
    "changed",
]
PROBE_SWEEP_COLUMNS = [
    "scale_log2",
    "scale",
    "predicted_underflow_fraction",
    "predicted_overflow_fraction",
]

_NO_REF = " (None without a float32 reference)"

PROBE_VARIABLE_COLUMN_TYPES: dict[str, Any] = {
    "variable": s._str("the variable's path"),
    "layer": s._str("the name of the layer owning it"),
    "size": s._int("elements"),
    "ref_nonzero": s._int("elements nonzero in the reference gradient" + _NO_REF, nullable=True),
    "underflow_count": s._int("of those, zero in the mixed gradient" + _NO_REF, nullable=True),
    "underflow_fraction": s._num("underflow_count / ref_nonzero" + _NO_REF, nullable=True),
    "grad_rel_error": s._num("||mixed - reference|| / ||reference||" + _NO_REF, nullable=True),
    "ref_max_abs": s._num(
        "max |reference gradient| (unscaled; None without a float32 reference or in records "
        "written before it existed): the train-step rule compares it with what the optimizer "
        "receives",
        nullable=True,
    ),
}
PROBE_LAYER_COLUMN_TYPES: dict[str, Any] = {
    "layer": s._str("the layer's name"),
    "ref_nonzero": s._int("over the layer's variables" + _NO_REF, nullable=True),
    "underflow_count": s._int("over the layer's variables" + _NO_REF, nullable=True),
    "underflow_fraction": s._num("over the layer's variables" + _NO_REF, nullable=True),
    "grad_rel_error": s._num("over the layer's variables" + _NO_REF, nullable=True),
    "output_rel_error": s._num("relative error of the layer's output" + _NO_REF, nullable=True),
    "max_abs_activation": s._num("max |output| of the mixed pass (None: not measured)", True),
    "activation_headroom_bits": s._num("log2(format max / max_abs_activation)", nullable=True),
    "act_grad_underflow_fraction": s._num(
        "underflow of the gradient w.r.t. the layer's output (None: not measured)", nullable=True
    ),
    "nonfinite": s._int("non-finite activation and gradient elements"),
}
PROBE_FLOAT8_COLUMNS = [
    "layer",
    "class",
    "keras_path",
    "out_error_16",
    "out_error_8",
    "dx_error_16",
    "dx_error_8",
    "dw_error_16",
    "dw_error_8",
    "x_flush",
    "w_flush",
    "g_flush",
    "ready",
    "reason",
]
_ERR = (
    "relative error against the layer in float32 on the same inputs (output and dx: the mean "
    "over rows of each row's ||a - ref|| / ||ref||; dW: over the tensor)"
)
PROBE_FLOAT8_COLUMN_TYPES: dict[str, Any] = {
    "layer": s._str("the layer's path"),
    "class": s._str("Dense or EinsumDense"),
    "keras_path": s._str(
        "the layer's own path in Keras (layer.path: what quantize's filters can match where "
        "names repeat, e.g. each attention block's query)",
        nullable=True,
    ),
    "out_error_16": s._num(f"its output before the activation in the run's 16-bit dtype: {_ERR}"),
    "out_error_8": s._num(f"the same in Keras' float8 (E4M3 inputs and kernel): {_ERR}"),
    "dx_error_16": s._num(f"the gradient w.r.t. its input in 16 bits: {_ERR}"),
    "dx_error_8": s._num(f"the same in float8 (E5M2 output gradient): {_ERR}"),
    "dw_error_16": s._num(f"the gradient w.r.t. its kernel in 16 bits: {_ERR}"),
    "dw_error_8": s._num(f"the same in float8: {_ERR}"),
    "x_flush": s._num("share of its nonzero inputs float8 flushes to zero at their scale"),
    "w_flush": s._num("share of its nonzero kernel elements flushed to zero"),
    "g_flush": s._num("share of its nonzero output-gradient elements flushed to zero (E5M2)"),
    "ready": s._bool(
        "float8 changes the output and both gradients within the readiness bounds of the run's "
        "own 16-bit values (the errors against float32 where those are close to float32's)"
    ),
    "reason": s._str("why it is not ready (None when ready)", nullable=True),
}

PROBE_INPUT_COLUMN_TYPES: dict[str, Any] = {
    "input": s._str("the model input's name"),
    "dtype": s._str("the dtype the batch holds it in"),
    "size": s._int("elements in the probe batch"),
    "integer_valued": s._bool("every finite value is an integer (token ids, class ids)"),
    "max_abs": s._num("largest |value| (None: no finite value)", nullable=True),
    "consumers": s._t(
        "array", "the layers that cast it to 16 bits on entry (autocast)", items=s._str()
    ),
    "cast_to": s._str("the 16-bit dtype they cast it to (None: none does)", nullable=True),
    "changed": s._int("values that cast changes (numpy, exact)"),
}
PROBE_SWEEP_COLUMN_TYPES: dict[str, Any] = {
    "scale_log2": s._int("log2 of the loss scale"),
    "scale": s._num("the loss scale"),
    "predicted_underflow_fraction": s._num("share of reference gradients that would underflow"),
    "predicted_overflow_fraction": s._num("share that would overflow"),
}

_PROBE_MODEL = s._obj(
    {
        "ref_nonzero": s._int("reference gradient elements nonzero" + _NO_REF, nullable=True),
        "underflow_count": s._int("of those, zero in the mixed gradient" + _NO_REF, nullable=True),
        "underflow_fraction": s._num("underflow_count / ref_nonzero" + _NO_REF, nullable=True),
        "grad_rel_error": s._num("gradient relative error" + _NO_REF, nullable=True),
        "max_abs_activation": s._num("max |activation| (None: none measured)", nullable=True),
        "first_nonfinite_layer": s._str(
            'the first layer (forward order) with a non-finite output, or "loss"', nullable=True
        ),
        "size": s._int("gradient elements"),
        "nonfinite": s._int("non-finite gradient elements"),
        "loss": s._num("the mixed model's loss on the probe batch"),
        "ref_loss": s._num("the reference's loss" + _NO_REF, nullable=True),
        "train_loss": s._num(
            "the loss Keras' train step computes on the probe batch with the same weights (the "
            "model's own call in training mode; the probe's own-policy pass itself where the "
            "model's call is Keras' own run of its layer graph); compared with the probe's "
            "own-policy pass"
        ),
        "activation_headroom_bits": s._num("log2(format max / max_abs_activation)", nullable=True),
        "zero_fraction": s._num(
            "written only without a float32 reference: the share of exactly-zero mixed gradient "
            "elements (an upper bound of underflow that includes genuine zeros)"
        ),
        "max_abs_ref_grad": s._num(
            "float16 and pre-flight modes: the max |reference gradient| the recommended scale "
            "was derived from"
        ),
        "margin_bits": s._num(
            "float16 and pre-flight modes: the headroom the recommendation keeps"
        ),
    },
    "model-wide results",
    required=[
        "ref_nonzero",
        "underflow_count",
        "underflow_fraction",
        "grad_rel_error",
        "max_abs_activation",
        "first_nonfinite_layer",
        "size",
        "nonfinite",
        "loss",
        "ref_loss",
        "activation_headroom_bits",
    ],
)

#: the ``probe`` record's payload schema
SCHEMA = s._record_schema(
    KIND_PROBE,
    "The probe against a float32 reference at one step (record/probe/probe_payload.py: build).",
    {
        "mode": s._enum(
            ["float16", "bfloat16", "preflight"],
            "mixed_float16, mixed_bfloat16, or a float32 model probed as mixed_float16",
        ),
        "loss_scale": s._num(
            "the scale S the mixed gradients were taken at (None: bfloat16)", True
        ),
        "reference": s._enum(
            ["float32_twin", "none"],
            "what the mixed gradients are compared to: float32_twin is the same model and "
            "weights with its mixed layers switched to float32 (record/probe/twin.py)",
        ),
        "training_mode": s._obj(
            {
                "scale": s._num("the loss scale of the pass: the largest a step skipped at"),
                "finite": s._bool("the pass, Dropout on, is finite"),
                "first_nonfinite_layer": s._str(
                    'where it is not (a layer, "loss", "gradients")', nullable=True
                ),
                "float32_layers": s._t("array", "the layer tried in float32", items=s._str()),
                "fixed": s._bool(
                    "that layer in float32 made the same draw finite (None: none tried); a "
                    "pre-flight's: made most draws that were not finite finite",
                    nullable=True,
                ),
                "draws": s._int("a pre-flight's: draws of the random masks at the scale"),
                "nonfinite_draws": s._int("a pre-flight's: the draws not finite"),
                "fixed_draws": s._int(
                    "a pre-flight's: the draws not finite made finite by the layer in float32"
                ),
            },
            "float16 probes whose own pass was finite while steps skipped since the last probe: "
            "the pass as the train step runs it, Dropout and other random layers on, one draw "
            "(record/probe/fix_check.py: check_training_mode); a pre-flight's first probes "
            "(launch/candidate.py: _training_pass): a few draws",
            required=["scale", "finite", "first_nonfinite_layer", "float32_layers", "fixed"],
        ),
        "op_overflows": s._t(
            "array",
            "float16 probes: the op that overflows inside each layer whose output is far off "
            "float32 (record/probe/op_overflow.py), each layer once a fit",
            items=s._obj(
                {
                    "layer": s._str("the layer"),
                    "op": s._str("the op (TensorFlow's op type, JAX's primitive)"),
                    "source": s._str("the user's file:line that made it", nullable=True),
                    "dtype": s._str("its output's dtype", nullable=True),
                    "input_max_abs": s._num("the largest |value| going into it", nullable=True),
                    "layer_output_finite": s._bool("the layer's output is finite all the same"),
                },
                "the first op whose output is not finite while its inputs are",
            ),
        ),
        "fix_checks": s._t(
            "array",
            "written when the forward pass went non-finite (TensorFlow): each candidate fix "
            "re-run on the same batch and weights (record/probe/fix_check.py), in order",
            items=s._obj(
                {
                    "fix": s._enum(
                        [
                            "none", "float32_layers", "normalize_inputs", "normalize_target",
                            "stopped",
                        ],
                        "none: the pass as it is (the first entry); normalize_target: the "
                        "batch's regression target standardised, the inputs as they are; "
                        "stopped: the last entry when mpwatch's cost budget stopped the checks "
                        "before their end (what follows in the order was not checked)",
                    ),
                    "reason": s._str("why the checks stopped (the stopped entry only)"),
                    "layers": s._t("array", "the layers kept float32", items=s._str()),
                    "finite": s._bool("the pass (activations, loss, scaled gradients) is finite"),
                    "in_range": s._bool(
                        "finite, and the 16-bit activations stay 2^3 below float16's maximum"
                    ),
                    "first_nonfinite_layer": s._str(
                        'where it is still not finite (a layer, "loss", "gradients"), or None',
                        nullable=True,
                    ),
                    "max_abs_activation_16bit": s._num("max finite |activation| of 16-bit layers"),
                    "loss": s._num("the loss with the fix (None: not finite)", nullable=True),
                    "target": s._obj(
                        {
                            "mean": s._num("the target's mean over the batch"),
                            "std": s._num("its standard deviation over the batch"),
                            "max_abs": s._num("its largest |y|"),
                        },
                        "normalize_target only: the target as it was (its column farthest from "
                        "zero)",
                    ),
                },
                "one candidate fix and what it did (the stopped entry: fix, layers, reason)",
                required=["fix", "layers"],
            ),
        ),
        "grad_fix_checks": s._t(
            "array",
            "written when a layer's gradient error stands out (float16, bfloat16): the pass "
            "re-run with that layer in float32 (record/probe/fix_check.py: check_gradient_fixes)",
            items=s._obj(
                {
                    "layer": s._str("the layer kept in float32 (with every layer under it)"),
                    "before": s._num("its gradient relative error as it is"),
                    "after": s._num("its gradient relative error in float32", nullable=True),
                    "error": s._str(
                        "why the pass with the layer in float32 could not run (absent when it ran)"
                    ),
                    "skipped": s._str(
                        "why this layer was not checked: mpwatch's cost budget stopped the "
                        "checks (absent when it ran)"
                    ),
                },
                "one layer checked",
                required=["layer", "before", "after"],
            ),
        ),
        "reliable": s._bool(
            "the probe's loss agrees with the train step's loss on the same batch and weights "
            "(None: cannot be checked, e.g. a custom train_step); False: no finding rests on it",
            nullable=True,
        ),
        "unreliable_reason": s._str("why the probe is not (known to be) reliable", nullable=True),
        "random_layers_off": s._t(
            "array",
            "layers with random draws (Dropout, noise, augmentation) run as in inference in both "
            "passes; every other layer runs in training mode (BatchNormalization on batch "
            "statistics, its state restored afterwards)",
            items=s._str(),
        ),
        "batch": s._obj(
            {
                "size": s._int("the probe batch's leading dimension", nullable=True),
                "source": s._enum(
                    ["training", "probe_data"],
                    "training: the first batch the training loop fed (its size is the training "
                    "batch size); probe_data: given by the user",
                ),
                "sub_batch_of": s._int(
                    "the batch's size where the probe ran on its first examples only: the whole "
                    "batch would not fit the device's free memory (record/probe/probe_memory.py)",
                    nullable=True,
                ),
            },
            "the probe batch",
            required=["size", "source"],
        ),
        "inputs": s._table_schema(
            PROBE_INPUT_COLUMNS,
            PROBE_INPUT_COLUMN_TYPES,
            "one row per float model input: integer ids a 16-bit cast rounds "
            "(record/model/inputs.py)",
        ),
        "float8": s._table_schema(
            PROBE_FLOAT8_COLUMNS,
            PROBE_FLOAT8_COLUMN_TYPES,
            "float8 readiness: one row per Dense/EinsumDense layer, its errors in Keras' float8 "
            "and in 16 bits on the probe's batch (record/probe/float8.py)",
        ),
        "reference_note": s._str("how the reference was made, or why there is none", True),
        "model_kind": s._enum(s._MODEL_KIND, "how the model was built (a twin needs its config)"),
        "variables": s._table_schema(
            PROBE_VARIABLE_COLUMNS, PROBE_VARIABLE_COLUMN_TYPES, "one row per trainable variable"
        ),
        "layers": s._table_schema(
            PROBE_LAYER_COLUMNS, PROBE_LAYER_COLUMN_TYPES, "one row per layer"
        ),
        "model": _PROBE_MODEL,
        "histogram": s._obj(
            {
                "edges_log2": s._t("array", "bin edges, log2 of |gradient|", items=s._num()),
                "counts": s._t("array", "elements per bin (len(edges_log2) - 1)", items=s._int()),
                "zeros": s._int("elements exactly 0"),
                "window_log2": s._t(
                    "array",
                    "the format's window in log2 of the unscaled gradient (shifted by -log2 S)",
                    items=s._num(),
                    minItems=2,
                    maxItems=2,
                ),
                "source": s._enum(
                    ["reference", "mixed_unscaled"],
                    "whose gradients: the float32 reference's, or the mixed ones without one",
                ),
            },
            "log2 histogram of the gradients against the format's window",
        ),
        "sweep": s._table_schema(
            PROBE_SWEEP_COLUMNS,
            PROBE_SWEEP_COLUMN_TYPES,
            "predicted underflow and overflow at each power-of-two scale (empty under bfloat16)",
        ),
        "recommended_scale": s._num("a loss scale to use (None: bfloat16, or none fits)", True),
        "memory": s._obj(
            {
                "need_bytes": s._int(
                    "what the probe needs beyond the training's state (None: not known)", True
                ),
                "need_from": s._str("how: XLA's memory analysis of its program, or an estimate"),
                "free_bytes": s._int(
                    "the device's free memory before the probe (None: not reported, a CPU)", True
                ),
                "free_from": s._str("where the free figure came from"),
            },
            "mpwatch's own memory: the probe's need beside the device's free memory "
            "(record/probe/probe_memory.py); a probe that would not fit is skipped, not recorded",
            nullable=True,
        ),
    },
    [
        "mode",
        "loss_scale",
        "reference",
        "reference_note",
        "model_kind",
        "variables",
        "layers",
        "model",
        "histogram",
        "sweep",
        "recommended_scale",
    ],
    {  # no reference: model.zero_fraction is what can be measured
        "if": {"required": ["reference"], "properties": {"reference": {"const": "none"}}},
        "then": {"properties": {"model": {"required": ["zero_fraction"]}}},
    },
    {  # a loss scale to recommend: what it was derived from
        "if": {"required": ["mode"], "properties": {"mode": {"enum": ["float16", "preflight"]}}},
        "then": {"properties": {"model": {"required": ["max_abs_ref_grad", "margin_bits"]}}},
    },
)
