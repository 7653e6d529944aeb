"""`quantize(ranges="exact")`: activation ranges from the min and max over the global batch.

TFMOT's activation quantizers update their range variables from each batch's min and max: the
moving-average ones with ``assign_moving_average(var, value, decay)``, the all-values one (the
model's input) with ``assign(var, min(var, value))``. Under a strategy the first averages the
replicas' values and the second assigns a MEAN-aggregated variable: each replica saw only its part
of the batch, so the range is not the one a single device would measure. Here the value is first
replaced by its cross-replica MIN (for a ``*_min`` variable) or MAX (``*_max``), gathered from every
replica; the average of equal values is that value, so the ranges, and QAT's training, are those
of one device on the global batch. (Weight ranges, TFMOT's last-value quantizers, come from the
mirrored weights: equal on every replica already, they are left alone.)

TFMOT's quant_ops module reaches both functions through its ``tf`` and ``tf_compat`` names; it gets
views of them that do the above for the variables `enable` marked and are TensorFlow's own for
every other one.
"""

import functools
import types

from tfpar import _compat
from tfpar._keras import tf

__all__ = ["enable", "enabled"]

_MARK = "_tfpar_cross_replica_extreme"


def enable(model):
    """Marks ``model``'s quantizer range variables for cross-replica MIN / MAX updates."""
    _install()
    for variable in model.non_trainable_variables:
        name = variable.name.split(":")[0]
        if name.endswith(("_min", "_max")):
            setattr(variable, _MARK, name[-3:])


def enabled(layer):
    """Whether ``layer``'s range variables were marked by `enable`."""
    return any(getattr(variable, _MARK, None) for variable in layer.weights)


def _global_extreme(variable, value):
    """``value``'s MIN or MAX over the replicas for a marked ``variable``, else ``value``."""
    extreme = getattr(variable, _MARK, None)
    context = tf.distribute.get_replica_context()
    if extreme is None or context is None or context.num_replicas_in_sync == 1:
        return value
    gathered = context.all_gather(tf.expand_dims(value, 0), axis=0)
    return tf.reduce_min(gathered, axis=0) if extreme == "min" else tf.reduce_max(gathered, axis=0)


def _assign_moving_average(variable, value, decay, zero_debias=True, name=None):
    return _compat.assign_moving_average(
        variable, _global_extreme(variable, value), decay, zero_debias=zero_debias, name=name
    )


def _assign(compat, ref, value, name=None):
    if name is None or "AllValue" in name:  # the all-values quantizer's; "...Last": weight ranges
        value = _global_extreme(ref, value)
    return compat.assign(ref, value, name=name)


class _View(types.ModuleType):
    """A module that answers with ``base``'s attributes, but for those given."""

    def __init__(self, base, **overrides):
        super().__init__(base.__name__)
        self.__dict__.update(overrides)
        self._base = base

    def __getattr__(self, name):
        return getattr(self._base, name)


def _install():
    quant_ops = _compat.tfmot_quant_ops()
    if isinstance(quant_ops.tf, _View):
        return
    train = _View(tf.__internal__.train, assign_moving_average=_assign_moving_average)
    quant_ops.tf = _View(tf, __internal__=_View(tf.__internal__, train=train))
    quant_ops.tf_compat = _View(
        quant_ops.tf_compat, assign=functools.partial(_assign, quant_ops.tf_compat)
    )
