"""An elastic job on fewer workers than its global batch was divided for: `DataParallel` computes
each replica's batch in micro-batches (`tfpar.strategies._microbatches`), on 2 virtual CPU devices,
under both Kerases. What an elastic launch tells a worker is its environment (`TFPAR_ELASTIC`), set
here as it sets it."""

import numpy as np
import pytest
import tensorflow as tf

import tfpar
from tfpar._tasks.elastic_batch import ElasticBatch
from tfpar._tasks.env import ELASTIC_VARIABLE
from tfpar.data.resume import check_elastic_batch


def _told(monkeypatch, reference, batch="accumulate", min_workers=1):
    monkeypatch.setenv(ELASTIC_VARIABLE, ElasticBatch(reference, min_workers, batch).to_env())


def _model(k, seen):
    class Seen(k.layers.Layer):
        """Records the rows of each batch a training step traces it with: what one replica's forward
        pass holds."""

        def call(self, inputs, training=None):
            if training:
                seen.append(inputs.shape[0])
            return inputs

    k.utils.set_random_seed(3)
    return k.Sequential(
        [
            k.layers.Input((6,)),
            Seen(),
            k.layers.Dense(16, activation="tanh"),
            k.layers.Dense(2, dtype="float32"),
        ]
    )


def _examples(n):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(n, 6)).astype("float32")
    y = np.stack([x[:, :3].sum(1), x[:, 3:].prod(1)], axis=1).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y))


def _fit(k, n=100, global_batch=24, epochs=2, source=None, **options):
    """Trains through tfpar.data.distribute (shuffled with a seed, unless ``source`` is given; the
    last step padded) with a learning rate that decays every optimizer iteration; returns (weights,
    iterations, rows each traced forward pass held, steps per epoch, loss scale or None)."""
    strategy, seen = tfpar.DataParallel(**options), []
    with strategy.scope():
        model = _model(k, seen)
        rate = k.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.9)
        model.compile(k.optimizers.SGD(rate, momentum=0.9), "mse")
    train = (
        tfpar.data.distribute(_examples(n), strategy, global_batch, seed=5)
        if source is None
        else tfpar.data.distribute(source, strategy, global_batch)
    )
    model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=epochs, verbose=0)
    scale = tfpar.precision.loss_scale_of(model.optimizer)
    return (
        model.get_weights(),
        int(model.optimizer.iterations.numpy()),
        set(seen) - {None},
        train.steps_per_epoch,
        None if scale is None else float(tf.convert_to_tensor(scale)),
    )


def test_micro_batches_train_like_the_whole_replica_batch(any_keras, monkeypatch):
    """1 worker of 3: each replica's 12 examples in 3 micro-batches of 4, the full job's per-replica
    batch. Over 2 epochs of 100 examples (the last step padded), the weights equal the unsplit run's
    to 1e-5 and the optimizer counts one iteration a step, so the decaying learning rate follows
    it."""
    weights, iterations, seen, steps, _ = _fit(any_keras)
    assert seen == {12}
    _told(monkeypatch, reference=3)
    split_weights, split_iterations, split_seen, split_steps, _ = _fit(any_keras)
    assert split_seen == {4}
    assert (split_steps, split_iterations) == (steps, iterations) == (5, 10)
    for a, b in zip(split_weights, weights):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "options",
    [{"zero_stage": 1}, {"zero_stage": 2, "gradient_accumulation_steps": 2}],
    ids=["zero-1", "zero-2-accumulate-2"],
)
def test_micro_batches_with_sharded_optimizer_state(options, monkeypatch):
    """ZeRO accumulates in its own buffers: its window counts the micro-batches too (and the user's
    steps)."""
    weights, iterations, _, _, _ = _fit(tfpar.keras, n=96, **options)
    _told(monkeypatch, reference=3)
    split_weights, split_iterations, split_seen, _, _ = _fit(tfpar.keras, n=96, **options)
    updates = 8 // options.get("gradient_accumulation_steps", 1)  # iterations count updates
    assert split_seen == {4} and split_iterations == iterations == updates
    for a, b in zip(split_weights, weights):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def test_micro_batches_under_mixed_precision(any_keras, monkeypatch):
    """mixed_float16 (a dynamic loss scale), 2 epochs of 96 examples: the micro-batched run equals
    the unsplit one to fp16's accuracy, with the same iterations and loss scale. With an example
    beyond float16's range in the first micro-batch of each epoch's second step, both runs skip that
    step and halve the scale (once an epoch, never for a finite step), and the later steps still
    apply at their ends (Keras 3 does not reduce a skipped call's gradients: the accumulator's
    window is dropped, not shifted)."""
    examples = _examples(96)
    examples = examples.enumerate().map(lambda i, xy: (tf.where(i == 25, 1e5, xy[0]), xy[1]))
    with pytest.warns(tfpar.precision.PrecisionWarning):  # no float16 GPU here: emulated
        tfpar.precision.use("mixed_float16")
    try:
        runs = [_fit(any_keras, source=examples)]
        _told(monkeypatch, reference=2)
        runs.append(_fit(any_keras, source=examples))
    finally:
        tfpar.precision.use("float32")
    (
        (weights, iterations, _, _, scale),
        (split_weights, split_iterations, split_seen, _, split_scale),
    ) = runs
    assert split_seen == {6} and split_iterations == iterations
    assert split_scale == scale == 2.0**13  # halved once an epoch
    for a, b in zip(split_weights, weights):
        assert np.isfinite(a).all()
        np.testing.assert_allclose(a, b, atol=2e-3, rtol=0)


def test_grow_keeps_the_replica_batch_whole(monkeypatch):
    _told(monkeypatch, reference=3, batch="grow")
    _, _, seen, _, _ = _fit(tfpar.keras, epochs=1)
    assert seen == {12}
    assert "micro-batches" not in tfpar.DataParallel().describe()


def test_describe_and_the_chief_say_how_many(monkeypatch, capsys):
    _told(monkeypatch, reference=2)
    text = tfpar.DataParallel().describe()
    assert "elastic micro-batches per step=2" in text
    assert (
        "an elastic job on 1 of 2 workers: each replica computes its batch in 2 micro-batches"
        in capsys.readouterr().out
    )


def test_a_timeline_leaves_the_micro_batches_in_place(monkeypatch, tmp_path):
    """Timeline times the step by wrapping the model's train_step while fit runs, and puts back what
    was there."""
    _told(monkeypatch, reference=2)
    strategy, seen = tfpar.DataParallel(), []
    with strategy.scope():
        model = _model(tfpar.keras, seen)
        model.compile("sgd", "mse")
    train = tfpar.data.distribute(_examples(48), strategy, 8)
    for _ in range(2):
        model.fit(
            train.dataset,
            steps_per_epoch=train.steps_per_epoch,
            verbose=0,
            callbacks=[tfpar.callbacks.Timeline(str(tmp_path / "timeline.json"))],
        )
    assert set(seen) - {None} == {2}
    assert model.__dict__["_tfpar_microbatches"] == 2


def test_a_replica_batch_that_does_not_split_is_refused(monkeypatch):
    _told(monkeypatch, reference=3)
    strategy = tfpar.DataParallel()
    with strategy.scope():
        model = _model(tfpar.keras, [])
        model.compile("sgd", "mse")
    x = np.zeros((20, 6), "float32")
    with pytest.raises(
        ValueError,
        match=r"splits each replica's batch into 3 equal micro-batches.*holds 5 examples",
    ):
        model.fit(x, np.zeros((20, 2), "float32"), batch_size=10, verbose=0)


@pytest.mark.parametrize(
    "batch, global_batch, refused",
    [
        # 2 workers: 2 x 2 replicas x 2 micro-batches = 8 parts; 3: 6 parts
        ("accumulate", 24, None),
        ("accumulate", 12, "2 \\(8 parts\\)"),
        ("grow", 12, None),
        ("grow", 8, "3 \\(6 parts\\)"),
    ],
)
def test_a_global_batch_every_size_of_the_job_takes(monkeypatch, batch, global_batch, refused):
    """Before the first step, the global batch of a tfpar.data input is checked against every size
    the job may resize to (here 2 and 3 workers of 2 replicas each), not only the size it starts
    with."""
    _told(monkeypatch, reference=3, batch=batch, min_workers=2)
    strategy = tfpar.DataParallel()
    with strategy.scope():
        model = _model(tfpar.keras, [])
    train = tfpar.data.distribute(_examples(48), strategy, global_batch)
    if refused is None:
        check_elastic_batch(model, {"x": train.dataset})
        return
    with pytest.raises(
        ValueError,
        match=f"trains on 2 to 3 workers.* on {refused} worker.*"
        f"Received: global_batch_size={global_batch}. Use a multiple of",
    ):
        check_elastic_batch(model, {"x": train.dataset})
