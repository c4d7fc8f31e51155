"""The ``train_step`` record: the train step's contract (who steps, who scales the loss)."""

from __future__ import annotations

from mpwatch.contract import schema as s
from mpwatch.contract.tags import KIND_TRAIN_STEP

_OPTIMIZER = s._obj(
    {
        "name": s._str(
            'how the model holds it: "optimizer" (the compiled one) or the attribute name '
            '("d_optimizer")'
        ),
        "class": s._str('its class: "Adam", "LossScaleOptimizer(Adam)"'),
        "compiled": s._bool("it is the optimizer given to compile() (model.optimizer)"),
        "loss_scaled": s._bool("a LossScaleOptimizer: it unscales and skips non-finite steps"),
        "iterations_start": s._int("its iterations when the fit began"),
        "iterations": s._int("its iterations when the record was written"),
        "loss_scale": s._num("its dynamic scale now (None: not loss-scaled)", nullable=True),
        "loss_scale_start": s._num(
            "its dynamic scale when the fit began (None: not loss-scaled): a LossScaleOptimizer "
            "that skipped every step never advanced its iterations, only its scale; absent from "
            "records written before it existed",
            nullable=True,
        ),
        "scale_loss_calls": s._int(
            "a LossScaleOptimizer's scale_loss calls in the train step's last trace (0: the "
            "loss it differentiates for this optimizer is not scaled); None: not seen (not a "
            "LossScaleOptimizer, or no trace watched); absent from records written before it "
            "existed",
            nullable=True,
        ),
        "epsilon": s._num(
            "the (inner) optimizer's epsilon, the floor of an adaptive optimizer's divisor "
            "(Adam's); None: it has none (SGD)",
            nullable=True,
        ),
        "family": s._str(
            "the Keras class the (inner) optimizer is or derives from (a subclass of Adam: "
            '"Adam"); its own class name when none is'
        ),
    },
    "one optimizer the model holds",
    required=[
        "name", "class", "compiled", "loss_scaled", "iterations_start", "iterations", "loss_scale",
    ],
)  # fmt: skip

#: the ``train_step`` record's payload schema
SCHEMA = s._record_schema(
    KIND_TRAIN_STEP,
    "The train step's contract (record/callbacks/train_step.py): where train_step is defined, "
    "whether the model has a forward pass of its own, and every optimizer it holds with whether it "
    "stepped and whether it scales the loss. Written when each fit starts and at each epoch's "
    "end and the fit's end (the latest wins).",
    {
        "custom_train_step": s._bool("train_step is the user's, not Keras' own"),
        "train_step_owner": s._str(
            "the class defining train_step (module.QualName), None for Keras' own", nullable=True
        ),
        "has_call": s._bool(
            "the model has a forward pass (Functional, Sequential, or a call() of its own); a "
            "GAN-style model whose train_step runs sub-models has none"
        ),
        "optimizers": s._t("array", "every optimizer the model holds", items=_OPTIMIZER),
    },
    ["custom_train_step", "train_step_owner", "has_call", "optimizers"],
)
