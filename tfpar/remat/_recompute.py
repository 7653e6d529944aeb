"""A forward whose activations are recomputed in the backward pass (`tf.recompute_grad`), from
its floating-point inputs, with what the forward read of its state.

`tf.recompute_grad` runs a function a second time in the backward pass. A Keras layer that changes
its state in training (a Dropout's seed, a BatchNormalization's moving statistics) would read the
changed state there, drop out other units than its forward did, and apply its update twice: a
gradient of another function, without a word. Under Keras 3, the recomputation reads the state as
the forward read it and keeps none of its own changes (`keras.StatelessScope`); tf_keras has no
such scope, and `tfpar.remat._blocks` keeps the activations of a block that holds such a layer.
"""

import tensorflow as tf

__all__ = ["floats", "recompute", "recomputing"]


def floats(structure):
    """The floating-point tensors of a structure: what gradients flow through (token ids and
    masks cross a recomputed call too, and have none)."""
    return [t for t in tf.nest.flatten(structure) if tf.is_tensor(t) and t.dtype.is_floating]


def recompute(call, args, kwargs, state=()):
    """``call(*args, **kwargs)`` with its activations recomputed in the backward pass; only its
    floating-point outputs carry gradients. ``state``: the Keras 3 variables the call may change
    (`state_of`), read as the forward read them when it is recomputed."""
    flat = tf.nest.flatten((args, kwargs))
    at = [i for i, t in enumerate(flat) if tf.is_tensor(t) and t.dtype.is_floating]
    if not at:  # nothing to differentiate it by (ids in, a lookup first): its own call
        return call(*args, **kwargs)
    read = [tf.stop_gradient(v.value) for v in state]  # before the forward changes them
    first: list = []  # the forward's outputs, whole (the recomputation's are only differentiated)

    def run(*inputs):
        parts = list(flat)
        for i, t in zip(at, inputs):
            parts[i] = t
        a, k = tf.nest.pack_sequence_as((args, kwargs), parts)
        if first:
            return floats(_as_read(call, a, k, list(zip(state, read))))
        first.append(call(*a, **k))
        return floats(first[0])

    differentiable = iter(tf.recompute_grad(run)(*[flat[i] for i in at]))
    whole = tf.nest.flatten(first[0])
    return tf.nest.pack_sequence_as(
        first[0],
        [next(differentiable) if tf.is_tensor(t) and t.dtype.is_floating else t for t in whole],
    )


def _as_read(call, args, kwargs, mapping):
    """The recomputation: under Keras 3, with ``mapping``'s variables as the forward read them and
    every change it makes dropped (the forward made them)."""
    if not mapping:
        return call(*args, **kwargs)
    import keras

    with keras.StatelessScope(state_mapping=mapping):
        return call(*args, **kwargs)


def state_of(layer):
    """The variables a Keras 3 layer may change when called (its non-trainable ones: moving
    statistics, seed generators' states); none under tf_keras (`tfpar.remat._blocks` keeps such
    blocks there)."""
    from tfpar._keras import is_keras3

    return list(layer.non_trainable_variables) if is_keras3(layer) else []


def recomputing(layer):
    """Makes ``layer``'s calls under a gradient tape recompute their activations in the backward
    pass (an instance attribute over its class' ``call``: the class is left as it was); returns
    ``layer``. Its calls outside a tape (inference, shape inference) are as they were."""
    from tfpar import _compat

    own = type(layer).call
    state = state_of(layer)

    def call(*args, **kwargs):
        if not _compat.tape_recording():
            return own(layer, *args, **kwargs)
        return recompute(lambda *a, **k: own(layer, *a, **k), args, kwargs, state)

    call.__name__ = call.__qualname__ = "call"
    call.__doc__ = own.__doc__
    call.__wrapped__ = own  # Keras reads the call's signature through it
    object.__setattr__(layer, "call", call)
    object.__setattr__(layer, "_tfpar_remat", True)
    return layer
