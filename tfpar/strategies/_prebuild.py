"""What a synchronous strategy makes before ``fit``'s first step, so that the step is traced once.

``tf.function`` traces a function again when its first trace made variables: the second trace is
the one that runs, and it must make none. tf_keras' optimizers make their slots (Adam's moments,
momentum) inside ``apply_gradients``, so tf_keras' ``fit`` traced its whole distributed step twice,
the first time only to make them. Built before ``fit`` with the variables Keras' own
``train_step`` hands them, under the name scope ``apply_gradients`` gives them, they are the same
variables with the same names, made once, and the step is traced once. Keras 3 builds its
optimizer before tracing already; ZeRO makes its sharded state itself.
"""

import contextlib

from tfpar._keras import is_keras3, keras, tf

__all__ = ["build_optimizer_state"]


def build_optimizer_state(model, arguments=None):
    """Before ``fit`` of a tf_keras model whose ``train_step`` is Keras' own: its optimizer builds
    its slots for ``model.trainable_variables`` now, under the model's strategy. A model not built
    yet, a ``train_step`` of the user's (it may update some variables only), a legacy optimizer,
    Keras 3 or ZeRO: left to the first step."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or is_keras3(model) or not model.built:
        return
    if type(model).train_step is not keras.Model.train_step:
        return
    strategy = model.distribute_strategy
    if getattr(getattr(strategy, "config", None), "zero_stage", 0):
        return
    variables = model.trainable_variables
    if not isinstance(optimizer, keras.optimizers.Optimizer) or not variables:
        return
    with strategy.scope(), _apply_scope(optimizer):
        optimizer.build(variables)  # a no-op where it is built already


def _apply_scope(optimizer):
    """The name scope ``apply_gradients`` builds ``optimizer`` under: its name, or none for a
    LossScaleOptimizer (which builds the optimizer it wraps itself)."""
    if getattr(optimizer, "inner_optimizer", None) is not None:
        return contextlib.nullcontext()
    return tf.name_scope(optimizer.name or "optimizer")
