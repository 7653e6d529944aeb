"""Learning-rate callbacks for distributed runs: warm-up by the linear scaling rule, schedules.

Both count ``fit``'s steps from the optimizer's ``iterations`` (a mirrored variable, the same on
every worker; under gradient accumulation it counts updates, each of
`tfpar.strategies._windows.steps_per_update` steps) and epochs from Keras, so every worker sets
the same rate at the same step, under every tfpar strategy (their Horovod counterparts are
``LearningRateWarmupCallback`` and ``LearningRateScheduleCallback``).
"""

import math
from collections.abc import Callable

from tfpar import _compat
from tfpar._checks import check_choice, check_int, check_number
from tfpar._keras import keras
from tfpar._tasks.elastic_batch import SCALING_RULES, rule_factor
from tfpar.callbacks._hooks import EpochLevelUnderCoordinator, chief_print

# defined in decay.py and elastic_rate.py; importable from here too, as before they moved
from tfpar.callbacks.decay import cosine_decay, exponential_decay, step_decay
from tfpar.callbacks.elastic_rate import elastic_learning_rate, rescale_learning_rate
from tfpar.strategies._windows import steps_trained

__all__ = [
    "SCALING_RULES",
    "LearningRateSchedule",
    "LearningRateWarmup",
    "cosine_decay",
    "elastic_learning_rate",
    "exponential_decay",
    "rescale_learning_rate",
    "scaled_learning_rate",
    "step_decay",
]


def scaled_learning_rate(
    base_learning_rate: float, global_batch: float, base_batch: float = 1, rule: str = "linear"
) -> float:
    """The learning rate for ``global_batch`` of a rate tuned at ``base_batch``, by a scaling rule.

    The one helper behind `LearningRateWarmup` and `LearningRateSchedule` (their ``scale`` is
    ``global_batch / base_batch``) and ``tfpar tune``'s ``scaling_rule`` axis.

    Args:
        base_learning_rate: the rate that trains well at ``base_batch``.
        global_batch: the batch to scale to (examples per step over all replicas), > 0.
        base_batch: the batch the rate was tuned at, > 0.
        rule: one of `SCALING_RULES`.

    Raises:
        ValueError: an unknown rule, or a rate or batch <= 0.

    Examples:
        >>> scaled_learning_rate(0.1, 4096, base_batch=256)
        1.6
        >>> scaled_learning_rate(1e-3, 4096, base_batch=256, rule="sqrt")
        0.004
    """
    check_choice("rule", rule, SCALING_RULES, "scaling rule")
    for name, value in (
        ("base_learning_rate", base_learning_rate),
        ("global_batch", global_batch),
        ("base_batch", base_batch),
    ):
        check_number(name, value, above=0)
    return base_learning_rate * rule_factor(global_batch / base_batch, rule)


def _set_rate(model, value, momentum_correction):
    """Sets the optimizer's learning rate; with momentum correction (Goyal et al., 2017) the
    velocity, which carries the old rate (v = m v - lr g), is rescaled to the new one."""
    optimizer = model.optimizer
    old = float(keras.backend.get_value(optimizer.learning_rate))
    keras.backend.set_value(optimizer.learning_rate, value)
    if momentum_correction and old > 0 and value != old:
        for velocity in getattr(optimizer, "momentums", None) or []:
            velocity.assign(velocity * (value / old))


def _check_settable(optimizer, who):
    lr = _compat.given_learning_rate(optimizer)
    if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
        raise ValueError(
            f"{who} sets the optimizer's learning rate, which is a schedule here. Received: "
            f"learning_rate={type(lr).__name__}. Give the optimizer a number and let {who} "
            "(or tfpar.callbacks.LearningRateSchedule) change it."
        )


def _scaled(rate, scale, rule, model):
    """``rate`` scaled by ``rule`` for a global batch ``scale`` times the base one ("replicas": as
    many times as the model has replicas)."""
    k = model.distribute_strategy.num_replicas_in_sync if scale == "replicas" else scale
    return scaled_learning_rate(rate, k, rule=rule)


def _check_scale(scale, rule, who):
    if scale != "replicas":
        check_number(
            "scale", scale, above=0, hint=f" {who} takes scale='replicas' or a number > 0."
        )
    check_choice("rule", rule, SCALING_RULES, "scaling rule")


class LearningRateWarmup(EpochLevelUnderCoordinator, keras.callbacks.Callback):
    """Gradual warm-up to the scaled learning rate (Goyal et al., 2017).

    The rate climbs linearly from ``initial_lr`` (default: the optimizer's rate
    when training starts) to ``initial_lr`` scaled by ``rule`` for a global batch
    ``scale`` times the base one (`scaled_learning_rate`), over the warm-up, then
    stays there. ``scale`` defaults to the number of replicas (a per-replica batch
    tuned on one device); for a rate tuned at batch B, give ``scale=global_batch / B``.

    Args:
        warmup_epochs: length of the warm-up in epochs (may be fractional).
        warmup_steps: or in global steps; give exactly one of the two.
        scale: "replicas" or a number > 0: the global batch over the batch ``initial_lr`` was tuned
            at.
        rule: "linear" (the rate times ``scale``) or "sqrt" (times its square root);
            `SCALING_RULES`.
        initial_lr: the rate before scaling (default: the optimizer's).
        momentum_correction: rescale the momentum velocity when the rate changes.
        verbose: 1 prints the rate when the warm-up ends.

    Under ParameterServer (no batch hooks in Keras) the rate changes at epoch starts.

    Raises:
        ValueError: both or neither length, a length <= 0, a warm-up longer than
            training (at the start of ``fit``), or a learning-rate schedule in
            the optimizer.

    Examples:
        >>> model.fit(data, epochs=10,  # doctest: +SKIP
        ...           callbacks=[LearningRateWarmup(warmup_epochs=2)])
    """

    def __init__(
        self,
        *,
        warmup_epochs: float | None = None,
        warmup_steps: int | None = None,
        scale: str | float = "replicas",
        rule: str = "linear",
        initial_lr: float | None = None,
        momentum_correction: bool = False,
        verbose: int = 0,
    ) -> None:
        super().__init__()
        if (warmup_epochs is None) == (warmup_steps is None):
            raise ValueError(
                "Give exactly one of warmup_epochs and warmup_steps. Received: "
                f"warmup_epochs={warmup_epochs!r}, warmup_steps={warmup_steps!r}."
            )
        length = warmup_epochs if warmup_steps is None else warmup_steps
        check_number("warmup_epochs" if warmup_steps is None else "warmup_steps", length, above=0)
        _check_scale(scale, rule, "LearningRateWarmup")
        self.warmup_epochs, self.warmup_steps = warmup_epochs, warmup_steps
        self.scale, self.rule, self.initial_lr, self.verbose = scale, rule, initial_lr, verbose
        self.momentum_correction = momentum_correction

    def on_train_begin(self, logs=None):
        optimizer = self.model.optimizer
        _check_settable(optimizer, "LearningRateWarmup")
        self._base = float(
            self.initial_lr
            if self.initial_lr is not None
            else keras.backend.get_value(optimizer.learning_rate)
        )
        self._target = _scaled(self._base, self.scale, self.rule, self.model)
        steps_per_epoch = self.params.get("steps")
        if self.warmup_steps is not None:
            self._length = self.warmup_steps
        elif steps_per_epoch:
            self._length = max(1, round(self.warmup_epochs * steps_per_epoch))
        else:
            raise ValueError(
                "warmup_epochs needs fit to know its steps per epoch; pass steps_per_epoch "
                "to fit, or give warmup_steps."
            )
        epochs = self.params.get("epochs")
        if steps_per_epoch and epochs and self._length > steps_per_epoch * epochs:
            raise ValueError(
                f"The warm-up ({self._length} steps) is longer than training ({epochs} epochs x "
                f"{steps_per_epoch} steps = {epochs * steps_per_epoch} steps). Received: "
                f"warmup_epochs={self.warmup_epochs!r}, warmup_steps={self.warmup_steps!r}. "
                "Shorten the warm-up or train longer."
            )
        self._done = False

    def on_epoch_begin(self, epoch, logs=None):
        self.on_train_batch_begin(0)  # the only update under ParameterServer

    def on_train_batch_begin(self, batch, logs=None):
        if self._done:
            return
        step = steps_trained(self.model)
        fraction = min(step, self._length) / self._length
        _set_rate(
            self.model,
            self._base + (self._target - self._base) * fraction,
            self.momentum_correction,
        )
        if step >= self._length:
            self._done = True
            if self.verbose:
                chief_print(
                    self.model,
                    f"LearningRateWarmup: warm-up done at step {step}, "
                    f"learning rate {self._target:.6g}",
                )

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = float(keras.backend.get_value(self.model.optimizer.learning_rate))


class LearningRateSchedule(EpochLevelUnderCoordinator, keras.callbacks.Callback):
    """Sets ``lr = initial_lr * scale * multiplier(epoch)`` for epochs in [start_epoch, end_epoch).

    Follows a `LearningRateWarmup` (start it where the warm-up ends). With
    ``staircase=True`` the multiplier changes at epoch starts; otherwise it
    gets the fractional epoch at every step.

    Args:
        multiplier: a function of the epoch (int or float), or a constant.
        initial_lr: the rate before scaling (required, as in Horovod).
        scale: "replicas" or a number > 0: the global batch over the batch ``initial_lr`` was tuned
            at.
        rule: "linear" or "sqrt", as `LearningRateWarmup`'s.
        start_epoch: first epoch it acts on.
        end_epoch: first epoch it no longer acts on (None: to the end).
        staircase: per epoch (True) or per step (False; per epoch under ParameterServer).
        momentum_correction: rescale the momentum velocity when the rate changes.

    Multipliers for common schedules: `cosine_decay`, `exponential_decay`, `step_decay`.

    Examples:
        >>> callbacks = [LearningRateWarmup(warmup_epochs=5),  # doctest: +SKIP
        ...              LearningRateSchedule(cosine_decay(5, 90), initial_lr=0.1, start_epoch=5)]
    """

    def __init__(
        self,
        multiplier: float | Callable[[int], float],
        *,
        initial_lr: float,
        scale: str | float = "replicas",
        rule: str = "linear",
        start_epoch: int = 0,
        end_epoch: int | None = None,
        staircase: bool = True,
        momentum_correction: bool = False,
    ) -> None:
        super().__init__()
        check_number("initial_lr", initial_lr, above=0)
        if not callable(multiplier):
            value = check_number(
                "multiplier",
                multiplier,
                minimum=0,
                hint=" Give a function of the epoch "
                "(e.g. tfpar.callbacks.cosine_decay(...)) or a constant.",
            )
            multiplier = lambda epoch: value  # noqa: E731
        check_int("start_epoch", start_epoch, 0)
        check_number("end_epoch", end_epoch, integer=True, allow_none=True)
        if start_epoch < 0 or (end_epoch is not None and end_epoch <= start_epoch):
            raise ValueError(
                "The schedule needs 0 <= start_epoch < end_epoch. Received: "
                f"start_epoch={start_epoch!r}, end_epoch={end_epoch!r}."
            )
        _check_scale(scale, rule, "LearningRateSchedule")
        self.multiplier = multiplier
        self.initial_lr = initial_lr
        self.scale = scale
        self.rule = rule
        self.start_epoch, self.end_epoch, self.staircase = start_epoch, end_epoch, staircase
        self.momentum_correction = momentum_correction

    def on_train_begin(self, logs=None):
        _check_settable(self.model.optimizer, "LearningRateSchedule")
        self._rate = _scaled(self.initial_lr, self.scale, self.rule, self.model)

    def _active(self, epoch):
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def _set(self, epoch):
        value = self._rate * self.multiplier(epoch)
        if not math.isfinite(value) or value < 0:
            raise ValueError(
                f"The schedule's multiplier gave learning rate {value!r} at epoch {epoch}."
            )
        _set_rate(self.model, value, self.momentum_correction)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        if self._active(epoch):  # per step (staircase=False) also starts the epoch right
            self._set(epoch)

    def on_train_batch_begin(self, batch, logs=None):
        steps = self.params.get("steps")
        if not self.staircase and steps and self._active(self._epoch):
            self._set(self._epoch + batch / steps)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = float(keras.backend.get_value(self.model.optimizer.learning_rate))
