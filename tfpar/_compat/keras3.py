"""Keras 3's private internals on TensorFlow: where its fit starts, its data adapter, optimizer
and trainer classes, the loss its train_step computes and records, a layer's RematScope and own
variables, and a variable's storage."""

__all__ = [
    "keras3_compute_loss",
    "keras3_data_adapter_class",
    "keras3_loss_tracker",
    "keras3_own_trainable_variables",
    "keras3_remat_mode",
    "keras3_replace_storage",
    "keras3_start_at_epoch",
    "keras3_tf_optimizer_class",
    "keras3_trainer_class",
    "optimizer_steps",
    "stop_keras3_remat",
]


def keras3_start_at_epoch(model, epoch):
    """Makes Keras 3's ``fit`` start at ``epoch`` (0-based): its own BackupAndRestore sets this
    private attribute, which ``fit`` reads after ``on_train_begin``; there is no public one."""
    model._initial_epoch = epoch


def keras3_data_adapter_class():
    """Keras 3's DataAdapter base: ``fit`` takes an instance of it as it is (no public name);
    tfpar's parameter-server input is one, so that Keras 3 hands it to tfpar, which refuses it
    clearly."""
    from keras.src.trainers.data_adapters.data_adapter import DataAdapter

    return DataAdapter


def keras3_tf_optimizer_class(keras_module):
    """Keras 3's TensorFlow optimizer base, whose ``_all_reduce_sum_gradients`` tfpar marks so that
    a strategy knows which reduction carries the gradients (Keras 3 passes no variables to it); None
    for tf_keras or another backend."""
    if not hasattr(keras_module, "config") or keras_module.config.backend() != "tensorflow":
        return None
    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    return TFOptimizer if hasattr(TFOptimizer, "_all_reduce_sum_gradients") else None


def keras3_trainer_class():
    """Keras 3's TensorFlow trainer, whose ``__init__`` every Keras 3 model runs (functional,
    sequential and subclassed alike) and which keeps the strategy the model was created under
    (``keras.Model`` defines no constructor of its own that all of them run). None if Keras 3 runs
    on another backend."""
    import keras

    if keras.config.backend() != "tensorflow":
        return None
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    return TensorFlowTrainer if "__init__" in TensorFlowTrainer.__dict__ else None


def keras3_compute_loss(model, y, y_pred, sample_weight):
    """A training step's loss of a Keras 3 model as its own ``train_step`` computes it: the compiled
    loss plus ``model.losses`` (``Model._compute_loss``; the public ``compute_loss`` is the
    override point of subclasses and takes ``x``)."""
    return model._compute_loss(
        x=None, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True
    )


def keras3_loss_tracker(model):
    """The metric a Keras 3 model's ``train_step`` records the step's loss in
    (``Model._loss_tracker``, which ``fit`` reports as "loss"; no public name)."""
    return model._loss_tracker


def optimizer_steps(optimizer):
    """Every step a Keras 3 optimizer took, those its own ``gradient_accumulation_steps``
    accumulated included (its ``_iterations``; the public ``iterations`` counts updates)."""
    return optimizer._iterations


def keras3_remat_mode(layer):
    """The mode of the `keras.RematScope` a Keras 3 layer was made in (Keras' ``RematMode``:
    ``.mode``, ``.layer_names``, ``.output_size_threshold``), or None: its ``_remat_mode``, which
    Keras reads at each call (no public name; tf_keras layers have none), or where
    `stop_keras3_remat` moved it."""
    return getattr(layer, "_remat_mode", None) or layer.__dict__.get("_tfpar_remat_scope")


def stop_keras3_remat(layer):
    """Makes a Keras 3 layer call its ``call`` without its RematScope's own recomputation
    (tfpar recomputes it, or keeps it, instead: `tfpar.remat`); `keras3_remat_mode` still gives
    the scope."""
    scope = getattr(layer, "_remat_mode", None)
    if scope is not None:
        layer.__dict__["_tfpar_remat_scope"] = scope
        layer._remat_mode = None


def keras3_own_trainable_variables(layer):
    """The trainable variables a Keras 3 layer made itself, its sublayers' left out (Keras keeps
    them apart; the public ``trainable_variables`` adds the sublayers'): what ZeRO stage 3 gathers
    where that layer computes."""
    return list(layer._trainable_variables)


def keras3_replace_storage(variable, storage):
    """Makes a Keras 3 variable hold ``storage`` (an object with a tf.Variable's reads, writes and
    ``handle``) in place of its tf.Variable: its reads, writes, ``handle`` and checkpoint go
    through that private ``_value``, and the variable object, its path and its key stay (no public
    API swaps a variable's storage; ZeRO stage 3 shards it)."""
    variable._value = storage
