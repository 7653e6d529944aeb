"""Throughput, NaNGuard, MetricAverage and global-norm clipping on 2 virtual CPU devices."""

import numpy as np
import pytest
import tensorflow as tf

import tfpar
from tfpar.callbacks import MetricAverage, NaNGuard, Throughput

keras = tfpar.keras


def _data(n=256):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4)).astype("float32")
    return x, x @ np.array([1.0, -2.0, 0.5, 3.0], "float32")


def _model(strategy, learning_rate=0.01, **optimizer):
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.layers.Input((4,)), keras.layers.Dense(1, use_bias=False)])
        model.compile(keras.optimizers.SGD(learning_rate, **optimizer), "mse")
    return model


def test_throughput_logs_totals_per_worker_and_scaling_efficiency(tmp_path):
    x, y = _data()
    callback = Throughput(64, reference_examples_per_second=1000.0, log_dir=str(tmp_path))
    history = _model(tfpar.DataParallel()).fit(
        x, y, batch_size=64, epochs=2, verbose=0, callbacks=[callback, MetricAverage()]
    )
    logs = history.history
    assert all(e > 0 for e in logs["examples_per_second"])
    assert logs["examples_per_second_per_worker"] == logs["examples_per_second"]  # one worker here
    assert logs["step_time"] == pytest.approx([64 / e for e in logs["examples_per_second"]])
    assert logs["scaling_efficiency"] == pytest.approx(
        [e / (1000.0 * 2) for e in logs["examples_per_second"]]
    )
    assert list(tmp_path.rglob("events.out.tfevents*"))


def test_throughput_stops_the_epoch_clock_where_validation_begins(monkeypatch):
    """fit's validation (on_test_begin inside an epoch) is not training: an epoch of 4 steps that
    trained for 2 s and validated for 8 logs 2 s; an epoch without validation logs its whole 10
    s."""
    import tfpar.callbacks.monitoring as monitoring

    ticks = iter([0.0, 2.0, 10.0, 20.0, 30.0])
    monkeypatch.setattr(monitoring.time, "perf_counter", lambda: next(ticks))
    throughput = Throughput(64)
    throughput.set_model(_model(tfpar.DataParallel()))
    throughput.set_params({"steps": 4})
    validated, plain = {}, {}
    throughput.on_epoch_begin(0)
    throughput.on_test_begin()
    throughput.on_epoch_end(0, validated)
    throughput.on_epoch_begin(1)
    throughput.on_epoch_end(1, plain)
    assert (validated["step_time"], validated["examples_per_second"]) == (0.5, 128.0)
    assert (plain["step_time"], plain["examples_per_second"]) == (2.5, 25.6)


def test_throughput_agrees_with_an_independent_timer():
    """Steps made slow on purpose (30 ms each, 10 an epoch); the test's own clock, started before
    Throughput's epoch hook and stopped after it, times every epoch: Throughput's figure must
    describe the same interval, within 25 %."""
    import time

    class Clock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seconds, self.started = [], None

        def on_epoch_begin(self, epoch, logs=None):
            self.started = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds.append(time.perf_counter() - self.started)

    class Slow(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            time.sleep(0.03)

    x, y = _data(640)
    clock = Clock()
    history = _model(tfpar.DataParallel()).fit(
        x, y, batch_size=64, epochs=3, verbose=0, callbacks=[clock, Throughput(64), Slow()]
    )
    reported = [10 * 64 / e for e in history.history["examples_per_second"]]  # 10 steps an epoch
    for theirs, ours in zip(reported, clock.seconds):
        assert 0.75 * ours <= theirs <= 1.25 * ours, (reported, clock.seconds)
        assert ours >= 10 * 0.03  # at least the sleeps


@pytest.mark.parametrize("check", ["batch", "epoch"])
def test_nan_guard_restores_weights_whose_loss_was_finite(check, any_keras):
    """w <- w - 36 * 2w = -71w on loss w^2 (x=1, y=0, one full batch per epoch): the loss of step
    k is 5041^(k-1), until float32 overflows (at step 12: the square of (-71)^11). The
    weights to restore are those the last finite step started from: evaluate gives back exactly the
    loss logged there. The weights after that step are finite too, but their loss is not."""
    strategy = tfpar.DataParallel()
    with strategy.scope():
        k = any_keras
        model = k.Sequential(
            [k.layers.Input((1,)), k.layers.Dense(1, use_bias=False, kernel_initializer="ones")]
        )
        model.compile(k.optimizers.SGD(36.0), "mse")
    x, y = np.ones((8, 1), "float32"), np.zeros((8, 1), "float32")
    guard = NaNGuard(check=check)
    history = model.fit(x, y, batch_size=8, epochs=20, shuffle=False, verbose=0, callbacks=[guard])
    losses = history.history["loss"]
    stop = guard.stopped_at_step
    assert stop == len(losses) and not np.isfinite(losses[-1]) and np.isfinite(losses[:-1]).all()
    assert stop == 12 and guard.restored_step == stop - 1
    last_finite = losses[guard.restored_step - 1]
    assert (
        last_finite == pytest.approx(5041.0 ** (guard.restored_step - 1), rel=1e-5)
        and last_finite > 1e36
    )
    restored = model.evaluate(x, y, batch_size=8, verbose=0)
    assert np.isfinite(restored) and restored == pytest.approx(last_finite, rel=1e-6)
    assert model.get_weights()[0][0, 0] == pytest.approx(
        (-71.0) ** (guard.restored_step - 1), rel=1e-5
    )


@pytest.mark.parametrize("check", ["batch", "epoch"])
def test_nan_guard_counts_fits_steps_under_gradient_accumulation(check):
    """With 2 steps accumulated per update the optimizer's iterations count updates: the guard still
    names fit's steps, the one in an open window too. The weights move every 2nd step, so the loss
    of step 2j+1 is 81^j, and the 21st distinct loss, at step 41, overflows (as at step 21 without
    accumulation)."""
    strategy = tfpar.DataParallel(gradient_accumulation_steps=2)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.layers.Input((1,)),
                keras.layers.Dense(1, use_bias=False, kernel_initializer="ones"),
            ]
        )
        model.compile(keras.optimizers.SGD(5.0), "mse")
    x = np.ones((8, 1), "float32")
    y = np.zeros((8, 1), "float32")
    guard = NaNGuard(check=check)
    history = model.fit(x, y, batch_size=8, epochs=60, shuffle=False, verbose=0, callbacks=[guard])
    assert guard.stopped_at_step == len(history.history["loss"]) == 41
    assert guard.restored_step == 40 and int(model.optimizer.iterations.numpy()) == 20


def test_nan_guard_counts_steps_with_several_steps_per_execution():
    """Keras calls batch hooks once per execution (here 2 steps): the guard's host-side step count
    must still be the optimizer's, and the restored weights' loss finite."""
    strategy = tfpar.DataParallel()
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.layers.Input((1,)),
                keras.layers.Dense(1, use_bias=False, kernel_initializer="ones"),
            ]
        )
        model.compile(keras.optimizers.SGD(5.0), "mse", steps_per_execution=2)
    x, y = np.ones((16, 1), "float32"), np.zeros((16, 1), "float32")
    guard = NaNGuard()
    model.fit(x, y, batch_size=8, epochs=30, shuffle=False, verbose=0, callbacks=[guard])
    assert (
        guard.stopped_at_step == int(model.optimizer.iterations.numpy())
        and guard.stopped_at_step % 2 == 0
    )
    # the first step of the execution before
    assert guard.restored_step == guard.stopped_at_step - 3
    assert np.isfinite(model.evaluate(x, y, batch_size=8, verbose=0))


def test_nan_guard_keeps_its_buffers_on_the_devices_and_runs_fit_after_fit():
    strategy = tfpar.DataParallel()
    with strategy.scope():
        model = keras.Sequential(
            [keras.layers.Input((1,)), keras.layers.Dense(1, kernel_initializer="ones")]
        )
        model.compile(keras.optimizers.SGD(0.1), "mse")
    guard = NaNGuard()
    x, y = np.ones((8, 1), "float32"), np.zeros((8, 1), "float32")
    model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[guard])
    buffers = guard._buffers
    assert all(isinstance(v, tf.distribute.DistributedValues) for buffer in buffers for v in buffer)
    assert {d.split("/")[-1] for v in buffers[0] for d in (c.device for c in v.values)} == {
        "device:CPU:0",
        "device:CPU:1",
    }
    model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[guard])
    assert guard._buffers is buffers and guard.stopped_at_step is None  # no new variables per fit


def test_global_norm_clipping_happens_after_the_replicas_gradients_are_averaged():
    """SGD(global_clipnorm=c) clips the all-reduced gradient by its global L2 norm over all
    variables; clipping each replica's gradient first and averaging gives another update."""
    import tensorflow as tf

    rng = np.random.default_rng(1)
    x = rng.normal(size=(8, 4)).astype("float32")
    x[4:] *= 10.0  # replica 1's half of the batch has far larger gradients
    y = np.zeros(8, "float32")
    model = _model(tfpar.DataParallel(), learning_rate=1.0, global_clipnorm=1.0)
    start = model.get_weights()[0]
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    update = start - model.get_weights()[0]

    def gradient(part):
        w = tf.constant(start)
        with tf.GradientTape() as tape:
            tape.watch(w)
            loss = tf.reduce_mean(tf.square(tf.matmul(part, w)[:, 0]))
        return tape.gradient(loss, w).numpy()

    halves = [gradient(x[:4]), gradient(x[4:])]
    after = np.mean(halves, axis=0)
    after = after / max(1.0, np.linalg.norm(after))
    before = np.mean([g / max(1.0, np.linalg.norm(g)) for g in halves], axis=0)
    np.testing.assert_allclose(update, after, rtol=1e-4)
    assert np.abs(update - before).max() > 0.1


@pytest.mark.parametrize(
    "make, error, match",
    [
        (
            lambda: Throughput(0),
            ValueError,
            r"global_batch_size must be an int >= 1. Received: global_batch_size=0",
        ),
        (
            lambda: Throughput(64.0),
            TypeError,
            r"global_batch_size must be an int. Received: global_batch_size=64.0",
        ),
        (
            lambda: MetricAverage(keys="loss"),
            TypeError,
            r"keys must be a list of names. Received: keys='loss'. Write \['loss'\]",
        ),
        (
            lambda: Throughput(64, reference_examples_per_second=-1),
            ValueError,
            r"reference_examples_per_second must be a number > 0. Received: "
            r"reference_examples_per_second=-1",
        ),
        (
            lambda: NaNGuard(check="step"),
            ValueError,
            r"Unknown check 'step'. Received: check='step'. Use one of \['batch', 'epoch'\]",
        ),
    ],
)
def test_bad_callback_arguments(make, error, match):
    with pytest.raises(error, match=match):
        make()
