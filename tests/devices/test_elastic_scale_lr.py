"""An elastic job under ``--elastic-batch scale-lr``: each replica keeps the full job's per-replica
batch, the global batch follows the workers and the learning rate follows it by the scaling rule; a
resume in the middle of an epoch with another global batch continues at the exact example. On 2
virtual CPU devices, one worker, under both Kerases, with the environment an elastic launch gives
its workers (`TFPAR_ELASTIC`)."""

import numpy as np
import pytest
import tensorflow as tf

import tfpar
from tfpar._tasks.elastic_batch import ElasticBatch
from tfpar._tasks.env import ELASTIC_VARIABLE

N, GLOBAL_BATCH = 100, 24


class Failure(Exception):
    """The fault a run dies of (in-process: the next run is the relaunch)."""


def _told(monkeypatch, reference, batch="scale-lr"):
    monkeypatch.setenv(ELASTIC_VARIABLE, ElasticBatch(reference, 1, batch).to_env())


def _run(k, backup, records, fail_at=None, save_freq=3, epochs=2, loss_scale=False):
    """Trains on N examples numbered from 1 (a seeded shuffle), global batch GLOBAL_BATCH as the
    full job sets it, SGD at 0.1, backups every ``save_freq`` steps; appends {"epoch", "step",
    "ids", "weights"} for every replica step to ``records``; raises Failure at the start of step
    ``fail_at`` = (epoch, step). Returns (the optimizer's learning rate at the end, steps per
    epoch)."""
    where = {}

    def record(ids, weights):
        records.append(
            {
                **where,
                "ids": [int(i) for i in ids.numpy()],
                "weights": [float(w) for w in weights.numpy()],
            }
        )
        return np.int32(0)

    class Recorded(k.Sequential):
        def train_step(self, data):
            x, _, w = data
            tf.py_function(record, [x[:, 0], w], tf.int32)
            return super().train_step(data)

    class Where(k.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            where["epoch"] = epoch

        def on_train_batch_begin(self, batch, logs=None):
            where["step"] = batch if where["epoch"] != resumed[0] else batch + resumed[1]
            if (where["epoch"], where["step"]) == fail_at:
                raise Failure

    rng = np.random.default_rng(0)
    x = np.concatenate(
        [np.arange(1, N + 1, dtype="float32")[:, None], rng.normal(size=(N, 4)).astype("float32")],
        1,
    )
    y = rng.normal(size=N).astype("float32")
    strategy = tfpar.DataParallel()
    with strategy.scope():
        model = Recorded(
            [k.layers.Input((5,)), k.layers.Lambda(lambda t: t[:, 1:]), k.layers.Dense(1)]
        )
        optimizer = k.optimizers.SGD(0.1)
        model.compile(
            k.mixed_precision.LossScaleOptimizer(optimizer) if loss_scale else optimizer, "mse"
        )
    train = tfpar.data.distribute(
        tf.data.Dataset.from_tensor_slices((x, y)), strategy, GLOBAL_BATCH, shuffle_buffer=N, seed=3
    )
    fault_tolerance = tfpar.callbacks.FaultTolerance(str(backup), save_freq=save_freq)
    resumed = [None, 0]

    class Resumed(k.callbacks.Callback):  # Keras 3 numbers a resumed epoch's steps from 0
        def on_train_begin(self, logs=None):
            if fault_tolerance.resumed_at_epoch is not None and tfpar.keras is not k:
                resumed[:] = [fault_tolerance.resumed_at_epoch, _first_step(fault_tolerance)]

    try:
        model.fit(
            train.dataset,
            steps_per_epoch=train.steps_per_epoch,
            epochs=epochs,
            verbose=0,
            callbacks=[fault_tolerance, Resumed(), Where()],
        )
    except Failure:
        pass
    return float(np.asarray(model.optimizer.learning_rate)), train.steps_per_epoch


def _first_step(fault_tolerance):
    return fault_tolerance._skipped[1] if fault_tolerance._skipped else 0


def test_the_global_batch_and_the_learning_rate_follow_the_workers(
    any_keras, monkeypatch, tmp_path, capsys
):
    """1 worker of 2: the reference's 6 examples on each replica (global batch 12, 9 steps of 100
    examples) and the learning rate halved (linear rule), once however many fits; sqrt: 0.1 /
    sqrt(2)."""
    _told(monkeypatch, reference=2)
    records = []
    rate, steps = _run(any_keras, tmp_path / "backup", records, epochs=1)
    assert (steps, rate) == (9, pytest.approx(0.05))
    assert {len(r["ids"]) for r in records} == {6}
    assert (
        "global batch 12, each replica keeping the full job's batch; the learning rate is "
        "multiplied by 0.5 "
        "(scale-lr: the linear scaling rule)" in capsys.readouterr().out
    )
    _told(monkeypatch, reference=2, batch="scale-lr-sqrt")
    rate, _ = _run(any_keras, tmp_path / "backup-sqrt", [], epochs=1)
    assert rate == pytest.approx(0.1 / np.sqrt(2))


@pytest.mark.parametrize("loss_scale", [False, True], ids=["sgd", "loss-scale-sgd"])
def test_a_resume_with_another_global_batch_continues_at_the_exact_example(
    any_keras, monkeypatch, tmp_path, capsys, loss_scale
):
    """The job on 1 of 2 workers (global batch 12) dies at step 5 of epoch 1 after its backup of
    step 3 (36 examples trained); it resumes on the full job's size (global batch 24, one worker
    here): example 37 is in its step 2, whose first 12 examples are carried at weight 0 and the
    other 12 at 2 (the step's mean over its real examples). Over the two epochs every example is
    trained at a weight above 0 exactly once; the learning rate is the restored 0.05 put back to 0.1
    (under a loss-scale optimizer, the rate of the one it wraps)."""
    backup = tmp_path / "backup"
    _told(monkeypatch, reference=2)
    before = []
    rate, _ = _run(any_keras, backup, before, fail_at=(0, 4), loss_scale=loss_scale)
    assert rate == pytest.approx(0.05)
    _told(monkeypatch, reference=1)
    after = []
    rate, steps = _run(any_keras, backup, after, loss_scale=loss_scale)
    out = capsys.readouterr().out
    assert (
        "resumed from the backup in" in out
        and "at epoch 1, step 4 (its example 37, in step 2 of this job's global batches of 24)"
        in out
    ), out
    assert (rate, steps) == (pytest.approx(0.1), 5)
    # the failed run's steps after its backup are rolled back
    kept = [r for r in before if r["step"] < 3]
    for epoch in (0, 1):
        trained = [
            i
            for r in kept + after
            if r["epoch"] == epoch
            for i, w in zip(r["ids"], r["weights"])
            if w > 0 and i > 0
        ]
        assert sorted(trained) == list(range(1, N + 1)), f"epoch {epoch + 1}"
    first = [r for r in after if (r["epoch"], r["step"]) == (0, 1)]
    weights = sorted(w for r in first for w in r["weights"])
    assert weights == [0.0] * 12 + [2.0] * 12, first
    assert sorted((r["epoch"], r["step"]) for r in after)[0] == (0, 1)


def test_what_scale_lr_cannot_scale_is_refused_before_the_first_step(monkeypatch):
    """A rate that is a schedule, an input that is not tfpar's, elements without targets: each
    refused at once, naming the fix; nothing trained."""
    k = tfpar.keras
    _told(monkeypatch, reference=2)
    strategy = tfpar.DataParallel()
    x, y = np.ones((48, 3), "float32"), np.ones((48, 1), "float32")
    with strategy.scope():
        model = k.Sequential([k.layers.Input((3,)), k.layers.Dense(1)])
        model.compile(
            k.optimizers.SGD(k.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9)), "mse"
        )
    train = tfpar.data.distribute(tf.data.Dataset.from_tensor_slices((x, y)), strategy, 24)
    with pytest.raises(
        ValueError,
        match=r"scales the optimizer's learning rate.*Received: learning_rate=ExponentialDecay",
    ):
        model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, verbose=0)
    with pytest.raises(
        ValueError, match=r"tfpar.data.distribute input only. Received: x of type _BatchDataset"
    ):
        model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(12), verbose=0)
    with pytest.raises(ValueError, match=r"needs \(inputs, targets\).*Received elements of spec"):
        tfpar.data.distribute(tf.data.Dataset.from_tensor_slices(x), strategy, 24)
    assert int(model.optimizer.iterations.numpy()) == 0
