"""``horovod.tensorflow.DistributedOptimizer`` for a Keras 3 optimizer: the module `tfpar
install-horovod` adds to Horovod as ``horovod/_tfpar_keras3.py``.

Horovod 0.28.1 hands every optimizer that is not TensorFlow's legacy one to its Keras API, which
runs on tf_keras (``horovod/_tfpar_keras.py``) and cannot take a Keras 3 optimizer (``tf.keras``
with TF_USE_LEGACY_KERAS unset, or ``keras``). A Keras 3 optimizer gets this instead: an
optimizer of the same class with the same config, whose ``apply`` (what ``apply_gradients`` and
``model.fit`` call) first reduces the gradients over the ranks with the all-reduce of gradients
that ``DistributedGradientTape`` uses (op, compression, groups and process set as given).

It imports nothing of tfpar: it becomes part of Horovod.
"""

import sys

import tensorflow as tf


def is_keras3_optimizer(optimizer):
    """Whether ``optimizer`` is a Keras 3 optimizer (Keras 3 is imported in any process that has one)."""
    keras = sys.modules.get("keras")
    base = getattr(getattr(keras, "optimizers", None), "Optimizer", None)
    return isinstance(base, type) and isinstance(optimizer, base)


def distributed_optimizer(optimizer, allreduce_grads, backward_passes_per_step=1):
    """A copy of ``optimizer`` (its class, its config) that reduces its gradients with
    ``allreduce_grads(grads, vars)`` before applying them."""
    if backward_passes_per_step != 1:
        raise ValueError(
            "horovod.tensorflow.DistributedOptimizer takes backward_passes_per_step=1 with a Keras 3 "
            f"optimizer. Received: backward_passes_per_step={backward_passes_per_step!r}. Accumulate "
            "with Keras 3's own gradient_accumulation_steps=N on the optimizer instead, or use tf_keras "
            "(TF_USE_LEGACY_KERAS=1).")
    base = type(optimizer)

    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        if trainable_variables is None:  # the variables the optimizer was built for
            return base.apply(self, allreduce_grads(grads, None))
        pairs = [(g, v) for g, v in zip(grads, list(trainable_variables)) if g is not None]
        variables = [v for _, v in pairs]
        # Horovod's all-reduce names its tensors after the tf.Variable each Keras 3 variable holds.
        held = [v if isinstance(v, tf.Variable) else v.value for v in variables]
        return base.apply(self, allreduce_grads([g for g, _ in pairs], held), variables)

    distributed = type(base.__name__, (base,), {"apply": apply, "__module__": base.__module__,
                                                "__doc__": f"{base.__name__}, its gradients reduced by Horovod."})
    return distributed.from_config(optimizer.get_config())
