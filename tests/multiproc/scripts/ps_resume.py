"""PS training with tfpar.callbacks.FaultTolerance (Keras' BackupAndRestore); with --kill-ps the ps
dies during epoch 3.

Usage: ps_resume.py BACKUP_DIR [--kill-ps]
"""

import os
import signal
import sys
import threading

import tfpar
from tfpar.strategies.parameter_server import ParameterServer, ParameterServerLostError

backup, kill = sys.argv[1], "--kill-ps" in sys.argv
strategy = ParameterServer.local(num_workers=2, num_ps=1)
import tensorflow as tf  # noqa: E402

from tests.models import ps_sum_regression  # noqa: E402

keras = tfpar.keras
model, train = ps_sum_regression(strategy, 1024)


class KillPs(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        if kill and epoch == 2:
            threading.Timer(
                0.1, lambda: os.kill(strategy.local_servers["ps 0"].pid, signal.SIGKILL)
            ).start()


try:
    history = model.fit(
        train.dataset,
        steps_per_epoch=train.steps_per_epoch,
        epochs=5,
        verbose=2,
        callbacks=[KillPs(), tfpar.callbacks.FaultTolerance(backup)],
    )
except ParameterServerLostError as error:
    # The error in one write of its own: the traceback Python prints on the way out comes in
    # pieces, between which TensorFlow's coordinator threads may still log to the same output.
    print(f"{type(error).__name__}: {error}", flush=True)
    print(
        f"lost tasks: {error.tasks}; an UnavailableError: "
        f"{isinstance(error, tf.errors.UnavailableError)}",
        flush=True,
    )
    raise
print(f"finished with loss {history.history['loss'][-1]:.4f}", flush=True)
