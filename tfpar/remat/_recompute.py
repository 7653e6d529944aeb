"""A forward whose activations are recomputed in the backward pass (`tf.recompute_grad`), from
its floating-point inputs, as the forward ran.

`tf.recompute_grad` runs a function a second time in the backward pass, after the layer call
that ran it has returned. Run bare there, a Keras layer would lose what its call set up: the
training mode its sublayers inherit (a Dropout would drop nothing), the mixed-precision autocast of
the weights it holds itself; and one that changes its state in training (a Dropout's seed, a
BatchNormalization's moving statistics) would read the changed state, drop out other units than
its forward did and apply its update twice: a gradient of another function, without a word. So a
recomputed layer is called again through Keras' own ``__call__`` with the forward's training mode,
and under Keras 3 inside a `keras.StatelessScope` that gives its state as the forward read it and
keeps none of its changes. tf_keras has no such scope: `tfpar.remat._blocks` keeps the activations
of a tf_keras block that holds such a layer.
"""

import threading

import tensorflow as tf

from tfpar import _compat
from tfpar._keras import is_keras3
from tfpar._timing import Recorder

__all__ = [
    "floats",
    "recompute",
    "recomputation_running",
    "recomputations_recorded",
    "recomputing",
    "state_of",
    "through_keras",
]

_recomputing = threading.local()  # .layer: the layer whose recomputation runs in this thread
_RECOMPUTATIONS = Recorder()  # the recomputations traced in a thread (`recomputations_recorded`)


def floats(structure):
    """The floating-point tensors of a structure: what gradients flow through (token ids and
    masks cross a recomputed call too, and have none)."""
    return [t for t in tf.nest.flatten(structure) if tf.is_tensor(t) and t.dtype.is_floating]


def recompute(call, args, kwargs, state=None, again=None, label=None):
    """``call(*args, **kwargs)`` with its activations recomputed in the backward pass; only its
    floating-point outputs carry gradients. ``state``: under Keras 3, the variables the call may
    change (`state_of`), read as the forward read them when it is recomputed (None: tf_keras);
    ``again``: what runs instead of ``call`` then (default ``call``); ``label``: the block's name,
    under which `recomputations_recorded` records its recomputation (None: not recorded; a
    pipeline's stage, whose backward spans hold it)."""
    flat = tf.nest.flatten((args, kwargs))
    at = [i for i, t in enumerate(flat) if tf.is_tensor(t) and t.dtype.is_floating]
    if not at:  # nothing to differentiate it by (ids in, a lookup first): its own call
        return call(*args, **kwargs)
    # the state as the forward reads it, before it changes it
    read = None if state is None else [tf.stop_gradient(v.value) for v in state]
    first: list = []  # the forward's outputs, whole (the recomputation's are only differentiated)

    def run(*inputs):
        parts = list(flat)
        for i, t in zip(at, inputs):
            parts[i] = t
        a, k = tf.nest.pack_sequence_as((args, kwargs), parts)
        if first:
            mapping = None if state is None else list(zip(state, read))
            return _recorded(label, inputs, lambda: floats(_as_read(again or call, a, k, mapping)))
        first.append(call(*a, **k))
        return floats(first[0])

    differentiable = iter(tf.recompute_grad(run)(*[flat[i] for i in at]))
    whole = tf.nest.flatten(first[0])
    return tf.nest.pack_sequence_as(
        first[0],
        [next(differentiable) if tf.is_tensor(t) and t.dtype.is_floating else t for t in whole],
    )


def recomputations_recorded():
    """Records the recomputations traced in this thread while it is open (a replica's step: the
    backward pass that runs them is traced in its thread): yields a list that gets (label, start,
    end) per recomputation with a label, its start and end timestamps of the traced step."""
    return _RECOMPUTATIONS.recording()


def _recorded(label, inputs, compute):
    """``compute()``, recorded under ``label`` where `recomputations_recorded` is open (its start
    once ``inputs`` exist: the recomputation's inputs wait for the backward to reach it)."""
    return compute() if label is None else _RECOMPUTATIONS.timed((label,), inputs, compute)


def _as_read(call, args, kwargs, mapping):
    """The recomputation: under Keras 3 (``mapping`` not None), with ``mapping``'s variables as the
    forward read them and every change it makes dropped (the forward made them)."""
    if mapping is None:
        return call(*args, **kwargs)
    import keras

    with keras.StatelessScope(state_mapping=mapping):
        return call(*args, **kwargs)


def state_of(layer):
    """The variables a Keras 3 layer may change when called now (its non-trainable ones: moving
    statistics, seed generators' states; a frozen layer's weights); None under tf_keras, which has
    no scope to read them in (`tfpar.remat._blocks` keeps such blocks there)."""
    return list(layer.non_trainable_variables) if is_keras3(layer) else None


def recomputation_running():
    """Whether a layer's recomputation runs in this thread (a call inside it runs plain: the
    recomputation of the outer layer frees what the inner one would)."""
    return getattr(_recomputing, "layer", None) is not None


def recomputing(layer):
    """Makes ``layer``'s calls under a gradient tape recompute their activations in the backward
    pass (an instance attribute over its class' ``call``: the class is left as it was); returns
    ``layer``. Its calls outside a tape (inference, shape inference) are as they were. A layer
    whose call ZeRO stage 3 wraps already (`tfpar.strategies._zero3_units`) is told to recompute
    in that call instead.

    Raises (when traced):
        ValueError: the layer adds a loss in its forward (``add_loss``): recomputed, that loss
            would have no gradient.
    """

    if layer.__dict__.get("_tfpar_zero3"):  # ZeRO stage 3's layer: its own call recomputes it
        object.__setattr__(layer, "_tfpar_recomputes", True)
        object.__setattr__(layer, "_tfpar_remat", True)
        return layer

    def call(*args, **kwargs):
        own = type(layer).call  # looked up at each call, as Keras' own __call__ does
        if getattr(_recomputing, "layer", None) is layer or not _compat.tape_recording():
            return own(layer, *args, **kwargs)
        losses = {id(loss) for loss in _compat.losses_added(layer)}
        outputs = recompute(
            lambda *a, **k: own(layer, *a, **k),
            args,
            kwargs,
            state_of(layer),
            again=through_keras(layer, kwargs),
            label=layer.name,
        )
        _refuse_added_losses(layer, losses)
        return outputs

    call.__name__ = call.__qualname__ = "call"
    call.__doc__ = type(layer).call.__doc__
    call.__wrapped__ = type(layer).call  # Keras reads the call's signature through it
    object.__setattr__(layer, "call", call)
    object.__setattr__(layer, "_tfpar_remat", True)
    return layer


def through_keras(layer, kwargs):
    """The recomputation of ``layer``'s call: through Keras' ``__call__`` (the training mode of
    the forward, which its sublayers inherit; its autocast), to its own ``call``."""
    training = kwargs.get("training", _compat.training_of_the_call(is_keras3(layer)))

    def again(*args, **kwargs):
        _recomputing.layer = layer
        try:
            return layer(*args, **{**kwargs, "training": training})
        finally:
            _recomputing.layer = None

    return again


def _refuse_added_losses(layer, before):
    if any(id(loss) not in before for loss in _compat.losses_added(layer)):
        raise ValueError(
            f"remat recomputes {layer.name!r}, which adds a loss in its forward (add_loss: an "
            "auxiliary or activity regularization loss); recomputed, that loss would have no "
            f"gradient. Received: remat choosing {layer.name!r}. Leave it out: name the other "
            "blocks in remat=[...]."
        )
