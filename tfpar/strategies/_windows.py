"""Gradient accumulation as ``fit`` sees it: how many of its steps make one optimizer update, and
what becomes of an epoch's steps that do not fill a window.

Under accumulation (a strategy's ``gradient_accumulation_steps`` or ``backward_passes_per_step``,
Keras 3's own ``gradient_accumulation_steps`` on the optimizer) the optimizer's ``iterations``
counts updates, not ``fit``'s steps: ``iterations * steps_per_update(model)`` is the steps trained.
"""

import logging
import math

from tfpar._keras import tf

__all__ = ["steps_per_update", "warn_about_remainder"]

_log = logging.getLogger(__name__)


def _accumulator(model):
    """``model``'s strategy's `GradientAccumulator`, or None."""
    return getattr(getattr(model.distribute_strategy, "extended", None), "_accumulator", None)


def steps_per_update(model) -> int:
    """``fit``'s steps per update of ``model``'s optimizer: its strategy's accumulation window, or
    the window of Keras 3's optimizer's own ``gradient_accumulation_steps``; 1 without either."""
    accumulator = _accumulator(model)
    if accumulator is not None:
        microbatches = getattr(model.distribute_strategy.extended, "_microbatches", 1)
        # an elastic job's micro-batches are one step's calls
        return accumulator.steps // microbatches
    optimizer = getattr(model, "optimizer", None)
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)
    return int(getattr(optimizer, "gradient_accumulation_steps", None) or 1)


def _steps_per_epoch(arguments):
    """The steps ``fit`` takes per epoch, where its arguments say (else None)."""
    if arguments.get("steps_per_epoch"):
        return int(arguments["steps_per_epoch"])
    x = arguments.get("x")
    if isinstance(x, tf.data.Dataset):
        cardinality = int(x.cardinality())
        return cardinality if cardinality > 0 else None
    if hasattr(x, "shape") and len(getattr(x, "shape", ())) > 0 and x.shape[0] is not None:
        return math.ceil(int(x.shape[0]) / (arguments.get("batch_size") or 32))
    return None


def warn_about_remainder(model, arguments):
    """Before ``fit``: says what becomes of the steps of an epoch that do not fill an accumulation
    window (the window does not restart at an epoch: they are carried into the next epoch's)."""
    if _accumulator(model) is None:
        return
    steps = _steps_per_epoch(arguments)
    window = steps_per_update(model)
    if steps is None or steps % window == 0:
        return
    remainder = steps % window
    candidates = (steps - remainder, steps - remainder + window)
    multiples = " or ".join(str(m) for m in candidates if m > 0)
    _log.warning(
        "fit runs %d steps per epoch, not a multiple of the %d steps accumulated per update: the "
        "last %d step(s) of each epoch are carried into the next epoch's first update, which mixes "
        "two epochs, and after the last epoch they are left unapplied. Use steps_per_epoch=%s to "
        "keep every update within an epoch.", steps, window, remainder, multiples)
