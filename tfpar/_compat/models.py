"""What both Kerases keep private on a running fit, a model and an optimizer: fit's arguments
read from its frame, the nested layers, the learning rate given and the current one."""

import sys

from tfpar._compat.keras3 import keras3_trainer_class

__all__ = [
    "current_learning_rate",
    "fit_arguments",
    "flatten_layers",
    "given_learning_rate",
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


def flatten_layers(model):
    """``model`` and every layer in it, nested ones included (either Keras): Keras' own walk of its
    tracked layers (``_flatten_layers``); the public ``layers`` lists one level only."""
    return model._flatten_layers(include_self=True, recursive=True)


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
