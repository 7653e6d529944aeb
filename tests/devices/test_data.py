"""tfpar.data: sharding coverage (FILE and DATA, uneven counts) and fit at epoch ends."""

import numpy as np
import pytest
import tensorflow as tf

import tfpar
from tests.models import write_id_files
from tfpar import keras
from tfpar.data import check_coverage


def _ids(n):
    ids = np.arange(n, dtype="float32")
    return tf.data.Dataset.from_tensor_slices((ids[:, None], ids))


@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize("replicas", [1, 2])
@pytest.mark.parametrize("n", [23, 37])
def test_data_sharding_pad_sees_every_example_exactly_once(workers, replicas, n):
    report = check_coverage(
        _ids(n),
        num_workers=workers,
        replicas_per_worker=replicas,
        global_batch_size=4 * workers * replicas,
    )
    assert report.exactly_once, str(report)
    assert sum(report.expected.values()) == n
    global_batch = 4 * workers * replicas
    assert report.padded == -(-n // global_batch) * global_batch - n


@pytest.mark.parametrize("workers", [2, 3])
def test_data_sharding_drop_loses_less_than_a_global_batch(workers):
    n, global_batch = 37, 4 * workers
    report = check_coverage(
        _ids(n), num_workers=workers, global_batch_size=global_batch, remainder="drop"
    )
    assert not report.duplicated and report.padded == 0
    assert len(set(report.steps_per_worker)) == 1
    assert len(report.missing) == n - (n // global_batch) * global_batch


@pytest.mark.parametrize("workers, sizes", [(2, [7, 3, 9]), (3, [5, 5, 1, 8]), (3, [10, 1, 1])])
def test_file_sharding_with_uneven_files(tmp_path, workers, sizes):
    paths, reader = write_id_files(tmp_path, sizes)
    report = check_coverage(
        paths,
        num_workers=workers,
        global_batch_size=2 * workers,
        shard_policy="file",
        reader=reader,
    )
    assert report.exactly_once, str(report)
    assert sum(report.seen.values()) == sum(sizes)


def test_fewer_files_than_workers_falls_back_to_data_with_a_warning(tmp_path):
    paths, reader = write_id_files(tmp_path, [11])
    with pytest.warns(UserWarning, match=r"Sharding by DATA: there are 1 file\(s\) for 2 workers"):
        report = check_coverage(paths, num_workers=2, global_batch_size=4, reader=reader)
    assert report.exactly_once


def test_forced_file_policy_with_more_workers_than_files(tmp_path):
    paths, reader = write_id_files(tmp_path, [4, 4])
    with pytest.raises(ValueError, match=r"Received: 2 file\(s\) for 3 workers"):
        check_coverage(
            paths, num_workers=3, global_batch_size=3, shard_policy="file", reader=reader
        )


def test_user_sample_weights_are_kept_and_padding_gets_weight_zero():
    source = _ids(23).map(lambda x, y: (x, y, 2.0))
    report = check_coverage(source, num_workers=2, global_batch_size=4)
    assert report.exactly_once and report.padded == 1
    assert all(key[-1] == np.float32(2.0).tobytes() for key in report.seen)


def test_shuffled_shards_still_cover_exactly_once():
    report = check_coverage(_ids(50), num_workers=3, global_batch_size=6, shuffle_buffer=50, seed=4)
    assert report.exactly_once, str(report)


def test_dataset_function_and_unknown_cardinality_are_counted():
    source = lambda: _ids(40).filter(lambda x, y: y % 3 != 0)  # noqa: E731  cardinality unknown
    assert int(source().cardinality()) == tf.data.UNKNOWN_CARDINALITY
    report = check_coverage(source, num_workers=2, global_batch_size=4)
    assert report.exactly_once and sum(report.seen.values()) == 26


@pytest.mark.parametrize("remainder", ["pad", "drop"])
def test_fit_runs_epochs_back_to_back_without_hanging(remainder):
    strategy = tfpar.DataParallel()
    with strategy.scope():
        model = keras.Sequential([keras.layers.Input((1,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse", weighted_metrics=["mae"])
    train = tfpar.data.distribute(_ids(23), strategy, 4, remainder=remainder)
    assert train.steps_per_epoch == (6 if remainder == "pad" else 5)
    history = model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=3, verbose=0)
    assert len(history.history["loss"]) == 3
    # evaluate: each step's mean squared error over its real examples, the steps averaged
    # ("pad": 5 steps of 4 and one of 3; "drop": the 5 whole steps, 20 examples).
    loss, mae = model.evaluate(train.dataset, steps=train.steps_per_epoch, verbose=0)
    (kernel,), bias = model.get_weights()[0], model.get_weights()[1]
    x = np.arange(23, dtype="float64")
    error = x * kernel[0] + bias[0] - x
    steps = [error[i : i + 4] for i in range(0, 23 if remainder == "pad" else 20, 4)]
    assert loss == pytest.approx(np.mean([np.mean(s**2) for s in steps]), rel=1e-5)
    assert mae == pytest.approx(np.mean([np.mean(np.abs(s)) for s in steps]), rel=1e-5)


def test_padding_is_masked_out_of_weighted_metrics():
    """Padding rows have sample weight 0: a perfect model scores exactly 0 error."""
    strategy = tfpar.DataParallel()
    with strategy.scope():
        model = keras.Sequential([keras.layers.Input((1,)), keras.layers.Dense(1, use_bias=False)])
        model.compile("sgd", "mse", weighted_metrics=["mae"])
    model.set_weights([np.ones((1, 1), "float32")])
    data = tfpar.data.distribute(_ids(23).map(lambda x, y: (x, y + 5.0)), strategy, 4)
    assert data.plan.steps * 4 > 23  # padding is present
    _, mae = model.evaluate(data.dataset, steps=data.steps_per_epoch, verbose=0)
    assert mae == pytest.approx(5.0)


def _constant_examples():
    """23 examples with x=1, y=5: a zero-initialised Dense(1) makes every example's loss exactly
    5."""
    return tf.data.Dataset.from_tensor_slices(
        (np.ones((23, 1), "float32"), np.full((23, 1), 5.0, "float32"))
    )


def test_padding_leaves_the_loss_the_mean_over_real_examples():
    strategy = tfpar.DataParallel()
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.layers.Input((1,)),
                keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros"),
            ]
        )
        model.compile("sgd", "mae", weighted_metrics=["mae"])
    data = tfpar.data.distribute(_constant_examples(), strategy, 4)
    assert data.steps_per_epoch == 6 and data.plan.padded_step_weights == (4 / 3,)
    loss, mae = model.evaluate(data.dataset, steps=data.steps_per_epoch, verbose=0)
    assert loss == pytest.approx(5.0, abs=1e-6)  # was 115 / 24 = 4.7917: padding counted
    assert mae == pytest.approx(5.0, abs=1e-6)


def test_a_padded_epoch_trains_like_one_device_fed_a_short_last_batch():
    """23 examples, global batch 4 over 2 replicas: the sixth step holds 3 real examples and one
    padding row; one device gets the same 23 examples in the same order, its last batch 3 long."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(23, 3)).astype("float32")
    y = rng.normal(size=(23, 1)).astype("float32")

    def build():
        model = keras.Sequential(
            [
                keras.layers.Input((3,)),
                keras.layers.Dense(
                    1, kernel_initializer=keras.initializers.Constant(0.3), bias_initializer="zeros"
                ),
            ]
        )
        model.compile(keras.optimizers.SGD(0.1), "mse", weighted_metrics=["mae"])
        return model

    single = build()
    single.fit(x, y, batch_size=4, epochs=3, shuffle=False, verbose=0)
    strategy = tfpar.DataParallel()
    with strategy.scope():
        parallel = build()
    train = tfpar.data.distribute(tf.data.Dataset.from_tensor_slices((x, y)), strategy, 4)
    parallel.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=3, verbose=0)
    for a, b in zip(single.get_weights(), parallel.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
    assert not np.allclose(single.get_weights()[0], 0.3, atol=1e-3)  # it trained


@pytest.mark.parametrize(
    "source, kwargs, error, match",
    [
        (
            lambda: _ids(10),
            dict(shard_policy="chunks"),
            ValueError,
            r"Unknown shard_policy 'chunks'",
        ),
        (lambda: _ids(10), dict(remainder="wrap"), ValueError, r"Unknown remainder 'wrap'"),
        (
            lambda: _ids(10),
            dict(shuffle_buffer=-1),
            ValueError,
            r"shuffle_buffer must be an int >= 0",
        ),
        (
            lambda: tf.data.Dataset.range(10),
            {},
            ValueError,
            r"remainder='pad' needs \(inputs, targets\)",
        ),
        (lambda: 42, {}, TypeError, r"must return a tf.data.Dataset. Received: int"),
        ([], {}, ValueError, r"list of input files is empty"),
    ],
)
def test_bad_input(source, kwargs, error, match):
    strategy = tfpar.DataParallel()
    with pytest.raises(error, match=match):
        tfpar.data.distribute(source, strategy, 4, **kwargs)


def test_non_int_batch():
    with pytest.raises(
        TypeError,
        match=r"global_batch_size must be an int. Received: global_batch_size=4.0 \(float\)",
    ):
        tfpar.data.distribute(_ids(10), tfpar.DataParallel(), 4.0)


def test_each_epoch_has_its_own_order_built_alike_in_any_process():
    """Epoch e's order depends on the seed, the worker and e alone (not on a global seed, nor on the
    epochs read before it), so a resumed run builds the epoch it continues exactly; each epoch is a
    permutation of the shard, and epochs differ."""
    from tfpar.data.sharding import InputConfig, worker_dataset

    source = tf.data.Dataset.range(40).map(lambda i: (i, i))
    config = InputConfig(global_batch_size=8, shuffle_buffer=40, seed=5)

    def order(epoch, worker=0):
        dataset, _ = worker_dataset(
            source, config, num_workers=2, worker_index=worker, num_replicas=2, epoch=epoch
        )
        return [int(v) for batch in dataset.as_numpy_iterator() for v in batch[0]]

    first = [order(e) for e in range(3)]
    tf.random.set_seed(123)  # a script's global seed changes nothing
    assert [order(e) for e in (2, 0, 1)] == [first[2], first[0], first[1]]
    # each once
    assert all(sorted(o + order(e, worker=1)) == list(range(40)) for e, o in enumerate(first))
    assert len({tuple(o) for o in first}) == 3 and order(0, worker=1) != order(0)


@pytest.mark.parametrize("replicas", [1, 2])
@pytest.mark.parametrize("resize", [{3: 2, 8: 3}, {5: 1, 9: 2}])
def test_a_resized_epoch_still_sees_every_example_exactly_once(replicas, resize):
    """An elastic job's epoch: 3 workers, then the rest of the epoch read by another number of
    workers from a step on (a resume there), twice (shrunk, then grown), shuffled with a seed and
    padded at the end (470 examples, 10 steps of 48 with one replica a worker, 5 of 96 with two: the
    resizes' steps halved): every example once, every phase reading steps. Epoch 1: its own order
    (which depends on the epoch alone: the test above)."""
    global_batch = 48 * replicas
    report = check_coverage(
        _ids(470),
        num_workers=3,
        replicas_per_worker=replicas,
        resize={step // replicas: workers for step, workers in resize.items()},
        epoch=1,
        global_batch_size=global_batch,
        shuffle_buffer=470,
        seed=3,
    )
    assert report.exactly_once, str(report)
    assert len(report.phases) == 3 and all(steps > 0 for steps in report.steps_per_worker), report
    assert sum(report.seen.values()) == 470 and report.padded == -470 % global_batch


def test_a_step_holds_the_same_examples_whatever_the_number_of_workers():
    """Why a resize keeps exactly once: under DATA sharding with a seed, step s of epoch e is the
    same set of examples for 1, 2, 3 or 4 workers (the job's order, dealt step by step)."""
    from tfpar.data.sharding import InputConfig, worker_dataset

    config = InputConfig(global_batch_size=12, shuffle_buffer=100, seed=8)

    def steps(workers):
        per_worker = []
        for worker in range(workers):
            dataset, _ = worker_dataset(
                _ids(100),
                config,
                num_workers=workers,
                worker_index=worker,
                num_replicas=workers,
                epoch=2,
            )
            per_worker.append(
                [[int(v) for v, w in zip(b[1], b[2]) if w > 0] for b in dataset.as_numpy_iterator()]
            )
        return [sorted(sum((w[s] for w in per_worker), [])) for s in range(len(per_worker[0]))]

    one = steps(1)
    assert len(one) == 9 and sorted(sum(one, [])) == list(range(100))
    assert steps(2) == one and steps(3) == one and steps(4) == one
