"""A step's batch cut into microbatches: replicas × num_microbatches equal slices along its first
axis, and `fit`'s refusal, before the first step, of arrays whose batches would not cut so."""

from typing import Any

from tfpar._keras import tf

__all__ = ["check_fit_batches", "split_batch", "split_microbatches"]


def split_batch(structure: Any, parts: int) -> list:
    """``parts`` equal slices of a (nested) batch along its first axis; Nones for None."""
    if structure is None:
        return [None] * parts
    pieces = [tf.split(tf.identity(t), parts) for t in tf.nest.flatten(structure)]
    return [
        tf.nest.pack_sequence_as(structure, [piece[j] for piece in pieces]) for j in range(parts)
    ]


def check_fit_batches(
    x: Any, batch_size: int | None, validation_split: float | None, parts: int
) -> None:
    """Refuses arrays ``x`` that ``fit`` would cut into a batch (every one, or each epoch's last)
    that does not split into ``parts`` equal microbatches; a dataset is not checked here.

    Raises:
        ValueError: such a batch, with the batch size and the examples that make it.
    """
    if x is None or isinstance(x, tf.data.Dataset) or not hasattr(tf.nest.flatten(x)[0], "shape"):
        return
    n = len(tf.nest.flatten(x)[0])
    size = batch_size or 32
    if validation_split:
        n = int(n * (1 - validation_split))
    if size % parts or (n % size and (n % size) % parts):
        uneven = "every batch" if size % parts else f"the last batch of each epoch ({n % size})"
        raise ValueError(
            "Each batch must split into replicas × num_microbatches = "
            f"{parts} equal microbatches. "
            f"Received: {n} examples in batches of batch_size={size}, so {uneven} "
            f"does not divide by {parts}. Use a batch_size that divides by {parts} and a "
            "number of examples that leaves no partial batch, or tf.data with "
            "drop_remainder=True."
        )


def split_microbatches(x: Any, y: Any, sample_weight: Any, replicas: int, m: int) -> tuple:
    """Splits the batch into replicas × num_microbatches (``m``) equal microbatches: the lists of
    their inputs, targets and sample weights."""
    parts = replicas * m
    first = tf.nest.flatten(x)[0]
    message = (
        f"replicas × num_microbatches = {replicas} × {m} must divide the batch. A batch of "
        "another size came (an epoch's last, partial batch?): use a global batch that divides "
        f"by {parts} with drop_remainder=True, or tfpar.data.distribute (full batches)."
    )
    if first.shape[0] is not None and first.shape[0] % parts:
        raise ValueError(f"{message} Received: a batch of {first.shape[0]}.")
    with tf.control_dependencies(
        [tf.debugging.assert_equal(tf.shape(first)[0] % parts, 0, message=message)]
    ):
        return tuple(split_batch(t, parts) for t in (x, y, sample_weight))
