"""What both Kerases keep private on a running fit, a model and an optimizer: fit's arguments
read from its frame, the nested layers, the training mode of the layer call running, the learning
rate given and the current one."""

import sys

from tfpar._compat.keras3 import keras3_trainer_class

__all__ = [
    "current_learning_rate",
    "fit_arguments",
    "flatten_layers",
    "given_learning_rate",
    "losses_added",
    "training_of_the_call",
]


def _keras_fit_codes():
    import inspect

    import tf_keras

    codes = [inspect.unwrap(tf_keras.Model.fit).__code__]
    if "keras" in sys.modules:
        trainer = keras3_trainer_class()
        if trainer is not None:
            codes.append(inspect.unwrap(trainer.fit).__code__)
    return codes


def fit_arguments(model, names=("x", "initial_epoch")):
    """``{name: value}`` of the ``fit`` of ``model`` running in this thread (``None`` outside one),
    read from Keras' own ``fit`` frame: a callback learns when ``fit`` calls it, but not what
    ``fit`` was given, and Keras keeps the input nowhere else (neither Keras changes ``x`` or
    ``initial_epoch`` before ``on_train_begin``, except ``x`` under ``validation_split``, which
    takes arrays only)."""
    codes = _keras_fit_codes()
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code in codes and frame.f_locals.get("self") is model:
            return {name: frame.f_locals.get(name) for name in names}
        frame = frame.f_back
    return None


def flatten_layers(model, include_self=True, recursive=True):
    """``model`` and every layer in it, nested ones included (either Keras): Keras' own walk of its
    tracked layers (``_flatten_layers``); the public ``layers`` lists one level only. A list; with
    ``recursive=False``, the direct sublayers only."""
    return list(model._flatten_layers(include_self=include_self, recursive=recursive))


def losses_added(layer):
    """The losses ``layer`` and its sublayers added with ``add_loss`` (not their weights'
    regularization, which the public ``losses`` computes anew at each read): Keras 3 keeps them in
    ``_losses``, tf_keras in ``_losses`` and, in a call, ``_eager_losses``."""
    added = []
    for sub in flatten_layers(layer):
        added += list(getattr(sub, "_losses", [])) + list(getattr(sub, "_eager_losses", []))
    return added


def training_of_the_call(keras3):
    """The training mode of the layer call running in this thread, as Keras 3 (``keras3``) or
    tf_keras resolved it (what its sublayers inherit; None outside a call): both keep it in a
    private call context."""
    if keras3:
        from keras.src.backend.common import global_state

        context = global_state.get_global_attribute("current_call_ctx")
        return None if context is None else context.training
    from tf_keras.src.engine import base_layer_utils

    return base_layer_utils.call_context().training


def given_learning_rate(optimizer):
    """What the optimizer was given as its rate (a number or a schedule): the public getter returns
    a schedule's current value instead (new optimizers keep it in _learning_rate, legacy in
    _hyper)."""
    if hasattr(optimizer, "_learning_rate"):
        return optimizer._learning_rate
    return getattr(optimizer, "_hyper", {}).get("learning_rate")


def current_learning_rate(optimizer):
    """A Keras optimizer's learning rate for its next step (a schedule evaluated at its iterations):
    Keras 3's ``_get_current_learning_rate``; tf_keras' ``_compute_current_learning_rate`` (which
    keeps a schedule's value in a variable) then its ``learning_rate``."""
    if hasattr(optimizer, "_get_current_learning_rate"):
        return optimizer._get_current_learning_rate()
    optimizer._compute_current_learning_rate()
    return optimizer.learning_rate
