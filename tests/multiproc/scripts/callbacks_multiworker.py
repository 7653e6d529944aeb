"""MetricAverage, Throughput and NaNGuard under `tfpar launch -n 2`. Prints ``REPORT {json}``."""

import json

import numpy as np

import tfpar

strategy = tfpar.DataParallel(timeout_seconds=60)
import tensorflow as tf  # noqa: E402

keras = tfpar.keras
worker = tfpar.ClusterInfo.from_tf_config().worker_index
rng = np.random.default_rng(0)
x = rng.normal(size=(512, 8)).astype("float32")
y = (x.sum(1) > 0).astype("float32")


class PerWorkerNumber(keras.callbacks.Callback):
    """A number that differs per worker: 1 on worker 0, 2 on worker 1."""

    def on_epoch_end(self, epoch, logs=None):
        logs["worker_number"] = float(worker + 1)
        logs["kept_number"] = float(10 * (worker + 1))  # MetricAverage(keys=[...]) leaves it alone


def build(learning_rate):
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.layers.Input((8,)),
                keras.layers.Dense(16, activation="relu"),
                keras.layers.Dense(1),
            ]
        )
        model.compile(keras.optimizers.SGD(learning_rate), "mse")
    return model


train = tfpar.data.distribute(tf.data.Dataset.from_tensor_slices((x, y)), strategy, 64)
history = build(0.01).fit(
    train.dataset,
    steps_per_epoch=train.steps_per_epoch,
    epochs=2,
    verbose=0,
    callbacks=[
        PerWorkerNumber(),
        tfpar.callbacks.MetricAverage(keys=["worker_number"]),
        tfpar.callbacks.Throughput(64),
    ],
)
guard = tfpar.callbacks.NaNGuard()
diverging = build(1e6)  # explodes within a few steps
diverging.fit(
    train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=3, verbose=0, callbacks=[guard]
)
print(
    "REPORT "
    + json.dumps(
        {
            "worker": worker,
            "worker_number": history.history["worker_number"],
            "kept_number": history.history["kept_number"],
            "examples_per_second": history.history["examples_per_second"],
            "per_worker": history.history["examples_per_second_per_worker"],
            "stopped_at_step": guard.stopped_at_step,
            "finite_after_stop": bool(all(np.isfinite(w).all() for w in diverging.get_weights())),
        }
    ),
    flush=True,
)
