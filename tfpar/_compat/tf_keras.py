"""tf_keras' private internals: what it reads from a strategy and a callback, its printer, its
data adapters, where its fit resumes, the variables it trains, its Model constructor, its random
layers, and the places a layer holds its weights."""

from tf_keras.src.engine import data_adapter as _data_adapter
from tf_keras.src.utils import io_utils as _io_utils

__all__ = [
    "DatasetCreatorAdapter",
    "KERAS_CALLBACK_HOOKS",
    "KERAS_READS_FROM_EXTENDED",
    "print_msg",
    "random_generator_type",
    "replace_data_adapter",
    "take_logs_as_they_are",
    "tf_keras_mark_optimizer_built",
    "tf_keras_model_class",
    "tf_keras_own_trainable_weights",
    "tf_keras_replace_weight",
    "tf_keras_resume_point",
    "tf_keras_set_resume_point",
    "tf_keras_trained_variables",
]


KERAS_READS_FROM_EXTENDED = ("_task_id",)
"""What tf_keras' distributed_file_utils reads from a strategy's extended to name non-chief
workers' temporary checkpoint folders; HorovodStrategy defines it (its rank)."""


KERAS_CALLBACK_HOOKS = ("_implements_train_batch_hooks",)
"""Callback members tfpar overrides: Keras asks a callback whether it has batch hooks (and refuses
batch hooks under a ParameterServer) only through this private method."""


print_msg = _io_utils.print_msg
"""Keras' own printer: stdout, or absl logging once interactive logging is off (HorovodStrategy
turns it off on ranks other than 0); tf_keras keeps it private."""


DatasetCreatorAdapter = _data_adapter.DatasetCreatorAdapter
"""The adapter fit uses for a DatasetCreator; tfpar subclasses it to explain missing steps."""


def tf_keras_resume_point(model, steps_per_epoch, initial_epoch):
    """``(epoch, step)`` tf_keras' ``fit`` continues at after its BackupAndRestore restored (its
    ``on_train_begin`` ran): ``fit`` reads them from the model's private training state, and
    no public API tells a callback where the run resumes."""
    state = getattr(model, "_training_state", None)
    if state is None:
        return initial_epoch, 0
    from tf_keras.src.utils.mode_keys import ModeKeys

    epoch, step = state.maybe_load_initial_counters_from_ckpt(
        steps_per_epoch, initial_epoch, ModeKeys.TRAIN
    )
    return int(epoch), int(step)


def tf_keras_set_resume_point(model, epoch, step, steps_per_epoch):
    """Makes tf_keras' ``fit`` continue at ``step`` of ``epoch`` (0-based) instead of where its
    restored counters stand: the counters its BackupAndRestore restored (the last step trained) are
    set to the step before (step 0: the last of the epoch before), which ``fit`` reads after
    ``on_train_begin``."""
    state = model._training_state
    last = (epoch, step - 1) if step else (epoch - 1, steps_per_epoch - 1)
    state._ckpt_saved_epoch.assign(last[0])
    state._ckpt_saved_batch.assign(last[1])


def tf_keras_model_class():
    """tf_keras' ``Model`` as defined (``tf_keras.Model`` is the same class): its ``__init__`` runs
    for every tf_keras model and sets the strategy the model belongs to. Keras has no hook where a
    model is created; `tfpar._owned` wraps this constructor while a tfpar strategy's scope is
    entered."""
    from tf_keras.src.engine.training import Model

    return Model if "__init__" in Model.__dict__ else None


def tf_keras_trained_variables(model):
    """The variables tf_keras' ``fit`` trains: ``model.trainable_variables`` with each layer's
    ``trainable`` as it was at ``compile``, which ``fit`` puts back for its run (a layer frozen or
    unfrozen after ``compile`` counts as it was then); no public API gives them."""
    from tf_keras.src.engine import training_utils

    with training_utils.RespectCompiledTrainableState(model):
        return list(model.trainable_variables)


def take_logs_as_they_are(callback):
    """Lets tf_keras hand ``callback`` its logs as they are, tensors and all, with no copy to numpy
    at every step (``Callback._supports_tf_logs``, read by tf_keras' CallbackList; no public switch;
    Keras 3 hands every callback its logs as they are). For a callback that reads at most the loss,
    once a step, or no logs. Returns it."""
    callback._supports_tf_logs = True
    return callback


def replace_data_adapter(original, replacement):
    """Puts ``replacement`` in tf_keras' adapter list in place of ``original`` (a registration tfpar
    makes once, when `tfpar.data._ps_input` is imported); Keras has no public adapter registry."""
    adapters = _data_adapter.ALL_ADAPTER_CLS
    if replacement not in adapters:
        adapters[adapters.index(original)] = replacement


def random_generator_type(layer):
    """How a tf_keras random layer draws ("stateless", "stateful", "legacy_stateful"), or None
    (Keras 3, or not a random layer): its RandomGenerator has no public getter."""
    generator = getattr(layer, "_random_generator", None)
    return getattr(generator, "_rng_type", None)


def tf_keras_own_trainable_weights(layer):
    """The trainable weights a tf_keras layer made itself, its sublayers' left out (the public
    ``trainable_weights`` adds the sublayers'): what ZeRO stage 3 gathers where that layer
    computes."""
    return list(layer._trainable_weights)


def tf_keras_replace_weight(layer, old, new):
    """Puts ``new`` wherever the tf_keras ``layer`` holds its weight ``old`` (no public API swaps
    a weight; ZeRO stage 3 replaces it by its pieces): the attribute (``layer.kernel``), its place
    in the layer's weight lists (the order ``get_weights`` and h5 files use), its checkpoint
    dependency (the same name: the same key in a TF-format checkpoint), its reference count, and
    its regularization loss (a call bound to the weight). Returns whether ``layer`` held it."""
    held = False
    for name, value in list(vars(layer).items()):
        if value is old:
            object.__setattr__(layer, name, new)
            held = True
    for weights in (layer._trainable_weights, layer._non_trainable_weights):
        for i, weight in enumerate(weights):
            if weight is old:
                weights[i] = new
                held = True
    if not held:
        return False
    _replace_in_losses(layer, old, new)
    dependencies = layer._self_unconditional_checkpoint_dependencies
    for i, reference in enumerate(dependencies):
        if reference.ref is old:
            dependencies[i] = type(reference)(reference.name, new)
    names = layer._self_unconditional_dependency_names
    for name, value in list(names.items()):
        if value is old:
            names[name] = new
    counts = getattr(layer, "_obj_reference_counts_dict", None)
    if counts is not None and old in counts:
        counts[new] = counts.pop(old)
    return True


def tf_keras_mark_optimizer_built(optimizer):
    """Marks a tf_keras optimizer built, so that nothing builds its slots: its private ``_built``,
    which tf_keras' BackupAndRestore reads before it builds the optimizer's whole slots itself
    (ZeRO stage 3 keeps its own, pieces of them)."""
    optimizer._built = True


def _replace_in_losses(layer, old, new):
    """The layer's weight regularizers, each a ``functools.partial`` bound to its weight (inside
    the partial ``add_loss`` tags it with, in ``_callable_losses``), bound to ``new`` instead of
    ``old``."""
    losses = layer._callable_losses
    for i, loss in enumerate(losses):
        losses[i] = _rebound(loss, old, new)


def _rebound(call, old, new):
    """``call`` (a ``functools.partial``, maybe of another) with ``new`` where it binds ``old``."""
    import functools

    if not isinstance(call, functools.partial):
        return call
    args = [new if a is old else _rebound(a, old, new) for a in call.args]
    if all(a is b for a, b in zip(args, call.args)):
        return call
    return functools.partial(call.func, *args, **call.keywords)
