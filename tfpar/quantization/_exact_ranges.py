"""`quantize(ranges="exact")`: activation ranges from the min and max over the global batch.

TFMOT's moving-average quantizers update each range variable with
``assign_moving_average(var, batch_min_or_max, decay)``, which, under a strategy, averages the
replicas' values: each replica saw only its part of the batch, so the range is not the one a
single device would measure. Here the value is first replaced by its cross-replica MIN (for a
``*_min`` variable) or MAX (``*_max``), gathered from every replica; the average of equal values
is that value, so the ranges, and QAT's training, are those of one device on the global batch.

TFMOT's quant_ops module reaches ``assign_moving_average`` through its ``tf`` name; it gets a
view of TensorFlow whose ``__internal__.train.assign_moving_average`` does the above for the
variables `enable` marked and is TensorFlow's own for every other one.
"""

import types

from tfpar._keras import tf

__all__ = ["enable"]

_MARK = "_tfpar_cross_replica_extreme"


def enable(model):
    """Marks ``model``'s quantizer range variables for cross-replica MIN / MAX updates."""
    _install()
    for variable in model.non_trainable_variables:
        name = variable.name.split(":")[0]
        if name.endswith(("_min", "_max")):
            setattr(variable, _MARK, name[-3:])


def _assign_moving_average(variable, value, decay, zero_debias=True, name=None):
    extreme = getattr(variable, _MARK, None)
    context = tf.distribute.get_replica_context()
    if extreme is not None and context is not None and context.num_replicas_in_sync > 1:
        gathered = context.all_gather(tf.expand_dims(value, 0), axis=0)
        value = tf.reduce_min(gathered, axis=0) if extreme == "min" else tf.reduce_max(gathered, axis=0)
    return tf.__internal__.train.assign_moving_average(variable, value, decay, zero_debias=zero_debias, name=name)


class _View(types.ModuleType):
    """A module that answers with ``base``'s attributes, but for those given."""

    def __init__(self, base, **overrides):
        super().__init__(base.__name__)
        self.__dict__.update(overrides)
        self._base = base

    def __getattr__(self, name):
        return getattr(self._base, name)


def _install():
    from tensorflow_model_optimization.python.core.quantization.keras import quant_ops

    if isinstance(quant_ops.tf, _View):
        return
    train = _View(tf.__internal__.train, assign_moving_average=_assign_moving_average)
    quant_ops.tf = _View(tf, __internal__=_View(tf.__internal__, train=train))
