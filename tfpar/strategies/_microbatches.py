"""An elastic job's micro-batches: the global batch kept on fewer workers without larger per-replica
batches.

An elastic ``tfpar launch`` tells each worker how many workers the global batch was divided for
(`tfpar._tasks.elastic_batch.ElasticBatch`). On fewer, `tfpar.data.distribute` still deals each step
the whole global batch, so each replica's batch grows; under ``--elastic-batch accumulate`` (the
default) a `DataParallel` replica computes it in ``k`` micro-batches, none larger than the full
job's per-replica batch, and the strategy's `GradientAccumulator` applies their averaged gradients
once, at the end of the step. A step still holds the same examples, so positions, backups and
exactly-once are unchanged.

- The step is the model's own ``train_step`` called ``k`` times on consecutive slices of the
  replica's batch (a subclass's ``train_step`` too), so the loss, loss scaling and metrics are what
  it computes. Each slice's loss is its mean and the accumulator averages the ``k``: with equal
  slices, the mean over the replica's batch, as the full job computes it (BatchNormalization sees
  the smaller slices).
- The optimizer's ``iterations`` counts one step, not ``k``: it counts the accumulator's updates
  (`GradientAccumulator.count_updates`), and the ``k`` calls make one window, so a learning-rate
  schedule follows the full job's (a window whose update the loss scale skips counts none).
- A loss scale that finds one micro-batch's gradients non-finite skips the whole step (its window of
  the accumulator dropped, `GradientAccumulator.settle`), as it would skip the step unsplit. A
  micro-batch's loss is the mean over fewer examples, so its scaled gradients are larger and may
  overflow where the whole batch's would not: then the loss scale halves one step earlier than it
  would have.
"""

from tfpar._keras import tf
from tfpar._tasks.elastic_batch import ElasticBatch
from tfpar.strategies._windows import accumulator_of, calls_per_step

__all__ = ["elastic_microbatches", "split_into_microbatches"]

_MARK = "_tfpar_microbatches"  # the model's __dict__: the count its train_step is split into


def elastic_microbatches(cluster) -> int:
    """The micro-batches a replica's batch is computed in on this worker's job (1 outside an elastic
    launch, at its reference size, or under ``--elastic-batch grow``); the chief says so when above
    1."""
    setting = ElasticBatch.from_env()
    workers = cluster.num_workers if cluster is not None else 1
    if setting is None:
        return 1
    count = setting.microbatches(workers)
    if count > 1 and (cluster is None or cluster.is_chief):
        print(
            f"tfpar: an elastic job on {workers} of {setting.reference_workers} workers: each "
            f"replica computes its batch in {count} micro-batches and applies their accumulated "
            "gradients once, so the global batch stays the one given and no micro-batch is larger "
            "than the full job's per-replica batch",
            flush=True,
        )
    return count


def split_into_microbatches(model, arguments):
    """Before ``fit``: under a strategy whose ``extended._microbatches`` is above 1, ``model``'s
    ``train_step`` becomes that many calls of its own on slices of the replica's batch (once per
    model)."""
    count = calls_per_step(model.distribute_strategy)
    if count <= 1 or model.__dict__.get(_MARK) == count:
        return
    step = model.train_step
    accumulator = accumulator_of(model.distribute_strategy)

    def train_step(data):
        context = tf.distribute.get_replica_context()
        logs = None
        context.merge_call(lambda _: accumulator.begin_step())
        for index in range(count):
            logs = step(tf.nest.map_structure(lambda t: _slice(t, index, count), data))
        context.merge_call(lambda _: accumulator.settle(count))
        return logs

    object.__setattr__(model, "train_step", train_step)  # past Keras' attribute tracking
    object.__setattr__(model, _MARK, count)
    model.train_function = None  # made again, calling this train_step


def _slice(tensor, index, count):
    """The ``index``-th of ``count`` equal slices of ``tensor``'s rows (None stays None)."""
    if tensor is None:
        return None
    if isinstance(tensor, tf.SparseTensor):
        raise TypeError(
            f"An elastic job on fewer workers splits each replica's batch into {count} "
            "micro-batches, and a SparseTensor cannot be sliced by rows here. Received: a "
            "SparseTensor in fit's input. Densify it in the input pipeline, or launch with "
            "--elastic-batch grow."
        )
    tensor = tensor if isinstance(tensor, tf.RaggedTensor) else tf.convert_to_tensor(tensor)
    if tensor.shape.rank == 0:
        return tensor
    static = tensor.shape[0] if tensor.shape.rank else None
    rows = (
        tensor.nrows()
        if isinstance(tensor, tf.RaggedTensor)
        else tf.shape(tensor, out_type=tf.int64)[0]
    )
    if static is not None and static % count:
        raise ValueError(
            f"An elastic job on fewer workers splits each replica's batch into {count} equal "
            f"micro-batches, and this replica's batch holds {static} examples. Received: a "
            f"per-replica batch of {static}. Use a global batch that divides by workers x replicas "
            f"x {count} (tfpar.data.distribute checks it before the first step), or launch with "
            "--elastic-batch grow."
        )
    if static is None:
        tf.debugging.assert_equal(
            rows % count,
            tf.cast(0, rows.dtype),
            message=(
                f"an elastic job's micro-batches: the per-replica batch must divide by {count} "
                "(use a global batch that divides by workers x replicas x micro-batches, or "
                "--elastic-batch grow)"
            ),
        )
    size = rows // count
    return tensor[index * size : (index + 1) * size]
