"""What a synchronous strategy makes before ``fit``'s first step, so that the step is traced once.

``tf.function`` traces a function again when its first trace made variables: the second trace is
the one that runs, and it must make none. tf_keras' optimizers make their slots (Adam's moments,
momentum) and a schedule's current rate inside ``apply_gradients``, so tf_keras' ``fit`` traced
its whole distributed step twice, the first time only to make them. Made before ``fit`` for the
variables Keras' own ``train_step`` hands the optimizer (each layer trainable as at ``compile``),
under the name scope ``apply_gradients`` gives them, they are the same variables with the same
names, made once, and the step is traced once (gradient accumulation's buffers, made in the
step, bypass ``tf.function``'s variable creator and cause no second trace). Keras 3 builds its
optimizer before tracing already; ZeRO makes its sharded state itself. A change to the optimizer's
variables must then come before ``fit`` (``exclude_from_weight_decay`` in a callback's
``on_train_begin`` comes too late).
"""

import contextlib

from tfpar import _compat
from tfpar._keras import inner_optimizer, is_keras3, keras, tf
from tfpar.strategies._zero import zero_stage_of

__all__ = ["build_optimizer_state"]


def build_optimizer_state(model, arguments=None):
    """Before ``fit`` of a tf_keras model that trains with Keras' own step: its optimizer builds
    its slots (and a schedule's current rate) for the variables ``fit`` trains, now, under the
    model's strategy. Left to the first step: a model not built yet, a ``train_step`` or
    ``make_train_function`` of the user's (it may update some variables only), a moving average
    of the weights (``use_ema``: it copies them when built), a legacy optimizer, Keras 3, ZeRO."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or is_keras3(model) or not model.built or not _keras_own_step(model):
        return
    strategy = model.distribute_strategy
    if zero_stage_of(strategy):
        return
    if not isinstance(optimizer, keras.optimizers.Optimizer) or optimizer.use_ema:
        return
    variables = _compat.tf_keras_trained_variables(model)
    if not variables:
        return
    with strategy.scope():
        with _apply_scope(optimizer):
            optimizer.build(variables)  # a no-op where it is built already
        _compat.current_learning_rate(inner_optimizer(optimizer))


def _keras_own_step(model):
    """Whether ``fit`` runs Keras' own ``train_step`` of ``model`` (no class or instance of the
    user's replaces it or the training function)."""
    cls = type(model)
    return (
        cls.train_step is keras.Model.train_step
        and cls.make_train_function is keras.Model.make_train_function
        and "train_step" not in vars(model)
    )


def _apply_scope(optimizer):
    """The name scope ``apply_gradients`` builds ``optimizer`` under: its name, or none for a
    LossScaleOptimizer (which builds the optimizer it wraps itself)."""
    if getattr(optimizer, "inner_optimizer", None) is not None:
        return contextlib.nullcontext()
    return tf.name_scope(optimizer.name or "optimizer")
