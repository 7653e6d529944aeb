"""`DataParallel`'s gradient compression and accumulation on 2 virtual CPU devices, under both
Kerases: what is sent, what is applied, and what is refused."""

import logging

import numpy as np
import pytest
import tensorflow as tf

import tfpar
from tfpar.callbacks import Throughput


def _mlp(k):
    k.utils.set_random_seed(3)
    return k.Sequential(
        [
            k.layers.Input((6,)),
            k.layers.Dense(16, activation="tanh"),
            k.layers.Dense(2, dtype="float32"),
        ]
    )


def _data(n=96):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(n, 6)).astype("float32")
    return x, np.stack([x[:, :3].sum(1), x[:, 3:].prod(1)], axis=1).astype("float32")


def _fit(k, strategy, x, y, batch, epochs=1, optimizer=None, callbacks=()):
    with strategy.scope():
        model = _mlp(k)
        model.compile(optimizer or k.optimizers.SGD(0.1, momentum=0.9), "mse")
    start = model.get_weights()
    model.fit(
        x, y, batch_size=batch, epochs=epochs, shuffle=False, verbose=0, callbacks=list(callbacks)
    )
    return start, model


@pytest.mark.parametrize("steps", [2, 3])
def test_accumulating_n_steps_trains_like_one_step_of_n_times_the_batch(any_keras, steps):
    """N steps of global batch 16 on 2 replicas equal, to 1e-5, one device's steps of N x 16 (SGD
    with momentum: the optimizer's state moves only at the updates), over 2 epochs."""
    x, y = _data(96)
    _, accumulated = _fit(
        any_keras, tfpar.DataParallel(gradient_accumulation_steps=steps), x, y, 16, epochs=2
    )
    _, reference = _fit(
        any_keras, tfpar.DataParallel(devices=["/cpu:0"]), x, y, 16 * steps, epochs=2
    )
    for a, b in zip(accumulated.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    if any_keras is tfpar.keras:  # (Keras 3's train_function is a plain function around one)
        # its buffers bypass tf.function's variable creator: the step is traced once
        assert accumulated.train_function.experimental_get_tracing_count() == 1


def test_accumulation_runs_eagerly_as_in_a_function_and_then_lets_assignments_through(any_keras):
    """``run_eagerly=True`` trains as the traced step does (3 steps of 2 accumulated: one update,
    a window left open), and after it an assignment of the weights is not held for a boundary."""
    x, y = _data(48)
    trained = []
    for eagerly in (False, True):
        strategy = tfpar.DataParallel(gradient_accumulation_steps=2)
        with strategy.scope():
            model = _mlp(any_keras)
            model.compile(any_keras.optimizers.SGD(0.1, momentum=0.9), "mse", run_eagerly=eagerly)
        model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
        assert int(model.optimizer.iterations.numpy()) == 1
        trained.append(model.get_weights())
    for a, b in zip(*trained):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
    model.set_weights([np.full_like(w, 5.0) for w in trained[0]])
    assert all((w == 5.0).all() for w in model.get_weights())


@pytest.mark.parametrize("compression, relative", [("bf16", 2.0**-8), ("fp16", 2.0**-10)])
def test_compressed_update_is_within_the_rounding_of_the_float32_one(
    any_keras, compression, relative
):
    """One SGD step where both replicas see the same 8 examples (so the all-reduce adds two equal
    halves, exactly, and the only error is the cast): every weight's update equals float32's to
    within the wire format's rounding, and differs from it (the gradients were cast)."""
    x, y = _data(8)
    x, y = np.concatenate([x, x]), np.concatenate([y, y])
    sgd = lambda: any_keras.optimizers.SGD(1.0)  # noqa: E731
    start, exact = _fit(any_keras, tfpar.DataParallel(), x, y, 16, optimizer=sgd())
    _, compressed = _fit(
        any_keras, tfpar.DataParallel(compression=compression), x, y, 16, optimizer=sgd()
    )
    largest = 0.0
    for w0, a, b in zip(start, exact.get_weights(), compressed.get_weights()):
        update = np.abs(a - w0)
        np.testing.assert_array_less(np.abs(b - a), relative * update + 1e-7)
        largest = max(largest, float(np.abs(b - a).max()))
    assert largest > 0, "the compressed update equals float32's exactly: nothing was cast"


def test_only_the_gradients_are_compressed():
    """A replica context's own all-reduce (a metric's, synchronized BatchNorm's) keeps float32:
    1 + 2**-12 summed over 2 replicas is exact, though bf16 and fp16 would round it to 2."""
    strategy = tfpar.DataParallel(compression="bf16")
    value = 1.0 + 2.0**-12
    summed = strategy.run(
        tf.function(
            lambda: tf.distribute.get_replica_context().all_reduce("sum", tf.constant(value / 2))
        )
    )
    assert [float(v) for v in strategy.experimental_local_results(summed)] == [value, value]


def test_compression_and_accumulation_under_mixed_precision(any_keras):
    """mixed_float16 with fp16 compression and 2 accumulated steps trains like one device's
    double batches in mixed precision (to fp16's accuracy), and both keep the same loss scale."""
    x, y = _data(96)
    with pytest.warns(tfpar.precision.PrecisionWarning):  # no float16 GPU here: emulated
        tfpar.precision.use("mixed_float16")
    try:
        _, ours = _fit(
            any_keras,
            tfpar.DataParallel(compression="fp16", gradient_accumulation_steps=2),
            x,
            y,
            16,
            optimizer=any_keras.optimizers.SGD(0.05),
        )
        _, reference = _fit(
            any_keras,
            tfpar.DataParallel(devices=["/cpu:0"]),
            x,
            y,
            32,
            optimizer=any_keras.optimizers.SGD(0.05),
        )
    finally:
        tfpar.precision.use("float32")
    for a, b in zip(ours.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, atol=2e-3, rtol=0)
    scales = [
        float(tf.convert_to_tensor(tfpar.precision.loss_scale_of(m.optimizer)))
        for m in (ours, reference)
    ]
    assert scales[0] == scales[1] > 1


def test_throughput_counts_examples_not_updates(any_keras):
    """6 steps of 16 examples make 2 updates: Throughput's epoch is 96 examples in 6 steps."""
    x, y = _data(96)
    _, model = _fit(
        any_keras,
        tfpar.DataParallel(gradient_accumulation_steps=3),
        x,
        y,
        16,
        callbacks=[Throughput(16)],
    )
    logs = model.history.history
    assert logs["examples_per_second"][0] * logs["step_time"][0] * 6 == pytest.approx(96)


def test_a_remainder_of_steps_is_explained(caplog):
    x, y = _data(80)  # 5 steps of 16: 2 updates and one step carried over
    with caplog.at_level(logging.WARNING, logger="tfpar.strategies._gradients"):
        _fit(tfpar.keras, tfpar.DataParallel(gradient_accumulation_steps=2), x, y, 16)
    assert (
        "fit runs 5 steps per epoch, not a multiple of the 2 steps accumulated per update: the "
        "last 1 "
        "step(s) of each epoch are carried into the next epoch's first update"
    ) in caplog.text
    assert "Use steps_per_epoch=4 or 6" in caplog.text


@pytest.mark.parametrize(
    "options, message",
    [
        (
            dict(compression="int8"),
            r"Unknown compression 'int8'. Received: compression='int8'. "
            r"Use one of \['none', 'bf16', 'fp16'\]",
        ),
        (
            dict(gradient_accumulation_steps=0),
            r"gradient_accumulation_steps must be an int >= 1.*Received: "
            r"gradient_accumulation_steps=0",
        ),
        (dict(gradient_accumulation_steps=2.0), r"gradient_accumulation_steps must be an int"),
    ],
)
def test_bad_gradient_options_are_refused(options, message):
    with pytest.raises((TypeError, ValueError), match=message):
        tfpar.DataParallel(**options)


def test_describe_names_the_gradient_options():
    text = tfpar.DataParallel(compression="bf16", gradient_accumulation_steps=4).describe()
    assert "compression=bf16, gradient_accumulation_steps=4" in text


def test_the_demo_with_bf16_gradients_is_as_accurate_as_float32():
    """The digits demo, 8 epochs on 2 replicas: validation accuracy within 0.5 point of
    float32's."""
    from tfpar.demo import run_demo

    accuracy = {
        c: run_demo(epochs=8, verbose=0, print_fn=lambda *_: None, compression=c).val_accuracy
        for c in ("none", "bf16")
    }
    assert accuracy["none"] > 0.97
    assert abs(accuracy["bf16"] - accuracy["none"]) <= 0.005, accuracy


def test_compression_is_refused_where_nothing_is_all_reduced():
    from tfpar._factory import ParallelismSpec

    with pytest.raises(ValueError, match=r"Received: strategy 'pipeline' with compression='bf16'"):
        ParallelismSpec(kind="pipeline", compression="bf16")
