"""Throughput, NaNGuard, MetricAverage and global-norm clipping on 2 virtual CPU devices."""

import numpy as np
import pytest

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
    history = _model(tfpar.DataParallel()).fit(x, y, batch_size=64, epochs=2, verbose=0,
                                               callbacks=[callback, MetricAverage()])
    logs = history.history
    assert all(e > 0 for e in logs["examples_per_second"])
    assert logs["examples_per_second_per_worker"] == logs["examples_per_second"]  # one worker here
    assert logs["scaling_efficiency"] == pytest.approx([e / (1000.0 * 2) for e in logs["examples_per_second"]])
    assert logs["step_time"] == pytest.approx([64 / e for e in logs["examples_per_second"]])
    assert list(tmp_path.rglob("events.out.tfevents*"))


def test_nan_guard_stops_and_restores_the_last_finite_weights():
    x, y = _data()
    model = _model(tfpar.DataParallel(), learning_rate=1e6)
    guard = NaNGuard()
    history = model.fit(x, y, batch_size=64, epochs=5, verbose=0, callbacks=[guard])
    assert guard.stopped_at_step is not None and len(history.history["loss"]) == 1
    assert all(np.isfinite(w).all() for w in model.get_weights())


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


@pytest.mark.parametrize("make, match", [
    (lambda: Throughput(0), r"global_batch_size must be an int >= 1. Received: 0"),
    (lambda: Throughput(64, reference_examples_per_second=-1), r"reference_examples_per_second must be > 0"),
    (lambda: NaNGuard(check="step"), r"check must be 'batch' or 'epoch'. Received: check='step'"),
])
def test_bad_callback_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()
