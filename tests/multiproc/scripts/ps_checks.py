"""Trains on a local parameter-server cluster and reports JSON (run in its own process:
connecting to a cluster changes the process's TensorFlow context for good)."""

import importlib
import json
import sys
import traceback

import numpy as np

import tfpar
from tfpar.strategies.parameter_server import ParameterServer, variable_placement

strategy = ParameterServer.local(num_workers=2, num_ps=2, min_shard_bytes=4096)
import tensorflow as tf  # noqa: E402

keras = tfpar.keras
rng = np.random.default_rng(0)
centers = rng.normal(scale=3.0, size=(4, 8))
y = rng.integers(0, 4, size=512)
x = (centers[y] + rng.normal(size=(512, 8))).astype("float32")


def mlp():
    return keras.Sequential(
        [
            keras.layers.Input((8,)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(4, activation="softmax"),
        ]
    )


with strategy.scope():
    model = mlp()
    model.compile(
        keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy", metrics=["accuracy"]
    )
    embedder = keras.Sequential(
        [
            keras.layers.Input((4,), dtype="int32"),
            keras.layers.Embedding(1000, 16),
            keras.layers.Flatten(),
            keras.layers.Dense(1),
        ]
    )
train = tfpar.data.distribute(
    lambda: tf.data.Dataset.from_tensor_slices((x, y)), strategy, 32, shuffle_buffer=512, seed=1
)
# Callbacks with batch hooks run at epoch level here (Keras refuses batch hooks under PS).
history = model.fit(
    train.dataset,
    steps_per_epoch=train.steps_per_epoch,
    epochs=4,
    verbose=2,
    callbacks=[
        tfpar.callbacks.LearningRateWarmup(warmup_epochs=2, scale=4),
        tfpar.callbacks.NaNGuard(),
        tfpar.callbacks.Throughput(32),
        tfpar.callbacks.MetricAverage(),
    ],
)
# LARS: its update (norms, trust ratio) runs where the variables live, on the ps
with strategy.scope():
    lars_model = mlp()
    lars_model.compile(
        tfpar.optimizers.LARS(1.0, eta=0.02, weight_decay=1e-4, exclude_from_weight_decay=["bias"]),
        "sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
lars_accuracy = lars_model.fit(
    train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=4, verbose=0
).history["accuracy"]
evaluation = tfpar.data.distribute(
    lambda: tf.data.Dataset.from_tensor_slices((x, y)), strategy, 64, shuffle_buffer=512, seed=2
)
scores = model.evaluate(
    evaluation.dataset, steps=evaluation.steps_per_epoch, return_dict=True, verbose=0
)
try:
    model.fit(train.dataset, epochs=1, verbose=0)
except ValueError as e:
    steps_error = str(e)
with tf.device("/job:chief/replica:0/task:0/device:CPU:0"):
    probabilities = model.predict(x, verbose=0)
error = None
try:
    tfpar.data.distribute(tf.data.Dataset.from_tensor_slices((x, y)), strategy, 32)
except ValueError as e:
    error = str(e)
synchronized_error = None
try:
    with strategy.scope():
        synchronized = keras.Sequential(
            [keras.layers.Input((4,)), keras.layers.BatchNormalization(synchronized=True)]
        )
        synchronized.compile("sgd", "mse")
except ValueError as e:
    synchronized_error = str(e)
# Keras 3's fit has no ClusterCoordinator: tfpar's input refuses it from tfpar's own code.
keras3 = importlib.import_module("keras")
with strategy.scope():
    keras3_model = keras3.Sequential([keras3.layers.Input((8,)), keras3.layers.Dense(4)])
    keras3_model.compile("sgd", "mse")
keras3_error = None
try:
    keras3_model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=1, verbose=0)
except TypeError as e:
    keras3_error = [traceback.extract_tb(e.__traceback__)[-1].filename, str(e)]
resolver_report = {
    "cluster": strategy.cluster_resolver.cluster_spec().as_dict(),
    "task": [strategy.cluster_resolver.task_type, strategy.cluster_resolver.task_id],
}
local_cluster = strategy.config.cluster.cluster
ports = {
    int(a.rsplit(":", 1)[1]): role
    for role in ("chief", "ps", "worker")
    for a in local_cluster[role]
}
from tfpar._local.loopback import listening  # noqa: E402  (reads /proc/net/tcp*: nothing is sent)

running = [(address, ports[port]) for address, port in sorted(set(listening())) if port in ports]
# shutdown(): every server process it started has exited, and nothing listens at their addresses.
servers = strategy.local_servers
strategy.shutdown()
shutdown = {
    "exited": {name: proc.poll() is not None for name, proc in servers.items()},
    "listening": [port for _, port in listening() if ports.get(port) in ("ps", "worker")],
    "left": strategy.local_servers,
}
json.dump(
    {
        "steps_per_epoch": train.steps_per_epoch,
        "accuracy": history.history["accuracy"],
        "lars_accuracy": lars_accuracy,
        "lr": history.history["lr"],
        "examples_per_second": history.history["examples_per_second"],
        "evaluate": scores,
        "steps_error": steps_error,
        "predict_accuracy": float((probabilities.argmax(-1) == y).mean()),
        # Per-example losses; their spread bounds how far a sample's mean (evaluate's) may fall.
        "predict_loss": float((-np.log(probabilities[np.arange(len(y)), y])).mean()),
        "predict_loss_std": float((-np.log(probabilities[np.arange(len(y)), y])).std()),
        "placement": variable_placement(embedder) | variable_placement(model),
        "describe": strategy.describe(global_batch_size=32, model=embedder),
        "dataset_error": error,
        "synchronized_batchnorm_error": synchronized_error,
        "keras3_error": keras3_error,
        "resolver": resolver_report,
        "local_cluster": local_cluster,
        "shutdown": shutdown,
        "listening_while_running": running,
    },
    sys.stdout,
)
print()
