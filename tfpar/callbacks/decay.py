"""Multipliers for `tfpar.callbacks.LearningRateSchedule`: the rate's decay over the epochs (cosine,
exponential, by steps)."""

import math
from collections.abc import Callable

from tfpar._checks import check_number

__all__ = ["cosine_decay", "exponential_decay", "step_decay"]


def _positive(name, value):
    check_number(name, value, above=0)


def _in_unit_interval(name, value):
    check_number(name, value, above=0, maximum=1)


def cosine_decay(
    start_epoch: int, end_epoch: int, final_fraction: float = 0.0
) -> Callable[[int], float]:
    """Multiplier for `LearningRateSchedule`: cosine annealing from 1 at ``start_epoch`` to
    ``final_fraction`` at ``end_epoch`` (Loshchilov & Hutter), then flat.

    Raises:
        ValueError: ``end_epoch <= start_epoch`` or a fraction outside [0, 1].
    """
    if not end_epoch > start_epoch or start_epoch < 0:
        raise ValueError(
            "cosine_decay needs 0 <= start_epoch < end_epoch. Received: "
            f"start_epoch={start_epoch!r}, end_epoch={end_epoch!r}."
        )
    if not 0 <= final_fraction <= 1:
        raise ValueError(
            f"final_fraction must be in [0, 1]. Received: final_fraction={final_fraction!r}."
        )

    def multiplier(epoch):
        progress = min(max((epoch - start_epoch) / (end_epoch - start_epoch), 0.0), 1.0)
        return final_fraction + (1 - final_fraction) * 0.5 * (1 + math.cos(math.pi * progress))

    return multiplier


def exponential_decay(
    decay_epochs: float, rate: float, start_epoch: int = 0
) -> Callable[[int], float]:
    """Multiplier: ``rate ** ((epoch - start_epoch) / decay_epochs)``.

    Raises:
        ValueError: ``decay_epochs <= 0`` or a rate outside (0, 1].
    """
    _positive("decay_epochs", decay_epochs)
    _in_unit_interval("rate", rate)
    return lambda epoch: rate ** (max(epoch - start_epoch, 0) / decay_epochs)


def step_decay(every_epochs: int, factor: float, start_epoch: int = 0) -> Callable[[int], float]:
    """Multiplier: ``factor ** floor((epoch - start_epoch) / every_epochs)`` (e.g. x0.1 every 30
    epochs).

    Raises:
        ValueError: ``every_epochs <= 0`` or a factor outside (0, 1].
    """
    _positive("every_epochs", every_epochs)
    _in_unit_interval("factor", factor)
    return lambda epoch: factor ** math.floor(max(epoch - start_epoch, 0) / every_epochs)
