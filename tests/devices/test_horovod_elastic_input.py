"""tfpar.integrations.horovod.ElasticInput in this process: the steps of a rolled-back, resized
epoch (read for any number of ranks through tfpar.data's own code), the position its callback keeps
in both Kerases' fit on one Horovod rank, and its refusals. Under horovodrun's elastic mode, with a
rank killed and a host added: tests/multiproc/test_horovod_keras.py."""

import collections
import types

import numpy as np
import pytest
import tensorflow as tf

from tfpar.integrations.horovod import ElasticInput

N, GLOBAL_BATCH = 100, 12  # 9 steps: the last holds 4 examples and 8 padding rows


def _examples():
    """Examples whose first feature is their id, 1 to N (padding rows are zeros: id 0)."""
    ids = np.arange(1, N + 1, dtype="float32")
    return tf.data.Dataset.from_tensor_slices((np.stack([ids, ids / N], 1), ids))


def _ids(dataset, batches):
    return [[int(i) for i in x[:, 0].numpy() if i > 0] for x, *_ in dataset.take(batches)]


def test_a_rolled_back_epoch_goes_on_with_another_number_of_ranks_at_its_example():
    """3 ranks train epoch 0 up to step 6; the job rolls back to its commit at step 4 and goes on
    with 2 ranks from there, into epoch 1: each epoch's examples exactly once (the steps 4 and 5 the
    3 ranks trained are the rolled-back ones), and each step the examples it held with 3 ranks."""
    state = types.SimpleNamespace(epoch=0, batch=0)
    train = ElasticInput(_examples(), state, GLOBAL_BATCH, shuffle_buffer=N, seed=7)
    assert train.steps_per_epoch == 9
    before = [_ids(train._stream(3, rank, 0, 0)[0], 6) for rank in range(3)]
    after = [_ids(train._stream(2, rank, 0, 4)[0], 5 + 9) for rank in range(2)]
    epoch0 = [i for rank in before for step in rank[:4] for i in step] + [
        i for rank in after for step in rank[:5] for i in step
    ]
    epoch1 = [i for rank in after for step in rank[5:] for i in step]
    assert collections.Counter(epoch0) == collections.Counter(range(1, N + 1))
    assert collections.Counter(epoch1) == collections.Counter(range(1, N + 1))
    assert epoch0 != epoch1  # each epoch its own order
    for step in (4, 5):  # the rolled-back steps hold the same examples on 2 ranks
        assert sorted(before[0][step] + before[1][step] + before[2][step]) == sorted(
            after[0][step - 4] + after[1][step - 4]
        )


@pytest.mark.usefixtures("horovod_installed")
@pytest.mark.parametrize("any_keras", ["tf_keras", "keras3"], indirect=True)
def test_the_callback_keeps_the_position_in_global_steps_and_ends_the_resumed_epoch(any_keras):
    """State rolled back to step 5 of epoch 1: fit (Horovod's spelling, epochs=3 - state.epoch)
    trains steps 5-8 of epoch 1 and all 9 of epoch 2, the examples those steps hold, and the state
    counts the steps trained (what a commit records) after each one."""
    import horovod.tensorflow as hvd

    hvd.init()
    k = any_keras
    state = types.SimpleNamespace(epoch=1, batch=5)
    train = ElasticInput(_examples(), state, GLOBAL_BATCH, shuffle_buffer=N, seed=7)
    trained, positions = [], []

    class Record(k.layers.Layer):
        def call(self, x, training=None):
            if training:
                done = tf.py_function(
                    lambda ids: trained.append([int(i) for i in ids.numpy() if i > 0]) or 0,
                    [x[:, 0]],
                    tf.int32,
                )
                with tf.control_dependencies([done]):
                    return tf.identity(x[:, 1:])
            return x[:, 1:]

    class Positions(k.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            positions.append((state.epoch, state.batch))

    model = k.Sequential([k.layers.Input((2,)), Record(), k.layers.Dense(1)])
    model.compile(k.optimizers.SGD(0.01), "mse")
    history = model.fit(
        train.dataset(),
        steps_per_epoch=train.steps_per_epoch,
        epochs=3 - state.epoch,
        verbose=0,
        callbacks=[train.callback(), Positions()],
    )
    assert len(history.history["loss"]) == 2
    assert positions == [(1, 6), (1, 7), (1, 8), (2, 0)] + [(2, s) for s in range(1, 9)] + [(3, 0)]
    assert (state.epoch, state.batch) == (3, 0)
    expected = _ids(train._stream(1, 0, 1, 5)[0], 4 + 9)
    assert trained == expected
    assert collections.Counter(i for step in trained[4:] for i in step) == collections.Counter(
        range(1, N + 1)
    )


@pytest.mark.usefixtures("horovod_installed")
def test_horovods_state_callbacks_a_late_commit_and_other_steps_are_refused_at_once():
    import horovod.tensorflow as hvd
    import horovod.tensorflow.keras as hvd_keras

    from tfpar import keras

    hvd.init()
    state = types.SimpleNamespace(epoch=0, batch=0)
    train = ElasticInput(_examples(), state, GLOBAL_BATCH)
    model = keras.Sequential([keras.layers.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    data = train.dataset()

    class Commit(keras.callbacks.Callback):  # the name Horovod's commit callback has
        pass

    Commit.__name__ = "CommitStateCallback"
    cases = [
        (
            [train.callback(), hvd_keras.elastic.UpdateBatchStateCallback(state)],
            9,
            r"Received: UpdateBatchStateCallback beside ElasticInput.callback\(\).*"
            r"remove Horovod's",
        ),
        (
            [Commit(), train.callback()],
            9,
            r"CommitStateCallback before ElasticInput.callback\(\).*put the input's callback first",
        ),
        (
            [train.callback()],
            4,
            r"Received: steps_per_epoch=4.*9 of them: pass steps_per_epoch=train.steps_per_epoch",
        ),
    ]
    for callbacks, steps, match in cases:
        with pytest.raises(ValueError, match=match):
            model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=callbacks)
    assert (state.epoch, state.batch) == (0, 0)  # nothing trained


@pytest.mark.parametrize(
    "state, options, error, match",
    [
        (
            object(),
            {},
            TypeError,
            r"state must be Horovod's elastic state.*Pass hvd.elastic.KerasState\(model, batch=0, "
            r"epoch=0\)",
        ),
        (
            types.SimpleNamespace(epoch=0, batch=0),
            {"shuffle_buffer": 10},
            ValueError,
            r"Received: shuffle_buffer=10 and seed=None.*Pass seed=N",
        ),
        (
            types.SimpleNamespace(epoch=0, batch=0),
            {"shard_policy": "file"},
            ValueError,
            r"Received: shard_policy='file'.*leave shard_policy out",
        ),
    ],
)
def test_bad_input_is_refused_naming_the_fix(state, options, error, match):
    with pytest.raises(error, match=match):
        ElasticInput(_examples(), state, GLOBAL_BATCH, **options)


def test_an_endless_source_and_a_step_past_the_epoch_are_refused():
    state = types.SimpleNamespace(epoch=0, batch=0)
    with pytest.raises(ValueError, match=r"source must be finite.*Received: an infinite dataset"):
        ElasticInput(_examples().repeat(), state, GLOBAL_BATCH).steps_per_epoch
    with pytest.raises(
        ValueError, match=r"step must be below the 9 steps of an epoch. Received: step=9"
    ):
        ElasticInput(_examples(), state, GLOBAL_BATCH)._stream(1, 0, 0, 9)
