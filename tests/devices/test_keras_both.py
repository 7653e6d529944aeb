"""The shared scenarios, written once, under tf_keras and under Keras 3 (`any_keras`), on 2 virtual
CPU devices; and KerasTuner (Keras 3) searching under tfpar's strategies with tfpar's callbacks."""

import collections
import re
import warnings

import numpy as np
import pytest
import tensorflow as tf

import tfpar
from tfpar.callbacks import (
    FaultTolerance,
    LearningRateSchedule,
    LearningRateWarmup,
    MetricAverage,
    NaNGuard,
    Throughput,
)


def _mlp(k, seed=4):
    k.utils.set_random_seed(seed)
    return k.Sequential(
        [k.layers.Input((6,)), k.layers.Dense(12, activation="tanh"), k.layers.Dense(3)]
    )


def _data(n=90):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(n, 6)).astype("float32")
    return x, (x[:, 0] > 0).astype("int64") + (x[:, 1] > 0).astype("int64")


def _train(k, strategy, epochs=2, callbacks=()):
    with strategy.scope():
        model = _mlp(k)
        model.compile(
            k.optimizers.SGD(0.1),
            k.losses.SparseCategoricalCrossentropy(from_logits=True),
            weighted_metrics=["accuracy"],
        )
    x, y = _data()
    # 90 examples in global batches of 16: the last step is padded (weight 0), every example once.
    train = tfpar.data.distribute(tf.data.Dataset.from_tensor_slices((x, y)), strategy, 16)
    history = model.fit(
        train.dataset,
        steps_per_epoch=train.steps_per_epoch,
        epochs=epochs,
        verbose=0,
        callbacks=list(callbacks),
    )
    return model, train, history


def test_data_parallel_trains_like_one_device(any_keras):
    k = any_keras
    two, train, history = _train(k, tfpar.DataParallel())
    one_device = tfpar.DataParallel(devices=["/cpu:0"])
    one, one_train, reference = _train(k, one_device)
    for a, b in zip(two.get_weights(), one.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5)
    np.testing.assert_allclose(history.history["loss"], reference.history["loss"], rtol=1e-5)
    x, y = _data()
    np.testing.assert_allclose(two.predict(x, verbose=0), one.predict(x, verbose=0), atol=1e-5)
    scores = [
        m.evaluate(t.dataset, steps=t.steps_per_epoch, verbose=0, return_dict=True)
        for m, t in ((two, train), (one, one_train))
    ]
    assert scores[0] == pytest.approx(scores[1], rel=1e-5)
    assert train.steps_per_epoch == 6
    assert f"model:      {two.name}, 123 parameters" in tfpar.DataParallel().describe(
        global_batch_size=16, model=two
    )


def test_every_callback_runs_under_each_keras(any_keras, tmp_path):
    warmup = LearningRateWarmup(warmup_epochs=1, initial_lr=0.05, scale=2)
    schedule = LearningRateSchedule(0.5, initial_lr=0.1, start_epoch=1)  # 0.1 x 2 replicas x 0.5
    throughput = Throughput(16)
    callbacks = [
        warmup,
        schedule,
        throughput,
        NaNGuard(),
        MetricAverage(),
        FaultTolerance(str(tmp_path / "b")),
    ]
    _, _, history = _train(any_keras, tfpar.DataParallel(), epochs=3, callbacks=callbacks)
    lr = history.history["lr"]
    # warm-up, then the schedule
    assert 0.05 < lr[0] < 0.1 and lr[1:] == pytest.approx([0.1, 0.1], rel=1e-6)
    assert all(v > 0 for v in history.history["examples_per_second"])
    assert all(np.isfinite(history.history["loss"]))
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").iterdir())  # deleted when done


def test_fault_tolerance_resumes_under_each_keras(any_keras, tmp_path):
    k = any_keras

    class Crash(k.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                raise RuntimeError("the process dies here")

    backup = FaultTolerance(str(tmp_path / "backup"))
    with pytest.raises(RuntimeError, match="the process dies here"):
        _train(k, tfpar.DataParallel(), epochs=4, callbacks=[backup, Crash()])
    assert any((tmp_path / "backup").iterdir())  # the backup of epoch 2 is there
    again = FaultTolerance(str(tmp_path / "backup"))
    _, _, history = _train(k, tfpar.DataParallel(), epochs=4, callbacks=[again])
    assert again.resumed_at_epoch == 2 and len(history.history["loss"]) == 2  # epochs 3 and 4


def _recorded_fit(k, backup, trained, crash_at=None, global_batch=8):
    """fit, 3 epochs, on 80 numbered examples (global batch 8: 10 steps an epoch), shuffled with a
    seed, under FaultTolerance(save_freq=5); its replicas put every id they train on in
    ``trained[(epoch, step)]``; a RuntimeError at ``crash_at`` (epoch, step). Returns the
    FaultTolerance."""
    where = {}

    class Record(k.layers.Layer):
        def call(self, x, training=None):
            if training:
                tf.py_function(
                    lambda ids: trained[where["at"]].extend(int(i) for i in ids.numpy()),
                    [x[:, 0]],
                    [],
                )
            return x[:, 1:]

    class Where(k.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            where["epoch"] = epoch

        def on_train_batch_begin(self, batch, logs=None):
            where["at"] = (where["epoch"], batch)
            if where["at"] == crash_at:
                raise RuntimeError("the process dies here")

    x = np.concatenate([np.arange(1, 81, dtype="float32")[:, None], _data(80)[0]], 1)
    strategy = tfpar.DataParallel()
    with strategy.scope():
        model = k.Sequential([k.layers.Input((7,)), Record(), k.layers.Dense(1)])
        model.compile(k.optimizers.SGD(0.01), "mse")
    train = tfpar.data.distribute(
        tf.data.Dataset.from_tensor_slices((x, x[:, 1])),
        strategy,
        global_batch,
        shuffle_buffer=80,
        seed=3,
    )
    backup = FaultTolerance(str(backup), save_freq=5)
    model.fit(
        train.dataset,
        steps_per_epoch=train.steps_per_epoch,
        epochs=3,
        verbose=0,
        callbacks=[backup, Where()],
    )
    return backup


def test_a_mid_epoch_resume_trains_every_example_once_under_each_keras(any_keras, tmp_path):
    k = any_keras
    first, resumed = collections.defaultdict(list), collections.defaultdict(list)
    with pytest.raises(RuntimeError, match="the process dies here"):
        # step 8 of epoch 2: the backup is after step 5
        _recorded_fit(k, tmp_path / "b", first, crash_at=(1, 7))
    backup = _recorded_fit(k, tmp_path / "b", resumed)
    assert (backup.resumed_at_epoch, backup.resumed_at_step) == (1, 5)
    per_epoch = collections.defaultdict(collections.Counter)
    for (epoch, step), ids in first.items():
        if (epoch, step) < (1, 5):  # what the backup kept; steps 6 and 7 were rolled back
            per_epoch[epoch].update(ids)
    for (epoch, _), ids in resumed.items():
        per_epoch[epoch].update(ids)
    assert {e: sorted(c.items()) for e, c in per_epoch.items()} == {
        e: [(i, 1) for i in range(1, 81)] for e in range(3)
    }
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").iterdir())


def test_a_mid_epoch_resume_with_another_global_batch_is_refused_before_any_step(
    any_keras, tmp_path
):
    """The backup's steps are global batches of 8: a run with batches of 16 would continue at
    another example, so FaultTolerance refuses it at once, naming the backed-up batch and the
    fix."""
    with pytest.raises(RuntimeError, match="the process dies here"):
        _recorded_fit(any_keras, tmp_path / "b", collections.defaultdict(list), crash_at=(1, 7))
    trained = collections.defaultdict(list)
    with pytest.raises(
        ValueError,
        match=r"continues epoch 2 at step 6, counted in global batches of 8 examples. "
        r"Received: global_batch_size=16. Keep the global batch",
    ):
        _recorded_fit(any_keras, tmp_path / "b", trained, global_batch=16)
    assert not trained  # no step ran


@pytest.mark.parametrize(
    "source, save_freq, message",
    [
        (
            "plain",
            3,
            r"FaultTolerance\(save_freq=3\) backs up in the middle of epochs, and fit's input is "
            r"not a "
            r"tfpar.data.distribute input \(Received: x of type \w+\)\. .* some examples of that "
            r"epoch train twice",
        ),
        (
            "unseeded",
            3,
            r"fit's input is a tfpar.data.distribute input shuffled without a seed, whose order a "
            r"new process "
            r"cannot build again.*tfpar.data.distribute\(..., seed=N\)",
        ),
        ("seeded", 3, None),
        ("plain", "epoch", None),
    ],
)
def test_a_step_backup_of_an_input_that_cannot_resume_exactly_warns_before_the_first_step(
    any_keras, tmp_path, source, save_freq, message
):
    k, strategy = any_keras, tfpar.DataParallel()
    x, y = _data(32)
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    if source == "plain":
        data, steps = strategy.experimental_distribute_dataset(dataset.batch(16).repeat()), 2
    else:
        train = tfpar.data.distribute(
            dataset, strategy, 16, shuffle_buffer=32, seed=None if source == "unseeded" else 1
        )
        data, steps = train.dataset, train.steps_per_epoch
    with strategy.scope():
        model = _mlp(k)
        model.compile(
            k.optimizers.SGD(0.1), k.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
    before_first_step = []

    class FirstStep(k.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            before_first_step.append(
                len([w for w in caught if "FaultTolerance(save_freq" in str(w.message)])
            )

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(
            data,
            steps_per_epoch=steps,
            epochs=1,
            verbose=0,
            callbacks=[FaultTolerance(str(tmp_path / "b"), save_freq=save_freq), FirstStep()],
        )
    ours = [str(w.message) for w in caught if "FaultTolerance(save_freq" in str(w.message)]
    if message is None:
        assert ours == []
    else:
        assert len(ours) == 1 and re.search(message, ours[0]), ours
        assert before_first_step[0] == 1  # at once: before any step trained


def _tuner_model(hp):
    import keras

    model = _mlp(keras)
    model.compile(
        keras.optimizers.Adam(hp.Choice("lr", [1e-2, 3e-2])),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=["accuracy"],
    )
    return model


@pytest.mark.parametrize("kind", ["RandomSearch", "Hyperband"])
def test_keras_tuner_searches_under_data_parallel_with_tfpar_callbacks(kind, tmp_path):
    import keras_tuner as kt  # a test dependency ([dev]): a missing one fails, not skips

    strategy = tfpar.DataParallel()
    options = dict(max_trials=2) if kind == "RandomSearch" else dict(max_epochs=2, factor=2)
    tuner = getattr(kt, kind)(
        _tuner_model,
        objective="val_accuracy",
        distribution_strategy=strategy,
        directory=str(tmp_path),
        project_name=kind,
        seed=1,
        **options,
    )
    x, y = _data()
    train = tfpar.data.distribute(tf.data.Dataset.from_tensor_slices((x, y)), strategy, 16)
    val = tfpar.data.distribute(tf.data.Dataset.from_tensor_slices((x, y)), strategy, 16)

    # KerasTuner copies the callbacks for each trial: this one reports each copy's run to the class.
    class Seen(Throughput):
        runs = []

        def on_train_end(self, logs=None):
            self.runs.append(
                (type(self.model.distribute_strategy).__name__, self.model.history.history)
            )

    # fit's own arguments pass through the search: steps for the endless tfpar.data input.
    tuner.search(
        train.dataset,
        steps_per_epoch=train.steps_per_epoch,
        epochs=2,
        validation_data=val.dataset,
        validation_steps=val.steps_per_epoch,
        verbose=0,
        callbacks=[Seen(16), LearningRateWarmup(warmup_epochs=1, scale=2)],
    )
    trials = tuner.oracle.trials.values()
    assert len(trials) >= 2 and all(t.status == "COMPLETED" for t in trials)
    assert all(0 <= t.score <= 1 for t in trials)
    assert len(Seen.runs) >= 2  # every trial ran under the tfpar strategy, with tfpar's callbacks
    for name, logs in Seen.runs:
        assert name == "MirroredDataParallel" and all(v > 0 for v in logs["examples_per_second"])
        # The warm-up scaled the trial's rate (1e-2 or 3e-2) by the 2 replicas in one epoch.
        assert (
            min(abs(logs["lr"][-1] - 2 * rate) for rate in (1e-2, 3e-2)) < 1e-7
            or len(logs["lr"]) == 1
        )
    best = tuner.get_best_models(1)[0]
    assert best.predict(x, verbose=0).shape == (90, 3)


def test_compile_outside_the_strategys_scope_is_refused_at_compile(any_keras):
    """Built under the strategy, compiled outside it: tf_keras would fail at fit ("Mixing different
    tf.distribute.Strategy objects") and Keras 3 would train with plain, unmirrored optimizer
    variables. Both are refused at compile, by tfpar, with the fix."""
    k = any_keras
    strategy = tfpar.DataParallel()
    with strategy.scope():
        model = _mlp(k)
    with pytest.raises(
        ValueError,
        match=r"Compile the model under the scope of the strategy it was built under. "
        r"Received: .*built under MirroredDataParallel, compiled under _Default",
    ):
        model.compile(k.optimizers.SGD(0.1), "mse")
    with strategy.scope():
        model.compile(
            k.optimizers.SGD(0.1, momentum=0.9),
            k.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    x, y = _data(32)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 2
