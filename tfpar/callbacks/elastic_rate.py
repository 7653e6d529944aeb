"""The learning rate of an elastic job under ``--elastic-batch scale-lr``: the global batch follows
the workers, and the optimizer's rate follows it by the scaling rule, before ``fit`` and after a
backup restores the rate of a run on another number of workers."""

from typing import Any

from tfpar import _compat
from tfpar._keras import inner_optimizer
from tfpar.callbacks._hooks import chief_print

__all__ = ["elastic_learning_rate", "rescale_learning_rate"]

# the optimizer's: the elastic scaling factor its rate carries
_FACTOR = "_tfpar_learning_rate_factor"


def rescale_learning_rate(model: Any, factor: float, applied: float | None = None) -> None:
    """Puts the optimizer's rate, which carries the scaling factor ``applied`` (an elastic job's, 1
    for none; None: the one this process set), on ``factor`` instead: a backup restores the rate its
    run trained with (a loss-scale optimizer's: the rate of the optimizer it wraps)."""
    optimizer = inner_optimizer(model.optimizer)
    applied = getattr(optimizer, _FACTOR, 1.0) if applied is None else applied
    rate = _compat.given_learning_rate(optimizer)
    if applied != factor:
        if not hasattr(rate, "assign"):
            raise ValueError(
                "--elastic-batch scale-lr scales the optimizer's learning rate with the global "
                f"batch, and it is a schedule here. Received: learning_rate={type(rate).__name__}. "
                "Give the optimizer a number (and tfpar.callbacks.LearningRateSchedule for a "
                "schedule), or use --elastic-batch accumulate."
            )
        rate.assign(rate * (factor / applied))
    setattr(optimizer, _FACTOR, factor)


def elastic_learning_rate(model: Any, arguments: dict) -> None:
    """Before ``fit`` in a worker of an elastic launch under ``--elastic-batch scale-lr``:
    `tfpar.data.distribute` gave each replica the reference's per-replica batch, so the global batch
    follows the workers; the optimizer's rate follows it by the scaling rule
    (`tfpar._tasks.elastic_batch.ElasticBatch.learning_rate_factor`)."""
    from tfpar._tasks.elastic_batch import ElasticBatch
    from tfpar.data.resume import position_of

    setting = ElasticBatch.from_env()
    position = position_of(arguments.get("x"))
    if setting is None or not setting.scales_learning_rate:
        return
    if position is None:
        raise ValueError(
            f"--elastic-batch {setting.batch} scales the global batch of fit's input with the "
            "workers, and the learning rate with it; tfpar does that for a tfpar.data.distribute "
            f"input only. Received: x of type {type(arguments.get('x')).__name__}. Feed fit "
            "tfpar.data.distribute(...).dataset, or use --elastic-batch accumulate."
        )
    layout = position.layout
    factor = layout["learning_rate_factor"]
    rescale_learning_rate(model, factor)
    if factor != 1.0:
        chief_print(
            model,
            f"tfpar: an elastic job on {layout['num_workers']} of {setting.reference_workers} "
            f"workers: global batch {layout['global_batch_size']}, each replica keeping the full "
            f"job's batch; the learning rate is multiplied by {factor:.4g} ({setting.batch}: the "
            f"{setting.learning_rate_rule} scaling rule)",
        )
