"""Gradient accumulation as ``fit`` sees it: how many of its steps make one optimizer update, and
what becomes of an epoch's steps that do not fill a window.

Under accumulation (a strategy's ``gradient_accumulation_steps`` or ``backward_passes_per_step``,
Keras 3's own ``gradient_accumulation_steps`` on the optimizer) the optimizer's ``iterations``
counts updates, not ``fit``'s steps: ``iterations * steps_per_update(model)`` is the steps trained.
"""

import logging
import math

from tfpar import _compat
from tfpar._keras import inner_optimizer, tf

__all__ = [
    "accumulator_of",
    "calls_per_step",
    "count_updates",
    "steps_per_update",
    "steps_trained",
    "warn_about_remainder",
]

_log = logging.getLogger(__name__)


def accumulator_of(strategy):
    """``strategy``'s `GradientAccumulator`, or None."""
    return getattr(getattr(strategy, "extended", None), "_accumulator", None)


def calls_per_step(strategy) -> int:
    """The calls of the model's ``train_step`` in one step of ``fit`` under ``strategy``: an
    elastic job's micro-batches, else 1."""
    return getattr(getattr(strategy, "extended", None), "_microbatches", 1)


def steps_per_update(model) -> int:
    """``fit``'s steps per update of ``model``'s optimizer: its strategy's accumulation window, or
    the window of Keras 3's optimizer's own ``gradient_accumulation_steps``; 1 without either."""
    strategy = model.distribute_strategy
    accumulator = accumulator_of(strategy)
    if accumulator is not None:
        return accumulator.steps // calls_per_step(strategy)
    optimizer = inner_optimizer(getattr(model, "optimizer", None))
    return int(getattr(optimizer, "gradient_accumulation_steps", None) or 1)


def steps_trained(model) -> int:
    """The training steps (``fit``'s batches) ``model``'s optimizer has taken: its ``iterations``,
    which count updates, times the steps per update, and the steps of the window under way."""
    optimizer = model.optimizer
    window = steps_per_update(model)
    updates = int(tf.convert_to_tensor(optimizer.iterations))
    return updates * window + _steps_into_window(model, window)


def _steps_into_window(model, window):
    """The steps taken since the last update: from the counter of the calls that accumulate
    (ZeRO's own, the strategy's accumulator's, or Keras 3's optimizer's every-step count)."""
    if window == 1:
        return 0
    accumulator = accumulator_of(model.distribute_strategy)
    if accumulator is None:  # Keras 3's own accumulation
        steps = _compat.optimizer_steps(inner_optimizer(model.optimizer))
        return int(tf.convert_to_tensor(steps)) % window
    calls = calls_per_step(model.distribute_strategy)
    sharded = getattr(model, "_tfpar_zero", None)
    counter = getattr(sharded, "counter", None)  # ZeRO accumulating in its own buffers
    if counter is None:
        counter = accumulator.counter()
    counted = int(tf.convert_to_tensor(counter))
    return (counted % (window * calls)) // calls


def count_updates(model, arguments=None):
    """After ``compile`` under gradient accumulation: the optimizer's ``iterations`` counts updates
    (`GradientAccumulator.count_updates`).

    Raises:
        ValueError: the optimizer accumulates too (Keras 3's ``gradient_accumulation_steps``).
    """
    accumulator = accumulator_of(model.distribute_strategy)
    optimizer = getattr(model, "optimizer", None)
    if accumulator is None or optimizer is None:
        return
    own = getattr(inner_optimizer(optimizer), "gradient_accumulation_steps", None)
    if own:
        raise ValueError(_accumulated_twice(model, own, accumulator.steps))
    accumulator.count_updates(optimizer)


def _accumulated_twice(model, own, calls):
    """The refusal of an optimizer that accumulates ``own`` steps under a strategy whose
    accumulator applies every ``calls`` calls (an elastic job's micro-batches included)."""
    microbatches = calls_per_step(model.distribute_strategy)
    received = (
        f"Received: optimizer gradient_accumulation_steps={own!r} under a strategy that "
        f"applies every {calls} calls"
    )
    if microbatches == calls:  # only the elastic job's micro-batches
        return (
            "This elastic job runs on fewer workers than its reference, so each replica computes "
            f"its batch in {microbatches} micro-batches accumulated by the strategy, and the "
            f"optimizer accumulates too: each would wait for the other's window. {received}. "
            "Launch with --elastic-batch grow, or accumulate with the strategy's "
            "gradient_accumulation_steps instead of the optimizer's."
        )
    return (
        "The strategy accumulates gradients and so does the optimizer: each would wait for the "
        f"other's window. {received}. Accumulate in one place: the strategy's "
        "gradient_accumulation_steps (backward_passes_per_step for HorovodStrategy), or the "
        "optimizer's alone."
    )


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
    if accumulator_of(model.distribute_strategy) is None:
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
        "keep every update within an epoch.",
        steps,
        window,
        remainder,
        multiples,
    )
