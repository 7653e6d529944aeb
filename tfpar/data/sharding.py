"""tf.data input for tfpar strategies: shard per worker, batch per replica.

`distribute` turns a dataset, a dataset function or a list of files into a
distributed dataset that ``model.fit`` accepts. Each worker reads its own
shard (by FILE or by DATA), batches it per replica, and handles the last,
uneven batch so that every worker runs the same number of steps: "pad" fills
it with masked examples (sample weight 0, so they change neither the loss nor
weighted metrics) and every example is seen exactly once per epoch; "drop"
leaves the remainder out. (`tfpar.data.coverage` reads every worker's shard
through the same code and reports how often each example was seen.)
"""

import dataclasses
from typing import Any

from tfpar._keras import tf
from tfpar._tasks.elastic_batch import ElasticBatch
from tfpar._topology import topology_of
from tfpar.data.batching import per_replica_batch_size
from tfpar.data.plan import ShardPlan, plan_shard
from tfpar.data.resume import InputPosition, layout_of, register
from tfpar.data.source import measure

# defined in worker_input.py; InputConfig, worker_dataset and worker_stream stay importable from
# here too
from tfpar.data.worker_input import (
    InputConfig,
    from_position,
    unsharded,
    worker_dataset,
    worker_epochs,
    worker_stream,
)

__all__ = ["DistributedInput", "InputConfig", "distribute", "worker_dataset", "worker_stream"]


@dataclasses.dataclass(frozen=True)
class DistributedInput:
    """What `distribute` returns: the dataset for ``fit`` and its steps per epoch."""

    dataset: object
    """A `tf.distribute.DistributedDataset` that repeats epoch after epoch."""
    steps_per_epoch: int
    """Global steps in one pass over the input (None for an infinite input)."""
    plan: ShardPlan
    """This worker's `ShardPlan`."""


def distribute(
    source: Any, strategy: Any, global_batch_size: int, **options: Any
) -> "DistributedInput":
    """Shards and batches ``source`` for ``strategy``, for ``fit``/``evaluate``.

    Each worker's pipeline yields the same number of steps per epoch and
    repeats, so pass ``steps_per_epoch`` (Keras needs it for a distributed
    dataset). Under a ParameterServer the result is a Keras ``DatasetCreator``
    run on each worker over the whole input (steps go to any free worker), so
    ``evaluate`` there reads ``steps`` batches from the workers' copies: a
    sample of the input, as in TensorFlow's parameter-server design. With
    ``remainder="pad"`` every example is seen exactly once per epoch. The input is counted once if
    tf.data cannot tell its size (files are always counted, to balance FILE shards).

    Args:
        source: a tf.data.Dataset of single examples, a function returning
            one (called on each worker), or a list of files (read with
            ``reader``, TFRecord by default).
        strategy: a `tf.distribute.Strategy` (any tfpar strategy), or a
            `tfpar.pipeline.Pipeline` (fed through its ``input_strategy``).
        global_batch_size: examples per step across all replicas; must be
            divisible by ``strategy.num_replicas_in_sync``.
        **options: the other fields of `InputConfig` (shard_policy,
            remainder, shuffle_buffer, seed, reader).

    Returns:
        A `DistributedInput`: ``.dataset`` and ``.steps_per_epoch``.

    Raises:
        ValueError: on a batch that does not divide, an unknown policy or
            remainder, or FILE sharding with fewer files than workers.

    Examples:
        >>> ds = tf.data.Dataset.from_tensor_slices((x, y))  # doctest: +SKIP
        >>> train = tfpar.data.distribute(ds, strategy, global_batch_size=64)
        >>> model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch)
    """
    _check_strategy(strategy)
    config = InputConfig(global_batch_size=global_batch_size, **options)
    replicas = strategy.num_replicas_in_sync
    per_replica_batch_size(global_batch_size, replicas)
    topology = topology_of(strategy)
    elastic = _scaling_the_batch(topology)
    weighted = elastic is not None
    # the reference's per-replica batch on each replica: the global batch follows the workers
    if elastic is not None:
        elastic.check_global_batch(global_batch_size, replicas // topology.num_workers)
        config = dataclasses.replace(
            config, global_batch_size=elastic.global_batch(global_batch_size, topology.num_workers)
        )
    strategy = getattr(strategy, "input_strategy", strategy)  # a pipeline splits the batch itself
    own_shard = _own_shard(strategy, topology)
    if topology_of(strategy).coordinator:
        return _for_parameter_servers(source, config, replicas)
    sizes = measure(source, config, strategy)  # files: counted once per job, shared
    plans = []
    # Unseeded, a shuffle's order cannot be built again in another process: no exact resume.
    exact = not config.shuffle_buffer or config.seed is not None
    position = InputPosition(exact=exact)

    def dataset_fn(context):
        context = own_shard or context
        epoch_dataset, plan = worker_epochs(
            source,
            config,
            num_workers=context.num_input_pipelines,
            worker_index=context.input_pipeline_id,
            num_replicas=context.num_replicas_in_sync,
            sizes=sizes,
            weighted=weighted,
        )
        plans.append(plan)
        return unsharded(from_position(epoch_dataset, position, weighted)).prefetch(
            tf.data.AUTOTUNE
        )

    distributed = strategy.distribute_datasets_from_function(dataset_fn)
    position.layout = layout_of(plans[0])
    position.plan = plans[0]
    position.num_elements = sizes.num_elements
    if elastic is not None:
        position.layout.update(
            scale_lr=True, learning_rate_factor=elastic.learning_rate_factor(topology.num_workers)
        )
    register(distributed, position)
    return DistributedInput(distributed, plans[0].steps, plans[0])


def _check_strategy(strategy):
    if not hasattr(strategy, "num_replicas_in_sync"):
        raise TypeError(
            "strategy must be a tf.distribute.Strategy (e.g. tfpar.DataParallel()) or a "
            f"tfpar.pipeline.Pipeline. Received: strategy={strategy!r}. Pass "
            "tf.distribute.get_strategy() for one device."
        )


def _scaling_the_batch(topology):
    """The elastic job's `ElasticBatch` when its global batch follows the workers, else None."""
    elastic = ElasticBatch.from_env()
    if elastic is not None and (not elastic.scales_learning_rate or topology.coordinator):
        return None  # only "scale-lr" changes the input (not a parameter server's)
    return elastic


def _own_shard(strategy, topology):
    """A pipeline across workers feeds itself under the default strategy: its worker's shard, as a
    worker's (an `InputContext`); else None."""
    if (
        topology.num_workers > 1
        and not tf.distribute.has_strategy()
        and strategy is tf.distribute.get_strategy()
    ):
        return tf.distribute.InputContext(
            topology.num_workers, topology.worker_index, topology.num_workers
        )
    return None


def _for_parameter_servers(source, config, replicas):
    """Parameter-server input: each worker builds the whole input itself, shuffled its own way.

    Steps run on whichever worker is free, so there is no per-worker shard to
    balance: an epoch is ``steps_per_epoch`` global batches, drawn by the
    workers from their own copies of the input (TensorFlow's recommended
    pattern). The dataset is built on the workers, so it must come from a
    function or from files.
    """
    from tfpar.data._ps_input import ParameterServerInput

    if isinstance(source, tf.data.Dataset):
        raise ValueError(
            "With a ParameterServer the workers build their input themselves, so tfpar needs "
            "a function that returns the dataset (or a list of files). Received: a "
            "tf.data.Dataset built in this process. Pass e.g. `lambda: "
            "tf.data.Dataset.from_tensor_slices((x, y))`."
        )
    sizes = measure(source, config)

    def dataset_fn(context):
        epoch_dataset, _ = worker_epochs(
            source,
            config,
            num_workers=1,
            worker_index=0,
            num_replicas=context.num_replicas_in_sync,
            sizes=sizes,
        )
        return unsharded(epoch_dataset(None)).repeat().prefetch(tf.data.AUTOTUNE)

    plan = plan_shard(
        num_workers=1,
        worker_index=0,
        replicas_per_worker=replicas,
        per_replica_batch=config.global_batch_size // replicas,
        policy="off",
        remainder=config.remainder,
        num_elements=sizes.num_elements,
    )
    return DistributedInput(ParameterServerInput(dataset_fn, plan.steps), plan.steps, plan)
