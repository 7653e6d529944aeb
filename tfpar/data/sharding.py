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
import random
from typing import Any

from tfpar._checks import check_choice, check_int, check_number
from tfpar._keras import tf
from tfpar._tasks.elastic_batch import ElasticBatch
from tfpar._topology import topology_of
from tfpar.data.batching import per_replica_batch_size
from tfpar.data.padding import batch, weigh_examples
from tfpar.data.plan import REMAINDERS, SHARD_POLICIES, ShardPlan, plan_shard
from tfpar.data.resume import InputPosition, layout_of, register
from tfpar.data.source import measure, open_source, read_files

__all__ = ["DistributedInput", "InputConfig", "distribute", "worker_dataset", "worker_stream"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class InputConfig:
    """How `distribute` builds each worker's input."""

    global_batch_size: int
    """Examples per step across all replicas."""
    shard_policy: str = "auto"
    """One of `tfpar.data.plan.SHARD_POLICIES`: "auto", "file", "data", "off"."""
    remainder: str = "pad"
    """"pad" (default: masked padding, every example exactly once) or "drop"."""
    shuffle_buffer: int = 0
    """Shuffle with this buffer (0: keep the order): the job's order before it is dealt (DATA sharding
    with a ``seed``), else each worker's shard."""
    seed: int | None = None
    """Shuffle seed, None for a random one. With it, each epoch's order is the seed's and the epoch's
    alone: with DATA sharding (or one worker) the whole input is shuffled in that order and then dealt
    step by step (so a resume may change the number of workers), else worker i shuffles its own shard
    with seed + i. A new process builds the same order again: a resume continues at the exact example."""
    reader: object = None
    """For a list of files: path tensor -> dataset (default: TFRecordDataset)."""

    def __post_init__(self):
        per_replica_batch_size(self.global_batch_size, 1)  # type and range
        check_choice("shard_policy", self.shard_policy, SHARD_POLICIES)
        check_choice("remainder", self.remainder, REMAINDERS)
        check_int("shuffle_buffer", self.shuffle_buffer, 0)
        check_number("seed", self.seed, minimum=0, integer=True, allow_none=True)
        if self.reader is not None and not callable(self.reader):
            raise TypeError(
                f"reader must be a callable path -> tf.data.Dataset. Received: {self.reader!r}."
            )


def worker_dataset(source: Any, config: "InputConfig", *, num_workers: int, worker_index: int, num_replicas: int,
                   sizes: Any = None, epoch: int = 0) -> tuple:
    """Builds one worker's dataset for one epoch: its shard, batched per replica.

    `check_coverage` calls this for every worker index in one process; `distribute` builds the
    same epochs, one after the other, on every worker.

    Args:
        source: a tf.data.Dataset, a function returning one, or file names.
        config: an `InputConfig`.
        num_workers: number of workers (input pipelines).
        worker_index: this worker's index.
        num_replicas: replicas across all workers.
        sizes: the input's sizes if already measured (internal).
        epoch: which epoch (0-based): with a shuffle, each epoch's order is its own, and the
            same in every process for a given ``seed``.

    Returns:
        ``(dataset, plan)``: a tf.data.Dataset of per-replica batches that
        yields ``plan.steps * plan.replicas_per_worker`` batches (every
        worker the same), and the `ShardPlan`.
    """
    epoch_dataset, plan = _worker_epochs(source, config, num_workers=num_workers, worker_index=worker_index,
                                         num_replicas=num_replicas, sizes=sizes)
    dataset = tf.data.Dataset.from_tensors(tf.constant(epoch, tf.int64)).flat_map(epoch_dataset)
    return _unsharded(dataset), plan


def worker_stream(source: Any, config: "InputConfig", *, num_workers: int, worker_index: int, num_replicas: int,
                  epoch: int = 0, step: int = 0, sizes: Any = None) -> tuple:
    """One worker's input as an endless stream of epochs, starting at global ``step`` of ``epoch``.

    The epochs are `worker_dataset`'s, one after the other; the stream leaves out this worker's
    part of the steps before ``step``. With a seed and DATA sharding, a step holds the same
    examples for any ``num_workers``, so a job that stood at (``epoch``, ``step``) with some number of
    workers goes on here with another, every example of the epoch still once
    (`tfpar.integrations.horovod` builds Horovod Elastic's input with it).

    Returns:
        ``(dataset, plan)``: an endless tf.data.Dataset of per-replica batches and the `ShardPlan`.
    """
    check_int("epoch", epoch, 0)
    check_int("step", step, 0)
    epoch_dataset, plan = _worker_epochs(source, config, num_workers=num_workers, worker_index=worker_index,
                                         num_replicas=num_replicas, sizes=sizes)
    if plan.steps is not None and step >= plan.steps:
        raise ValueError(f"step must be below the {plan.steps} steps of an epoch. Received: step={step}. "
                         "Pass the next epoch with step=0.")
    return _unsharded(_epochs(epoch_dataset, epoch, step * plan.replicas_per_worker)), plan


def _worker_epochs(source, config, *, num_workers, worker_index, num_replicas, sizes, weighted=False):
    """``(epoch -> that epoch's dataset, plan)``: one worker's input, epoch by epoch (the function
    runs inside a tf.data function, with the epoch a tensor; None: the parameter servers' input).
    ``weighted``: every example carries a weight, and the function takes `weigh_examples`' mask too."""
    per_replica = per_replica_batch_size(config.global_batch_size, num_replicas)
    sizes = sizes or measure(source, config)
    dataset, files = open_source(source)
    plan = plan_shard(
        num_workers=num_workers,
        worker_index=worker_index,
        replicas_per_worker=num_replicas // num_workers,
        per_replica_batch=per_replica,
        policy=config.shard_policy,
        remainder=config.remainder,
        num_elements=sizes.num_elements,
        files=files,
        file_sizes=sizes.file_sizes,
    )
    if files is not None:
        dataset = read_files(plan.files or files, config.reader)
    # One order for the whole job, shuffled and then dealt step by step, where a step's examples must not
    # depend on the number of workers (`ShardPlan.resizable`) and the order can be built again (a seed).
    job_order = plan.resizable and config.seed is not None
    # The seed, made once: unseeded, this process' own random one (epochs still differ).
    seed = (config.seed + (0 if job_order else worker_index) if config.seed is not None
            else random.SystemRandom().randrange(_MAX_SEED)) % _MAX_SEED

    def shuffled(shard, epoch):
        if not config.shuffle_buffer:
            return shard
        if epoch is None:  # parameter servers: each worker its own order, each pass
            return shard.shuffle(config.shuffle_buffer, seed=None if config.seed is None else seed)
        # This function's own graph seed: the order depends on the seed, the worker (or the job) and
        # the epoch alone, not on a global seed the script may or may not set.
        tf.random.set_seed(_GRAPH_SEED)
        return shard.shuffle(config.shuffle_buffer, seed=seed * _EPOCH_STRIDE + epoch, reshuffle_each_iteration=False)

    def epoch_dataset(epoch, *mask):
        shard = shuffled(dataset, epoch) if job_order else dataset
        if weighted:  # in the job's order, before it is dealt: a mask counts the epoch's examples
            shard = weigh_examples(shard, *mask)
        if plan.policy == "data":  # this worker's part of every step (`tfpar.data.plan`)
            part = plan.replicas_per_worker * plan.per_replica_batch
            shard = shard.batch(part).shard(num_workers, worker_index).unbatch()
        return batch(shard if job_order else shuffled(shard, epoch), plan)

    return epoch_dataset, plan


_GRAPH_SEED = 1_000_033
_EPOCH_STRIDE = 1_000_003  # epochs of one worker get distinct seeds (taken modulo 2**31 - 1)
_MAX_SEED = 2**31 - 1
_NO_END = 2**62


def _epochs(epoch_dataset, first=0, skip=0, mask=None):
    """Epochs ``first``, ``first + 1``, ... one after the other, the first ``skip`` batches left out (and
    ``mask``, `weigh_examples`' arguments, applied to epoch ``first``)."""
    epochs = tf.data.Dataset.range(first, _NO_END)
    if mask is None:
        return epochs.flat_map(epoch_dataset).skip(skip)
    return epochs.flat_map(lambda e: epoch_dataset(e, *(tf.where(e == first, m, tf.zeros_like(m)) for m in mask))).skip(skip)


def _from_position(epoch_dataset, position, weighted=False):
    """`_epochs` from where ``position`` stands when an iterator starts (`tfpar.data.resume`)."""

    def start(_):
        first, skip, *mask = (tf.ensure_shape(t, []) for t in tf.py_function(
            position.start, [], (tf.int64, tf.int64, tf.int64, tf.int64, tf.float32)))
        return _epochs(epoch_dataset, first, skip, mask if weighted else None)

    # Endless, and said so: with an unknown cardinality a multi-worker iterator would agree with the
    # other workers at every step that each still has data (a collective per step, waiting on the slowest).
    endless = tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY)
    return tf.data.Dataset.range(1).flat_map(start).apply(endless)


def _unsharded(dataset):
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.with_options(options)


@dataclasses.dataclass(frozen=True)
class DistributedInput:
    """What `distribute` returns: the dataset for ``fit`` and its steps per epoch."""

    dataset: object
    """A `tf.distribute.DistributedDataset` that repeats epoch after epoch."""
    steps_per_epoch: int
    """Global steps in one pass over the input (None for an infinite input)."""
    plan: ShardPlan
    """This worker's `ShardPlan`."""


def distribute(source: Any, strategy: Any, global_batch_size: int, **options: Any) -> "DistributedInput":
    """Shards and batches ``source`` for ``strategy``, for ``fit``/``evaluate``.

    Each worker's pipeline yields the same number of steps per epoch and
    repeats, so pass ``steps_per_epoch`` (Keras needs it for a distributed
    dataset). Under a ParameterServer the result is a Keras ``DatasetCreator``
    run on each worker over the whole input (steps go to any free worker), so
    ``evaluate`` there reads ``steps`` batches from the workers' copies: a
    sample of the input, as in TensorFlow's parameter-server design. With
    ``remainder="pad"`` every example is seen exactly once per epoch. The input is counted once if tf.data cannot tell its size
    (files are always counted, to balance FILE shards).

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
    if not hasattr(strategy, "num_replicas_in_sync"):
        raise TypeError(
            "strategy must be a tf.distribute.Strategy (e.g. tfpar.DataParallel()) or a "
            f"tfpar.pipeline.Pipeline. Received: strategy={strategy!r}. Pass "
            "tf.distribute.get_strategy() for one device.")
    config = InputConfig(global_batch_size=global_batch_size, **options)
    replicas = strategy.num_replicas_in_sync
    per_replica_batch_size(global_batch_size, replicas)
    topology = topology_of(strategy)
    elastic = ElasticBatch.from_env()
    if elastic is not None and (not elastic.scales_learning_rate or topology.coordinator):
        elastic = None  # only "scale-lr" changes the input (not a parameter server's)
    weighted = elastic is not None
    if elastic is not None:  # the reference's per-replica batch on each replica: the global batch follows the workers
        elastic.check_global_batch(global_batch_size, replicas // topology.num_workers)
        config = dataclasses.replace(config, global_batch_size=elastic.global_batch(global_batch_size, topology.num_workers))
    strategy = getattr(strategy, "input_strategy", strategy)  # a pipeline splits the batch itself
    # A pipeline across workers feeds itself under the default strategy: its worker's shard, as a worker's.
    own_shard = (tf.distribute.InputContext(topology.num_workers, topology.worker_index, topology.num_workers)
                 if topology.num_workers > 1 and not tf.distribute.has_strategy() and strategy is tf.distribute.get_strategy()
                 else None)
    if topology_of(strategy).coordinator:
        return _for_parameter_servers(source, config, replicas)
    sizes = measure(source, config, strategy)  # files: counted once per job, shared
    plans = []
    # Unseeded, a shuffle's order cannot be built again in another process: no exact resume.
    exact = not config.shuffle_buffer or config.seed is not None
    position = InputPosition(exact=exact)

    def dataset_fn(context):
        context = own_shard or context
        epoch_dataset, plan = _worker_epochs(
            source,
            config,
            num_workers=context.num_input_pipelines,
            worker_index=context.input_pipeline_id,
            num_replicas=context.num_replicas_in_sync,
            sizes=sizes,
            weighted=weighted,
        )
        plans.append(plan)
        return _unsharded(_from_position(epoch_dataset, position, weighted)).prefetch(tf.data.AUTOTUNE)

    distributed = strategy.distribute_datasets_from_function(dataset_fn)
    position.layout, position.plan, position.num_elements = layout_of(plans[0]), plans[0], sizes.num_elements
    if elastic is not None:
        position.layout.update(scale_lr=True, learning_rate_factor=elastic.learning_rate_factor(topology.num_workers))
    register(distributed, position)
    return DistributedInput(distributed, plans[0].steps, plans[0])


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
            "tf.data.Dataset.from_tensor_slices((x, y))`.")
    sizes = measure(source, config)

    def dataset_fn(context):
        epoch_dataset, _ = _worker_epochs(source, config, num_workers=1, worker_index=0,
                                             num_replicas=context.num_replicas_in_sync, sizes=sizes)
        return _unsharded(epoch_dataset(None)).repeat().prefetch(tf.data.AUTOTUNE)

    plan = plan_shard(num_workers=1, worker_index=0, replicas_per_worker=replicas,
                      per_replica_batch=config.global_batch_size // replicas, policy="off",
                      remainder=config.remainder, num_elements=sizes.num_elements)
    return DistributedInput(ParameterServerInput(dataset_fn, plan.steps), plan.steps, plan)
