"""The one place tfpar reaches private TensorFlow, tf_keras and tensorflow-model-optimization APIs.

Each symbol says what tfpar needs it for and which public API is missing.
``tests/unit/test_compat.py`` touches every one on real objects, so a TensorFlow or
tf_keras upgrade that moves one fails there, by name, instead of somewhere in a run.
Everything else in tfpar uses public APIs, or this module.
"""

import sys

import tensorflow as tf
from tensorflow.python.distribute import collective_all_reduce_strategy as _collective_strategy
from tensorflow.python.distribute import distribute_utils as _distribute_utils
from tensorflow.python.distribute import input_util as _input_util
from tensorflow.python.distribute import mirrored_strategy as _mirrored_strategy
from tensorflow.python.distribute import values as _values
from tensorflow.python.ops import control_flow_util as _control_flow_util
from tensorflow.python.ops import resource_variable_ops as _resource_variable_ops
from tensorflow.python.trackable import base as _trackable_base
from tf_keras.src.engine import data_adapter as _data_adapter
from tf_keras.src.utils import io_utils as _io_utils

from tfpar._compat.allocator import keep_malloc_policy, onednn_enabled
from tfpar._compat.collectives import (collective_all_gather, collective_all_reduce,
                                       collective_all_to_all, keep_started_collective_server,
                                       set_collective_key_base)
from tfpar._compat.graph import (graph_steps, is_graph_network, keras_layer_of, layer_nodes_in, node_layer,
                                output_structure)
from tfpar._compat.keras_hub import keras_hub_fit

__all__ = [
    "CROSS_DEVICE_OPS_HOOKS", "CollectiveAllReduceExtended", "DatasetCreatorAdapter", "KERAS_CALLBACK_HOOKS", "KERAS_READS_FROM_EXTENDED", "MIRRORED_EXTENDED_HOOKS", "Mirrored", "MirroredExtended",
    "PerReplica", "ResourceVariable", "Trackable", "mirrored", "current_learning_rate", "cross_device_ops_of", "get_distributed_dataset", "get_distributed_datasets_from_function",
    "assign_moving_average", "fit_arguments", "flatten_layers", "given_learning_rate", "keras3_compute_loss",
    "keras3_data_adapter_class", "keras3_loss_tracker", "keras3_trainer_class", "ray_resources_per_worker",
    "take_logs_as_they_are", "keras3_start_at_epoch", "keras3_tf_optimizer_class", "in_xla_context", "print_msg", "is_graph_network", "graph_steps", "node_layer", "collective_all_reduce", "collective_all_gather", "collective_all_to_all", "keras_layer_of", "layer_nodes_in", "output_structure",
    "ps_num_workers", "replace_data_adapter", "set_collective_key_base",
    "keras_hub_fit", "keep_started_collective_server", "optimizer_steps",
    "keep_malloc_policy", "onednn_enabled",
    "stop_removing_functions", "tfmot_can_cluster", "tfmot_quant_ops",
    "tf_keras_model_class", "tf_keras_resume_point", "tfmot_wrapper_classes", "unwrap_initial_value",
]

# --- tf.distribute internals: HorovodStrategy is a MirroredStrategy whose reductions go through Horovod.
MirroredExtended = _mirrored_strategy.MirroredExtended
"""Base of `HorovodStrategy`'s extended: no public API lets a strategy replace its reductions."""
MIRRORED_EXTENDED_HOOKS = (
    "_get_cross_device_ops", "_reduce_to", "_batch_reduce_to", "_update", "_replica_ctx_all_reduce",
    "_get_variable_creator_initial_value", "_experimental_distribute_dataset",
    "_distribute_datasets_from_function", "_num_replicas_in_sync", "_in_multi_worker_mode",
    "_get_replica_id_in_sync_group", "_get_local_replica_id", "_input_workers_with_options",
    "_container_strategy",
)
"""MirroredExtended members HorovodStrategy overrides or calls (the strategy-author hooks TensorFlow
keeps private)."""
CROSS_DEVICE_OPS_HOOKS = ("_gather",)
"""CrossDeviceOps members HorovodStrategy overrides (gather has no public implementation hook)."""
CollectiveAllReduceExtended = _collective_strategy.CollectiveAllReduceExtended
"""Base of the multi-worker `DataParallel`'s extended, as MirroredExtended is of the one-host one: the
gradient compression and accumulation hooks (`_batch_reduce_to`, `_update`) have no public API."""
Mirrored = _values.Mirrored
"""A value identical on every replica (a MEAN of it is itself); only DistributedValues is public."""
PerReplica = _values.PerReplica
"""One value per local replica, as a strategy's reductions take them (no public constructor)."""


def mirrored(components):
    """The Mirrored value of a reduction's per-device results, built as TensorFlow's own cross-device
    ops build theirs (one device: the tensor itself)."""
    return _distribute_utils.regroup(tuple(components), wrap_class=Mirrored)


ResourceVariable = _resource_variable_ops.ResourceVariable
"""A variable on one device that no strategy's variable creator intercepts (Horovod's accumulation
buffers); tf.Variable inside a scope would become a mirrored variable."""
get_distributed_dataset = _input_util.get_distributed_dataset
"""The DistributedDataset a Mirrored-based strategy builds for experimental_distribute_dataset."""
get_distributed_datasets_from_function = _input_util.get_distributed_datasets_from_function
"""The same for distribute_datasets_from_function, with tfpar's own input context (shard by rank)."""


def in_xla_context():
    """Whether the graph being built is compiled by XLA (no public query)."""
    return _control_flow_util.GraphOrParentsInXlaContext(__import__("tensorflow").compat.v1.get_default_graph())


def unwrap_initial_value(initial):
    """A checkpoint-restored initial value (CheckpointInitialValue) as the tensor inside it."""
    return getattr(initial, "wrapped_value", initial)


def optimizer_steps(optimizer):
    """Every step a Keras 3 optimizer took, those its own ``gradient_accumulation_steps``
    accumulated included (its ``_iterations``; the public ``iterations`` counts updates)."""
    return optimizer._iterations


def cross_device_ops_of(strategy):
    """The CrossDeviceOps a MirroredStrategy was built with, or None (no public getter)."""
    return getattr(strategy.extended, "_cross_device_ops", None)


def ps_num_workers(strategy):
    """How many workers a ParameterServerStrategy schedules on (no public count)."""
    return strategy.extended._num_workers


# --- tf_keras internals.
KERAS_READS_FROM_EXTENDED = ("_task_id",)
"""What tf_keras' distributed_file_utils reads from a strategy's extended to name non-chief
workers' temporary checkpoint folders; HorovodStrategy defines it (its rank)."""
KERAS_CALLBACK_HOOKS = ("_implements_train_batch_hooks",)
"""Callback members tfpar overrides: Keras asks a callback whether it has batch hooks (and refuses
batch hooks under a ParameterServer) only through this private method."""
print_msg = _io_utils.print_msg
"""Keras' own printer: stdout, or absl logging once interactive logging is off (HorovodStrategy turns
it off on ranks other than 0); tf_keras keeps it private."""
DatasetCreatorAdapter = _data_adapter.DatasetCreatorAdapter
"""The adapter fit uses for a DatasetCreator; tfpar subclasses it to explain missing steps."""


def stop_removing_functions():
    """From now on a garbage-collected tf.function stays in the eager context. A context connected to
    a cluster removes each one from every remote task too, and logs four error lines per task when
    that fails; once the job's servers are gone (at exit, after `ParameterServer.shutdown`) it can
    only fail. TensorFlow has no public switch; the private method is replaced on this context only."""
    from tensorflow.python.eager import context

    context.context().remove_function = lambda name: None


def tf_keras_resume_point(model, steps_per_epoch, initial_epoch):
    """``(epoch, step)`` tf_keras' ``fit`` continues at after its BackupAndRestore restored (its
    ``on_train_begin`` ran): ``fit`` reads them from the model's private training state, and
    no public API tells a callback where the run resumes."""
    state = getattr(model, "_training_state", None)
    if state is None:
        return initial_epoch, 0
    from tf_keras.src.utils.mode_keys import ModeKeys

    epoch, step = state.maybe_load_initial_counters_from_ckpt(steps_per_epoch, initial_epoch, ModeKeys.TRAIN)
    return int(epoch), int(step)


def tf_keras_set_resume_point(model, epoch, step, steps_per_epoch):
    """Makes tf_keras' ``fit`` continue at ``step`` of ``epoch`` (0-based) instead of where its restored
    counters stand: the counters its BackupAndRestore restored (the last step trained) are set to the step
    before (step 0: the last of the epoch before), which ``fit`` reads after ``on_train_begin``."""
    state = model._training_state
    last = (epoch, step - 1) if step else (epoch - 1, steps_per_epoch - 1)
    state._ckpt_saved_epoch.assign(last[0])
    state._ckpt_saved_batch.assign(last[1])


def keras3_start_at_epoch(model, epoch):
    """Makes Keras 3's ``fit`` start at ``epoch`` (0-based): its own BackupAndRestore sets this
    private attribute, which ``fit`` reads after ``on_train_begin``; there is no public one."""
    model._initial_epoch = epoch


def keras3_data_adapter_class():
    """Keras 3's DataAdapter base: ``fit`` takes an instance of it as it is (no public name); tfpar's
    parameter-server input is one, so that Keras 3 hands it to tfpar, which refuses it clearly."""
    from keras.src.trainers.data_adapters.data_adapter import DataAdapter

    return DataAdapter


def keras3_tf_optimizer_class(keras_module):
    """Keras 3's TensorFlow optimizer base, whose ``_all_reduce_sum_gradients`` tfpar marks so that a
    strategy knows which reduction carries the gradients (Keras 3 passes no variables to it); None
    for tf_keras or another backend."""
    if not hasattr(keras_module, "config") or keras_module.config.backend() != "tensorflow":
        return None
    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    return TFOptimizer if hasattr(TFOptimizer, "_all_reduce_sum_gradients") else None


def tf_keras_model_class():
    """tf_keras' ``Model`` as defined (``tf_keras.Model`` is the same class): its ``__init__`` runs for
    every tf_keras model and sets the strategy the model belongs to. Keras has no hook where a model
    is created; `tfpar._owned` wraps this constructor while a tfpar strategy's scope is entered."""
    from tf_keras.src.engine.training import Model

    return Model if "__init__" in Model.__dict__ else None


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
    """``{name: value}`` of the ``fit`` of ``model`` running in this thread (``None`` outside one), read
    from Keras' own ``fit`` frame: a callback learns when ``fit`` calls it, but not what ``fit`` was
    given, and Keras keeps the input nowhere else (neither Keras changes ``x`` or ``initial_epoch``
    before ``on_train_begin``, except ``x`` under ``validation_split``, which takes arrays only)."""
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


def keras3_compute_loss(model, y, y_pred, sample_weight):
    """A training step's loss of a Keras 3 model as its own ``train_step`` computes it: the compiled
    loss plus ``model.losses`` (``Model._compute_loss``; the public ``compute_loss`` is the
    override point of subclasses and takes ``x``)."""
    return model._compute_loss(x=None, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)


def keras3_loss_tracker(model):
    """The metric a Keras 3 model's ``train_step`` records the step's loss in (``Model._loss_tracker``,
    which ``fit`` reports as "loss"; no public name)."""
    return model._loss_tracker


def take_logs_as_they_are(callback):
    """Lets tf_keras hand ``callback`` its logs as they are, tensors and all, with no copy to numpy at
    every step (``Callback._supports_tf_logs``, read by tf_keras' CallbackList; no public switch;
    Keras 3 hands every callback its logs as they are). For a callback that reads at most the loss,
    once a step, or no logs. Returns it."""
    callback._supports_tf_logs = True
    return callback


assign_moving_average = tf.__internal__.train.assign_moving_average
"""The moving-average update tensorflow-model-optimization's quantizers call, which tfpar's exact
ranges replace to average over the replicas first (`tfpar.quantization._exact_ranges`); only under
``tf.__internal__``."""


def ray_resources_per_worker(scaling_config):
    """What Ray places per worker of ``scaling_config``, its defaults included (a private property of
    ``ScalingConfig``), or None where Ray no longer has it."""
    return getattr(scaling_config, "_resources_per_worker_not_none", None)


def replace_data_adapter(original, replacement):
    """Puts ``replacement`` in tf_keras' adapter list in place of ``original`` (a registration tfpar
    makes once, when `tfpar.data._ps_input` is imported); Keras has no public adapter registry."""
    adapters = _data_adapter.ALL_ADAPTER_CLS
    if replacement not in adapters:
        adapters[adapters.index(original)] = replacement


def given_learning_rate(optimizer):
    """What the optimizer was given as its rate (a number or a schedule): the public getter returns a
    schedule's current value instead (new optimizers keep it in _learning_rate, legacy in _hyper)."""
    if hasattr(optimizer, "_learning_rate"):
        return optimizer._learning_rate
    return getattr(optimizer, "_hyper", {}).get("learning_rate")


Trackable = _trackable_base.Trackable
"""TensorFlow's checkpointable object: one with ``_serialize_to_tensors``/``_restore_from_tensors``
writes and reads tensors of its own making under its place in a checkpoint's object graph."""


def current_learning_rate(optimizer):
    """A Keras optimizer's learning rate for its next step (a schedule evaluated at its iterations):
    Keras 3's ``_get_current_learning_rate``; tf_keras' ``_compute_current_learning_rate`` (which
    keeps a schedule's value in a variable) then its ``learning_rate``."""
    if hasattr(optimizer, "_get_current_learning_rate"):
        return optimizer._get_current_learning_rate()
    optimizer._compute_current_learning_rate()
    return optimizer.learning_rate


def random_generator_type(layer):
    """How a tf_keras random layer draws ("stateless", "stateful", "legacy_stateful"), or None
    (Keras 3, or not a random layer): its RandomGenerator has no public getter."""
    generator = getattr(layer, "_random_generator", None)
    return getattr(generator, "_rng_type", None)


# --- tensorflow-model-optimization internals (imported when first asked: TFMOT loads slowly).
def tfmot_wrapper_classes():
    """``(PruneLowMagnitude, ClusterWeights)``: the layers TFMOT's pruning and clustering wrap a layer
    in, to see whether a model still wears them (TFMOT exports only the functions that add and strip
    them)."""
    from tensorflow_model_optimization.python.core.clustering.keras.cluster_wrapper import ClusterWeights
    from tensorflow_model_optimization.python.core.sparsity.keras.pruning_wrapper import PruneLowMagnitude

    return PruneLowMagnitude, ClusterWeights


def tfmot_can_cluster(layer):
    """Whether TFMOT's registry knows how to cluster a built-in ``layer`` (``cluster_weights`` fails
    deep inside otherwise; TFMOT has no public query)."""
    from tensorflow_model_optimization.python.core.clustering.keras.clustering_registry import ClusteringRegistry

    return ClusteringRegistry.supports(layer)


def tfmot_quant_ops():
    """TFMOT's quant_ops module, whose ``tf.__internal__.train.assign_moving_average`` and
    ``tf_compat.assign`` calls update the activation ranges: ``quantize(ranges="exact")`` gives it
    views of both (TFMOT has no hook on how a range is updated)."""
    from tensorflow_model_optimization.python.core.quantization.keras import quant_ops

    return quant_ops
