"""Per-replica batches of one worker's shard, exactly the plan's steps: the last, short batches
padded with masked examples (sample weight 0) and the real examples of padded steps weighed
global/real."""

from typing import Any

from tfpar._keras import tf

__all__ = ["batch", "weigh_examples"]


def _check_padable(spec):
    if not isinstance(spec, tuple) or len(spec) not in (2, 3):
        raise ValueError(
            "remainder='pad' needs (inputs, targets) or (inputs, targets, "
            "sample_weight) elements, so that padded examples carry sample "
            f"weight 0. Received elements of spec {spec}. Use remainder='drop' "
            "or add targets."
        )
    for s in tf.nest.flatten(spec):
        if not s.shape.is_fully_defined():
            raise ValueError(
                "remainder='pad' needs examples of a fixed shape to build "
                f"padding. Received elements of spec {spec}. Use "
                "remainder='drop' or give the examples a fixed shape."
            )


def _pad_batch(size):
    """Per-batch map: add a weight column (1 per example) and pad a short batch to ``size``."""

    def pad(t):
        extra = size - tf.shape(t)[0]
        padded = tf.pad(t, [[0, extra]] + [[0, 0]] * (t.shape.rank - 1))
        return tf.ensure_shape(padded, [size] + t.shape[1:].as_list())

    def fn(*batch):
        if len(batch) == 2:
            batch = (*batch, tf.ones(tf.shape(tf.nest.flatten(batch[0])[0])[:1], tf.float32))
        full = tf.equal(tf.shape(batch[-1])[0], size)
        # Only the last batch is short: full batches pass through without a copy.
        return tf.cond(
            full,
            lambda: tf.nest.map_structure(
                lambda t: tf.ensure_shape(t, [size] + t.shape[1:].as_list()), batch
            ),
            lambda: tf.nest.map_structure(pad, batch),
        )

    return fn


def batch(dataset: Any, plan: Any) -> Any:
    """Per-replica batches, exactly ``plan.steps`` steps' worth (finite input)."""
    size = plan.per_replica_batch
    if plan.steps is None:  # infinite: no last batch to handle
        return dataset.batch(size, drop_remainder=True)
    count = plan.steps * plan.replicas_per_worker
    if not plan.padded:  # "drop", or "pad" where every shard fills its steps exactly
        return dataset.batch(size, drop_remainder=True).take(count)
    _check_padable(dataset.element_spec)
    dataset = dataset.batch(size).map(_pad_batch(size))
    zeros = tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), dataset.element_spec)
    padding = tf.data.Dataset.from_tensors(zeros).repeat()
    dataset = dataset.concatenate(padding).take(count)
    return dataset.enumerate().map(_weigh_padded_steps(plan))


def _weigh_padded_steps(plan):
    """Per-batch map over (index, batch): real rows of the trailing padded steps weigh
    `ShardPlan.padded_step_weights` (global / real), padding stays 0, other steps unchanged."""
    first = plan.first_weighted_step
    tail = tf.constant(plan.padded_step_weights or (1.0,), tf.float64)

    def fn(index, batch):
        step = index // plan.replicas_per_worker
        scale = tf.where(step >= first, tf.gather(tail, tf.maximum(step - first, 0)), 1.0)
        weights = batch[-1]
        return (*batch[:-1], weights * tf.cast(scale, weights.dtype))

    return fn


def weigh_examples(dataset: Any, masked: Any = None, until: Any = None, weight: Any = None) -> Any:
    """Single examples in the job's order, each with a sample weight (the given one, else 1): 0 for
    the first ``masked`` (trained before a resume that changed the global batch), ``weight`` for the
    others before ``until`` (the rest of that step: global / real), 1 after. Refuses elements that
    cannot carry a weight."""
    spec = dataset.element_spec
    if not isinstance(spec, tuple) or len(spec) not in (2, 3):
        raise ValueError(
            "An elastic job under --elastic-batch scale-lr weighs each example (0 for those a "
            "resume with another global batch trained already), so it needs (inputs, targets) or "
            f"(inputs, targets, sample_weight) elements. Received elements of spec {spec}. Add "
            "targets, or use --elastic-batch accumulate."
        )
    zero = tf.constant(0, tf.int64)
    masked, until = (zero if m is None else m for m in (masked, until))
    weight = tf.constant(1.0) if weight is None else weight

    def fn(index, example):
        scale = tf.where(index < masked, 0.0, tf.where(index < until, weight, 1.0))
        given = tf.cast(example[2], tf.float32) if len(example) == 3 else tf.ones([], tf.float32)
        return (*example[:2], given * scale)

    return dataset.enumerate().map(fn)
