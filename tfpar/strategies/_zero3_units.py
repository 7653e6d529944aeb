"""ZeRO stage 3's units (`tfpar.strategies._zero3`): the layers that hold parameters themselves
(a Dense, an EinsumDense, a LayerNormalization, an Embedding; not a block, whose sublayers hold
them). A unit's parameters are gathered once the unit's inputs exist, not before: TensorFlow runs
an op as soon as its inputs are ready, and a gather needs only the pieces, so without that order
every parameter of the model would be gathered at the start of a step and held whole until its
layer ran (PyTorch FSDP orders its all-gathers by the modules' forward for the same reason).

A unit of at least `KEEP_BELOW` bytes of parameters is also recomputed in the backward pass
(`tfpar.remat`), so that its gathered parameters die with its forward and are gathered again for
its backward: the step then holds one unit's whole parameters at a time, plus the smaller units'.
Inside a block that remat recomputes, a unit runs plain: the block's recomputation frees them
already."""

import threading

from tfpar import _compat
from tfpar._keras import is_keras3
from tfpar.remat._blocks import why_kept
from tfpar.remat._recompute import (
    floats,
    recomputation_running,
    recompute,
    state_of,
    through_keras,
)

__all__ = ["KEEP_BELOW", "UnitCall", "gathering", "unit_call", "units_of"]

KEEP_BELOW = 64 * 2**10
"""The parameter bytes under which a unit keeps its gathered parameters for its backward (biases,
normalizations): a second gather would cost a collective's latency to save nothing worth it."""

_running = threading.local()  # .calls: the unit calls running in this thread (`UnitCall`)


class UnitCall:
    """One call of a unit running: its floating-point inputs, which its parameters' gathers wait
    for, and what it gathered, so that a parameter read twice in the call (Keras' ``take`` reads
    an Embedding's table for its shape, then for its rows) is gathered once."""

    def __init__(self, inputs):
        self.inputs = inputs
        self.gathered = {}  # id of a parameter: its whole value


def units_of(model):
    """The layers of ``model`` (itself and nested models included) that made trainable variables
    themselves, once each."""
    units = []
    for layer in _compat.flatten_layers(model):
        if _own_weights(layer) and layer not in units:
            units.append(layer)
    return units


def _own_weights(layer):
    if is_keras3(layer):
        return _compat.keras3_own_trainable_variables(layer)
    return _compat.tf_keras_own_trainable_weights(layer)


def unit_call():
    """The innermost unit call running in this thread (`UnitCall`), or None outside one."""
    stack = getattr(_running, "calls", None)
    return stack[-1] if stack else None


def gathering(layer):
    """Makes ``layer``'s calls gather its parameters once their inputs exist, and, for a unit of
    `KEEP_BELOW` bytes or more, recompute its forward in the backward pass (an instance attribute
    over its class' ``call``, as `tfpar.remat.recomputing` sets); returns ``layer``."""
    own_bytes = sum(4 * int(v.shape.num_elements()) for v in _own_weights(layer))
    # tf_keras cannot read a layer's state as its forward read it (`tfpar.remat`'s rules)
    recomputes = own_bytes >= KEEP_BELOW and (is_keras3(layer) or why_kept(layer) is None)

    def plain(*args, **kwargs):
        stack = _running.__dict__.setdefault("calls", [])
        stack.append(UnitCall(floats((args, kwargs))))
        try:
            return type(layer).call(layer, *args, **kwargs)
        finally:
            stack.pop()

    def call(*args, **kwargs):
        chosen = layer.__dict__.get("_tfpar_recomputes")  # or remat named it since
        if not chosen or recomputation_running() or not _compat.tape_recording():
            return plain(*args, **kwargs)
        again = through_keras(layer, kwargs)
        return recompute(plain, args, kwargs, state_of(layer), again=again, label=layer.name)

    call.__name__ = call.__qualname__ = "call"
    call.__doc__ = type(layer).call.__doc__
    call.__wrapped__ = type(layer).call  # Keras reads the call's signature through it
    if recomputes:
        _compat.stop_keras3_remat(layer)  # tfpar recomputes it, not Keras' RematScope
        object.__setattr__(layer, "_tfpar_remat", True)
    object.__setattr__(layer, "_tfpar_recomputes", recomputes)
    object.__setattr__(layer, "call", call)
    object.__setattr__(layer, "_tfpar_zero3", True)
    return layer
