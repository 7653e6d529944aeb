"""One worker's input: its shard of the job's examples, epoch by epoch, shuffled in the job's order
or its own and batched per replica (`InputConfig` says how); the stream of epochs a fit, or a
resume, starts where its position says."""

import dataclasses
import random
from collections.abc import Callable
from typing import Any

from tfpar._checks import check_choice, check_int, check_number
from tfpar._keras import tf
from tfpar.data.batching import per_replica_batch_size
from tfpar.data.padding import batch, weigh_examples
from tfpar.data.plan import REMAINDERS, SHARD_POLICIES, plan_shard
from tfpar.data.source import measure, open_source, read_files

__all__ = [
    "InputConfig",
    "from_position",
    "unsharded",
    "worker_dataset",
    "worker_epochs",
    "worker_stream",
]


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
    """Shuffle with this buffer (0: keep the order): the job's order before it is dealt (DATA
    sharding with a ``seed``), else each worker's shard."""
    seed: int | None = None
    """Shuffle seed, None for a random one. With it, each epoch's order is the seed's and the
    epoch's alone: with DATA sharding (or one worker) the whole input is shuffled in that order and
    then dealt step by step (so a resume may change the number of workers), else worker i shuffles
    its own shard with seed + i. A new process builds the same order again: a resume continues at
    the exact example."""
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


def worker_dataset(
    source: Any,
    config: "InputConfig",
    *,
    num_workers: int,
    worker_index: int,
    num_replicas: int,
    sizes: Any = None,
    epoch: int = 0,
) -> tuple:
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
    epoch_dataset, plan = worker_epochs(
        source,
        config,
        num_workers=num_workers,
        worker_index=worker_index,
        num_replicas=num_replicas,
        sizes=sizes,
    )
    dataset = tf.data.Dataset.from_tensors(tf.constant(epoch, tf.int64)).flat_map(epoch_dataset)
    return unsharded(dataset), plan


def worker_stream(
    source: Any,
    config: "InputConfig",
    *,
    num_workers: int,
    worker_index: int,
    num_replicas: int,
    epoch: int = 0,
    step: int = 0,
    sizes: Any = None,
) -> tuple:
    """One worker's input as an endless stream of epochs, starting at global ``step`` of ``epoch``.

    The epochs are `worker_dataset`'s, one after the other; the stream leaves out this worker's
    part of the steps before ``step``. With a seed and DATA sharding, a step holds the same
    examples for any ``num_workers``, so a job that stood at (``epoch``, ``step``) with some number
    of workers goes on here with another, every example of the epoch still once
    (`tfpar.integrations.horovod` builds Horovod Elastic's input with it).

    Returns:
        ``(dataset, plan)``: an endless tf.data.Dataset of per-replica batches and the `ShardPlan`.
    """
    check_int("epoch", epoch, 0)
    check_int("step", step, 0)
    epoch_dataset, plan = worker_epochs(
        source,
        config,
        num_workers=num_workers,
        worker_index=worker_index,
        num_replicas=num_replicas,
        sizes=sizes,
    )
    if plan.steps is not None and step >= plan.steps:
        raise ValueError(
            f"step must be below the {plan.steps} steps of an epoch. Received: step={step}. "
            "Pass the next epoch with step=0."
        )
    return unsharded(_epochs(epoch_dataset, epoch, step * plan.replicas_per_worker)), plan


def worker_epochs(
    source: Any,
    config: InputConfig,
    *,
    num_workers: int,
    worker_index: int,
    num_replicas: int,
    sizes: Any,
    weighted: bool = False,
) -> tuple:
    """``(epoch -> that epoch's dataset, plan)``: one worker's input, epoch by epoch (the function
    runs inside a tf.data function, with the epoch a tensor; None: the parameter servers' input).
    ``weighted``: every example carries a weight, and the function takes `weigh_examples`' mask
    too."""
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
    # One order for the whole job, shuffled and then dealt step by step, where a step's examples
    # must not depend on the number of workers (`ShardPlan.resizable`) and the order can be built
    # again (a seed).
    job_order = plan.resizable and config.seed is not None
    # The seed, made once: unseeded, this process' own random one (epochs still differ).
    seed = (
        config.seed + (0 if job_order else worker_index)
        if config.seed is not None
        else random.SystemRandom().randrange(_MAX_SEED)
    ) % _MAX_SEED

    def shuffled(shard, epoch):
        if not config.shuffle_buffer:
            return shard
        if epoch is None:  # parameter servers: each worker its own order, each pass
            return shard.shuffle(config.shuffle_buffer, seed=None if config.seed is None else seed)
        # This function's own graph seed: the order depends on the seed, the worker (or the job) and
        # the epoch alone, not on a global seed the script may or may not set.
        tf.random.set_seed(_GRAPH_SEED)
        return shard.shuffle(
            config.shuffle_buffer, seed=seed * _EPOCH_STRIDE + epoch, reshuffle_each_iteration=False
        )

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
    """Epochs ``first``, ``first + 1``, ... one after the other, the first ``skip`` batches left out
    (and ``mask``, `weigh_examples`' arguments, applied to epoch ``first``)."""
    epochs = tf.data.Dataset.range(first, _NO_END)
    if mask is None:
        return epochs.flat_map(epoch_dataset).skip(skip)
    return epochs.flat_map(
        lambda e: epoch_dataset(e, *(tf.where(e == first, m, tf.zeros_like(m)) for m in mask))
    ).skip(skip)


def from_position(epoch_dataset: Callable, position: Any, weighted: bool = False) -> Any:
    """`_epochs` from where ``position`` stands when an iterator starts (`tfpar.data.resume`)."""

    def start(_):
        first, skip, *mask = (
            tf.ensure_shape(t, [])
            for t in tf.py_function(
                position.start, [], (tf.int64, tf.int64, tf.int64, tf.int64, tf.float32)
            )
        )
        return _epochs(epoch_dataset, first, skip, mask if weighted else None)

    # Endless, and said so: with an unknown cardinality a multi-worker iterator would agree with the
    # other workers at every step that each still has data (a collective per step, waiting on the
    # slowest).
    endless = tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY)
    return tf.data.Dataset.range(1).flat_map(start).apply(endless)


def unsharded(dataset: Any) -> Any:
    """``dataset`` with tf.data's auto-sharding off: each worker's pipeline is its shard already."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.with_options(options)
