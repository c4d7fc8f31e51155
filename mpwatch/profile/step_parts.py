"""Op name → a named part of the training step, for time no layer owns.

Besides the layers' forward and backward passes a training step runs the optimizer's update, the
loss scaling of a ``LossScaleOptimizer`` (the finite check of the gradients, the scale's update,
the apply-or-skip ``cond``), the loss, the metrics and the input's cast or transfer
(TensorFlow's ``Iterator::`` input pipeline, the ``XLA_Args`` a jit_compile'd step's arguments
are handed in by).
:func:`step_part` names the part an op name belongs to (JAX names of Keras 3 on JAX,
``jit(train_step)/cond/branch_1_fun/adam/...``, and TensorFlow scopes); :func:`part_of_state`
the part a Keras-on-JAX train step's state argument belongs to (``state[2][k]`` optimizer
variables, ``state[3][k]`` metrics variables, ``data[k]`` the batch).

Example:
    >>> step_part("jit(train_step)/cond/branch_1_fun/adam/sqrt")
    'optimizer update'
    >>> step_part("jit(train_step)/reduce_and"), step_part("jit(train_step)/jvp(compile_loss)/mul")
    ('loss scaling', 'loss')
    >>> step_part("IsFinite_5"), step_part("Iterator::Root::Prefetch"), step_part("XLA_Args")
    ('loss scaling', 'input', 'input')
    >>> step_part("jit(train_step)/jvp(conv2d)/add") is None
    True
"""

from __future__ import annotations

import re

__all__ = ["PARTS", "step_part", "part_of_state", "OPTIMIZER", "LOSS_SCALING"]

OPTIMIZER = "optimizer update"
LOSS_SCALING = "loss scaling"
LOSS = "loss"
METRICS = "metrics"
INPUT = "input"
#: the named parts of a step, in the order reports list them
PARTS = (OPTIMIZER, LOSS_SCALING, LOSS, METRICS, INPUT)

_OPTIMIZERS = (
    r"adam|adamw|sgd|rmsprop|adagrad|adadelta|adamax|nadam|ftrl|lion|lamb|adafactor|muon|"
    r"optimizer|apply_gradients|resourceapply\w*"
)
_OPTIMIZER = re.compile(rf"(?:^|[/(])(?:{_OPTIMIZERS})(?:_\d+)?(?:[/)]|$)", re.I)
_LOSS_SCALING = re.compile(
    r"(?:^|[/(])(?:loss_scale_optimizer|is_finite|isfinite|reduce_and|all_finite|cond)(?:_\d+)?"
    r"(?:[/)]|$)",
    re.I,
)
_LOSS = re.compile(
    r"(?:^|[/(])(?:compile_loss|loss|\w*_loss|\w*crossentropy\w*)(?:_\d+)?(?:[/)]|$)", re.I
)
_METRICS = re.compile(
    r"(?:^|[/(])(?:compile_metrics|metrics|\w*_metric\w*)(?:_\d+)?(?:[/)]|$)", re.I
)
_INPUT = re.compile(
    r"(?:^|[/(])(?:IteratorGetNext|iterator_get_next|data_adapter|input_pipeline)(?:/|$)|"
    r"^Iterator::|^XLA_Args$|"
    r"^jit\(\w+\)/jvp\(\)/convert_element_type$",
    re.I,
)
_STATE = re.compile(r"^(state|data)\[(\d+)\]")


def step_part(op_name: str) -> str | None:
    """The part of the step an op name belongs to (:data:`PARTS`), or None (a layer's, or no
    part's). The optimizer's scope wins over the loss scaling's ``cond`` around it."""
    name = str(op_name or "")
    if not name:
        return None
    if _OPTIMIZER.search(name):
        return OPTIMIZER
    if _LOSS.search(name):
        return LOSS
    if _METRICS.search(name):
        return METRICS
    if _LOSS_SCALING.search(name) and "jvp(" not in name:  # the step's own, not a layer's cond
        return LOSS_SCALING
    if _INPUT.search(name):
        return INPUT
    return None


def part_of_state(op_name: str) -> str | None:
    """The part a Keras-on-JAX train step's argument belongs to, by its HLO parameter's op name:
    ``state[2][k]`` the optimizer's variables, ``state[3][k]`` the metrics' variables,
    ``data[k]`` the batch (None otherwise: the model's own variables).

    >>> part_of_state("state[3][1]"), part_of_state("state[0][4]"), part_of_state("data[0]")
    ('metrics', None, 'input')
    """
    m = _STATE.match(str(op_name or ""))
    if not m:
        return None
    if m.group(1) == "data":
        return INPUT
    return {2: OPTIMIZER, 3: METRICS}.get(int(m.group(2)))
