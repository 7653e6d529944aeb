"""TensorFlow's private tf.distribute and runtime internals: the strategy-author hooks
HorovodStrategy and the multi-worker DataParallel override, the values and datasets they build,
and the few runtime switches and queries TensorFlow keeps private."""

import tensorflow as tf
from tensorflow.python.distribute import collective_all_reduce_strategy as _collective_strategy
from tensorflow.python.distribute import distribute_utils as _distribute_utils
from tensorflow.python.distribute import input_util as _input_util
from tensorflow.python.distribute import mirrored_strategy as _mirrored_strategy
from tensorflow.python.distribute import values as _values
from tensorflow.python.eager import record as _record
from tensorflow.python.ops import control_flow_util as _control_flow_util
from tensorflow.python.ops import resource_variable_ops as _resource_variable_ops
from tensorflow.python.trackable import base as _trackable_base

__all__ = [
    "CROSS_DEVICE_OPS_HOOKS",
    "CollectiveAllReduceExtended",
    "MIRRORED_EXTENDED_HOOKS",
    "Mirrored",
    "MirroredExtended",
    "PerReplica",
    "ResourceVariable",
    "Trackable",
    "assign_moving_average",
    "cross_device_ops_of",
    "get_distributed_dataset",
    "get_distributed_datasets_from_function",
    "in_xla_context",
    "mirrored",
    "ps_num_workers",
    "tape_recording",
    "stop_removing_functions",
    "unwrap_initial_value",
]


MirroredExtended = _mirrored_strategy.MirroredExtended
"""Base of `HorovodStrategy`'s extended: no public API lets a strategy replace its reductions."""


MIRRORED_EXTENDED_HOOKS = (
    "_get_cross_device_ops",
    "_reduce_to",
    "_batch_reduce_to",
    "_update",
    "_replica_ctx_all_reduce",
    "_get_variable_creator_initial_value",
    "_experimental_distribute_dataset",
    "_distribute_datasets_from_function",
    "_num_replicas_in_sync",
    "_in_multi_worker_mode",
    "_get_replica_id_in_sync_group",
    "_get_local_replica_id",
    "_input_workers_with_options",
    "_container_strategy",
)
"""MirroredExtended members HorovodStrategy overrides or calls (the strategy-author hooks TensorFlow
keeps private)."""


CROSS_DEVICE_OPS_HOOKS = ("_gather",)
"""CrossDeviceOps members HorovodStrategy overrides (gather has no public implementation hook)."""


CollectiveAllReduceExtended = _collective_strategy.CollectiveAllReduceExtended
"""Base of the multi-worker `DataParallel`'s extended, as MirroredExtended is of the one-host one:
the gradient compression and accumulation hooks (`_batch_reduce_to`, `_update`) have no public
API."""


Mirrored = _values.Mirrored
"""A value identical on every replica (a MEAN of it is itself); only DistributedValues is public."""


PerReplica = _values.PerReplica
"""One value per local replica, as a strategy's reductions take them (no public constructor)."""


def mirrored(components):
    """The Mirrored value of a reduction's per-device results, built as TensorFlow's own
    cross-device ops build theirs (one device: the tensor itself)."""
    return _distribute_utils.regroup(tuple(components), wrap_class=Mirrored)


ResourceVariable = _resource_variable_ops.ResourceVariable
"""A variable on one device that no strategy's variable creator intercepts (Horovod's accumulation
buffers); tf.Variable inside a scope would become a mirrored variable."""


get_distributed_dataset = _input_util.get_distributed_dataset
"""The DistributedDataset a Mirrored-based strategy builds for experimental_distribute_dataset."""


get_distributed_datasets_from_function = _input_util.get_distributed_datasets_from_function
"""The same for distribute_datasets_from_function, with tfpar's own input context (shard by
rank)."""


def in_xla_context():
    """Whether the graph being built is compiled by XLA (no public query)."""
    return _control_flow_util.GraphOrParentsInXlaContext(
        __import__("tensorflow").compat.v1.get_default_graph()
    )


def tape_recording():
    """Whether a gradient tape is recording here (no public query): only then does a recomputed
    call (`tfpar.remat`) differ from a plain one."""
    return _record.could_possibly_record()


def unwrap_initial_value(initial):
    """A checkpoint-restored initial value (CheckpointInitialValue) as the tensor inside it."""
    return getattr(initial, "wrapped_value", initial)


def cross_device_ops_of(strategy):
    """The CrossDeviceOps a MirroredStrategy was built with, or None (no public getter)."""
    return getattr(strategy.extended, "_cross_device_ops", None)


def ps_num_workers(strategy):
    """How many workers a ParameterServerStrategy schedules on (no public count)."""
    return strategy.extended._num_workers


assign_moving_average = tf.__internal__.train.assign_moving_average
"""The moving-average update tensorflow-model-optimization's quantizers call, which tfpar's exact
ranges replace to average over the replicas first (`tfpar.quantization._exact_ranges`); only under
``tf.__internal__``."""


Trackable = _trackable_base.Trackable
"""TensorFlow's checkpointable object: one with ``_serialize_to_tensors``/``_restore_from_tensors``
writes and reads tensors of its own making under its place in a checkpoint's object graph."""


def stop_removing_functions():
    """From now on a garbage-collected tf.function stays in the eager context. A context connected
    to a cluster removes each one from every remote task too, and logs four error lines per task
    when that fails; once the job's servers are gone (at exit, after `ParameterServer.shutdown`) it
    can only fail. TensorFlow has no public switch; the private method is replaced on this context
    only."""
    from tensorflow.python.eager import context

    context.context().remove_function = lambda name: None
