"""A local PS cluster (2 workers, 1 ps) through three fits of one process:

1. an undisturbed model trains 4 epochs: the reference;
2. the same model, made again from the same seed, trains 4 epochs while worker 1 is SIGKILLed a
   moment into epoch 2: its steps are rescheduled on the survivor;
3. worker 1 is started again (its stderr in LOG) and the model trains on until the new process has
   run steps (or 240 s have passed).

Usage: ps_fault.py LOG

Prints a JSON line: for each fit, the losses per epoch, the optimizer's step count and which
servers are alive at its end; and how many steps the restarted worker ran.
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

restart_log = sys.argv[1]
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
train = tfpar.data.distribute(lambda: tf.data.Dataset.from_tensor_slices((x, y)), strategy, 32)


def new_model():
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.layers.Input((8,)), StepMarker(), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.05), "mse")
    return model


def restarted_steps():
    if not os.path.exists(restart_log):
        return 0
    with open(restart_log) as log:
        return log.read().count("tfpar-step")


class KillWorker(keras.callbacks.Callback):
    """Kills worker 1 a moment into epoch 2 (PS allows epoch-level hooks only)."""

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 1:

            def shoot():
                os.kill(strategy.local_servers["worker 1"].pid, signal.SIGKILL)
                strategy.local_servers["worker 1"].wait()
                print("killed worker 1", flush=True)

            threading.Timer(0.2, shoot).start()


class UntilRestartedWorkerSteps(keras.callbacks.Callback):
    """Stops once the restarted process ran a few steps, or after 240 s (the coordinator finds the
    new process again after a while, longer on a loaded machine: seen on a CI run, the new process
    took 40 s to start TensorFlow and had run 1 step at 120 s)."""

    def on_epoch_end(self, epoch, logs=None):
        if restarted_steps() >= 5 or time.monotonic() - RESTARTED > 240:
            self.model.stop_training = True


def fit(model, epochs, callbacks):
    history = model.fit(
        train.dataset,
        steps_per_epoch=train.steps_per_epoch,
        epochs=epochs,
        verbose=2,
        callbacks=callbacks,
    )
    return {
        "loss": history.history["loss"],
        "iterations": int(model.optimizer.iterations.numpy()),
        "alive": {name: p.poll() is None for name, p in strategy.local_servers.items()},
    }


report = {"undisturbed": fit(new_model(), 4, [])}
model = new_model()
report["killed"] = fit(model, 4, [KillWorker()])
with open(restart_log, "w") as log:
    strategy.restart_local_server("worker 1", stderr=log)
print("restarted worker 1", flush=True)
RESTARTED = time.monotonic()
report["restarted"] = fit(model, 100_000, [UntilRestartedWorkerSteps()])
report["restarted_steps"] = restarted_steps()
print(json.dumps(report), flush=True)
