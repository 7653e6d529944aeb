"""Trains on a local PS cluster; with --kill-worker, SIGKILLs worker 1 in the middle of fit.

With --restart-worker LOG as well, worker 1 is started again right after (its
stderr in LOG), and training goes on until the restarted process has run steps.

Usage: ps_fault.py [--kill-worker [--restart-worker LOG]]

Prints a JSON line: the losses per epoch, the optimizer's step count, which
servers are alive, and how many steps the restarted worker ran.
"""

import json
import os
import signal
import sys
import threading
import time

import numpy as np

import tfpar
from tfpar.strategies.parameter_server import ParameterServer

kill = "--kill-worker" in sys.argv
restart_log = sys.argv[sys.argv.index("--restart-worker") + 1] if "--restart-worker" in sys.argv else None
strategy = ParameterServer.local(num_workers=2, num_ps=1)
import tensorflow as tf  # noqa: E402

keras = tfpar.keras


class StepMarker(keras.layers.Layer):
    """Prints a line on the stderr of the worker process that runs the step."""

    def call(self, inputs):
        with tf.control_dependencies([tf.print("tfpar-step", output_stream=sys.stderr)]):
            return tf.identity(inputs)


rng = np.random.default_rng(0)
w = rng.normal(size=(8, 1)).astype("float32")
x = rng.normal(size=(1024, 8)).astype("float32")
y = (x @ w)[:, 0]
with strategy.scope():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.layers.Input((8,)), StepMarker(), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.05), "mse")
train = tfpar.data.distribute(lambda: tf.data.Dataset.from_tensor_slices((x, y)), strategy, 32)


def restarted_steps():
    if restart_log is None or not os.path.exists(restart_log):
        return 0
    with open(restart_log) as log:
        return log.read().count("tfpar-step")


class KillWorker(keras.callbacks.Callback):
    """Kills worker 1 a moment into epoch 2 (PS allows epoch-level hooks only), maybe restarts it."""

    def on_epoch_begin(self, epoch, logs=None):
        if kill and epoch == 1:
            def shoot():
                os.kill(strategy.local_servers["worker 1"].pid, signal.SIGKILL)
                strategy.local_servers["worker 1"].wait()
                print("killed worker 1", flush=True)
                if restart_log:
                    with open(restart_log, "w") as log:
                        strategy.restart_local_server("worker 1", stderr=log)
                    print("restarted worker 1", flush=True)

            threading.Timer(0.2, shoot).start()

    def on_epoch_end(self, epoch, logs=None):
        # With a restart: stop once the restarted process ran a few steps, or after 120 s (the
        # coordinator finds the new process again after a while, longer on a loaded machine).
        if restart_log and epoch >= 3 and (restarted_steps() >= 5 or time.monotonic() - STARTED > 120):
            self.model.stop_training = True


STARTED = time.monotonic()
history = model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=100_000 if restart_log else 4,
                    verbose=2, callbacks=[KillWorker()])
survivors = {name: p.poll() is None for name, p in strategy.local_servers.items()}
print(json.dumps({"loss": history.history["loss"], "iterations": int(model.optimizer.iterations.numpy()),
                  "alive": survivors, "restarted_steps": restarted_steps()}), flush=True)
