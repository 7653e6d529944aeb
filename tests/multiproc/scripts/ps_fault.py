"""Trains on a local PS cluster; with --kill-worker, SIGKILLs worker 1 in the middle of fit.

Prints a JSON line: the losses per epoch and how many steps each epoch ran.
"""

import json
import os
import signal
import sys
import threading

import numpy as np

import tfpar
from tfpar.strategies.parameter_server import ParameterServer

kill = "--kill-worker" in sys.argv
strategy = ParameterServer.local(num_workers=2, num_ps=1)
import tensorflow as tf  # noqa: E402

keras = tfpar.keras
rng = np.random.default_rng(0)
w = rng.normal(size=(8, 1)).astype("float32")
x = rng.normal(size=(1024, 8)).astype("float32")
y = (x @ w)[:, 0]
with strategy.scope():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.layers.Input((8,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.05), "mse")
train = tfpar.data.distribute(lambda: tf.data.Dataset.from_tensor_slices((x, y)), strategy, 32)


class KillWorker(keras.callbacks.Callback):
    """Kills worker 1 a moment into epoch 2 (PS allows epoch-level hooks only)."""

    def on_epoch_begin(self, epoch, logs=None):
        if kill and epoch == 1:
            def shoot():
                os.kill(strategy.local_servers["worker 1"].pid, signal.SIGKILL)
                print("killed worker 1", flush=True)

            threading.Timer(0.2, shoot).start()


history = model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=4, verbose=2,
                    callbacks=[KillWorker()])
survivors = {name: p.poll() is None for name, p in strategy.local_servers.items()}
print(json.dumps({"loss": history.history["loss"], "iterations": int(model.optimizer.iterations.numpy()),
                  "alive": survivors}), flush=True)
