"""LearningRateWarmup / LearningRateSchedule under DataParallel on 2 virtual devices."""

import numpy as np
import pytest
import tensorflow as tf

import tfpar
from tfpar import keras
from tfpar.callbacks import LearningRateSchedule, LearningRateWarmup


class _Recorder(keras.callbacks.Callback):
    """The learning rate each step actually ran with (read after the callbacks set it)."""

    def on_train_begin(self, logs=None):
        self.rates = []

    def on_train_batch_begin(self, batch, logs=None):
        self.rates.append(float(keras.backend.get_value(self.model.optimizer.learning_rate)))


def _fit(callbacks, epochs=3, lr=0.1, n=32, global_batch=8, accumulation=1):
    strategy = tfpar.DataParallel(gradient_accumulation_steps=accumulation)
    with strategy.scope():
        model = keras.Sequential([keras.layers.Input((2,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(lr), "mse")
    x = np.ones((n, 2), "float32")
    train = tfpar.data.distribute(
        tf.data.Dataset.from_tensor_slices((x, x[:, 0])), strategy, global_batch
    )
    recorder = _Recorder()
    history = model.fit(
        train.dataset,
        steps_per_epoch=train.steps_per_epoch,
        epochs=epochs,
        verbose=0,
        callbacks=[*callbacks, recorder],
    )
    return recorder.rates, history


def test_warmup_climbs_linearly_to_the_rate_times_replicas():
    rates, history = _fit([LearningRateWarmup(warmup_steps=4)])
    expected = [0.1 * (1 + min(t, 4) / 4) for t in range(12)]  # 2 replicas: 0.1 -> 0.2
    np.testing.assert_allclose(rates, expected, rtol=1e-6)
    # the rate of each epoch's last step
    assert history.history["lr"] == pytest.approx([0.175, 0.2, 0.2])


def test_warmup_counts_fits_steps_when_the_optimizer_counts_accumulated_updates():
    """Under accumulation of 2 the optimizer's iterations count updates: the warm-up still counts
    fit's steps (4 steps are 2 updates), as without accumulation."""
    rates, history = _fit([LearningRateWarmup(warmup_steps=4)], accumulation=2)
    expected = [0.1 * (1 + min(t, 4) / 4) for t in range(12)]
    np.testing.assert_allclose(rates, expected, rtol=1e-6)
    assert history.history["lr"] == pytest.approx([0.175, 0.2, 0.2])


def test_warmup_in_epochs_with_an_explicit_scale():
    rates, _ = _fit([LearningRateWarmup(warmup_epochs=0.5, scale=4, initial_lr=0.05)])
    np.testing.assert_allclose(rates[:3], [0.05, 0.125, 0.2], rtol=1e-6)  # 0.5 epoch = 2 steps
    assert rates[-1] == pytest.approx(0.2)


def test_the_square_root_rule_from_a_base_batch():
    """A rate tuned at batch 8 warmed up for 16 x 8: sqrt(16) = 4 times it (LAMB's scaling), where
    the linear rule gives 16 times; the schedule scales the same way."""
    rates, _ = _fit(
        [LearningRateWarmup(warmup_epochs=0.5, scale=128 / 8, rule="sqrt", initial_lr=0.05)]
    )
    np.testing.assert_allclose(rates[:3], [0.05, 0.125, 0.2], rtol=1e-6)
    assert tfpar.callbacks.scaled_learning_rate(0.05, 128, base_batch=8) == pytest.approx(0.8)
    rates, _ = _fit([LearningRateSchedule(1.0, initial_lr=0.05, scale=16, rule="sqrt")], epochs=1)
    np.testing.assert_allclose(rates, [0.2] * 4, rtol=1e-6)


def test_schedule_follows_the_warmup():
    rates, history = _fit(
        [
            LearningRateWarmup(warmup_epochs=1),
            LearningRateSchedule(lambda epoch: 0.1 ** (epoch - 1), initial_lr=0.1, start_epoch=1),
        ]
    )
    assert history.history["lr"] == pytest.approx([0.175, 0.2, 0.02])  # each epoch's last step
    np.testing.assert_allclose(rates[4:], [0.2] * 4 + [0.02] * 4, rtol=1e-6)


def test_smooth_schedule_changes_every_step():
    rates, _ = _fit(
        [LearningRateSchedule(lambda e: 1.0 / (1.0 + e), initial_lr=0.1, scale=1, staircase=False)],
        epochs=1,
    )
    np.testing.assert_allclose(rates, [0.1 / (1 + b / 4) for b in range(4)], rtol=1e-6)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(), r"exactly one of warmup_epochs and warmup_steps"),
        (dict(warmup_epochs=1, warmup_steps=2), r"exactly one of"),
        (dict(warmup_steps=0), r"warmup_steps must be a number > 0. Received: warmup_steps=0"),
        (dict(warmup_epochs=-1), r"warmup_epochs must be a number > 0"),
        (
            dict(warmup_steps=2, scale=0),
            r"scale must be a number > 0. Received: scale=0. LearningRateWarmup takes "
            r"scale='replicas' or a number > 0",
        ),
        (
            dict(warmup_steps=2, rule="square"),
            r"Unknown scaling rule 'square'. Received: rule='square'. Use one of "
            r"\['linear', 'sqrt'\]",
        ),
    ],
)
def test_bad_warmup(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LearningRateWarmup(**kwargs)


def test_warmup_longer_than_training_fails_at_the_start():
    with pytest.raises(
        ValueError, match=r"warm-up \(40 steps\) is longer than training \(3 epochs x 4 steps"
    ):
        _fit([LearningRateWarmup(warmup_epochs=10)])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(multiplier=1.0, initial_lr=0), r"initial_lr must be a number > 0"),
        (
            dict(multiplier=1.0, initial_lr=0.1, start_epoch=3, end_epoch=2),
            r"0 <= start_epoch < end_epoch",
        ),
    ],
)
def test_bad_schedule(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LearningRateSchedule(**kwargs)


def test_optimizer_with_its_own_schedule_is_refused():
    strategy = tfpar.DataParallel()
    with strategy.scope():
        model = keras.Sequential([keras.layers.Input((2,)), keras.layers.Dense(1)])
        schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
        model.compile(keras.optimizers.SGD(schedule), "mse")
    x = np.ones((8, 2), "float32")
    with pytest.raises(ValueError, match=r"Received: learning_rate=ExponentialDecay"):
        model.fit(
            x,
            x[:, 0],
            batch_size=4,
            epochs=1,
            verbose=0,
            callbacks=[LearningRateWarmup(warmup_steps=1)],
        )


def test_named_schedules_and_their_bad_arguments():
    from tfpar.callbacks import cosine_decay, exponential_decay, step_decay

    cosine = cosine_decay(5, 15, final_fraction=0.1)
    assert (
        cosine(0) == cosine(5) == 1.0
        and cosine(10) == pytest.approx(0.55)
        and cosine(15) == cosine(99) == 0.1
    )
    assert exponential_decay(2, 0.5)(4) == pytest.approx(0.25)
    assert [step_decay(30, 0.1)(e) for e in (0, 29, 30, 60)] == pytest.approx([1, 1, 0.1, 0.01])
    for make, match in [
        (
            lambda: cosine_decay(5, 5),
            r"0 <= start_epoch < end_epoch. Received: start_epoch=5, end_epoch=5",
        ),
        (
            lambda: exponential_decay(0, 0.5),
            r"decay_epochs must be a number > 0. Received: decay_epochs=0",
        ),
        (
            lambda: step_decay(-3, 0.1),
            r"every_epochs must be a number > 0. Received: every_epochs=-3",
        ),
        (lambda: step_decay(3, 1.5), r"factor must be a number in \(0, 1\]. Received: factor=1.5"),
    ]:
        with pytest.raises(ValueError, match=match):
            make()


def test_momentum_correction_rescales_the_velocity_with_the_rate():
    import numpy as np

    from tfpar.callbacks import LearningRateSchedule, step_decay

    keras = tfpar.keras
    model = keras.Sequential([keras.layers.Input((2,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.1, momentum=0.9), "mse")
    x = np.ones((8, 2), "float32")
    model.fit(x, x[:, :1] * 3, epochs=1, verbose=0)  # builds a non-zero velocity
    velocity = [v.numpy().copy() for v in model.optimizer.momentums]
    schedule = LearningRateSchedule(
        step_decay(1, 0.5), initial_lr=0.1, scale=1, momentum_correction=True
    )
    schedule.set_model(model)
    schedule.on_train_begin()
    schedule.on_epoch_begin(0)  # rate 0.1 -> 0.1: velocity as it was
    schedule.on_epoch_begin(1)  # rate 0.1 -> 0.05: velocity halved with it
    assert float(model.optimizer.learning_rate.numpy()) == pytest.approx(0.05)
    for before, after in zip(velocity, model.optimizer.momentums):
        np.testing.assert_allclose(after.numpy(), 0.5 * before, rtol=1e-6)
