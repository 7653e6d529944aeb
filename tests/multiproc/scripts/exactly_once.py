"""The mid-epoch resume job, as a user writes it: FaultTolerance(save_freq=5) over a shuffled,
seeded tfpar.data input (320 examples, global batch 32: 10 steps an epoch, 4 epochs).

Usage: exactly_once.py BACKUP_DIR RECORDS_DIR [--horovod] [--attempt N]
Under `tfpar launch --max-restarts 1` the attempt is $TFPAR_RESTART_COUNT; under horovodrun, --attempt.
In attempt 0, worker (rank) 1 SIGKILLs itself at the start of step 6 of epoch 2 (batch 5 of epoch
index 1), once the chief has written the backup of step 5. Every replica step appends the ids it trains on (examples are numbered from 1; padding
rows are zeros, weight 0, and carry id 0, so only ids > 0 are recorded) to
RECORDS_DIR/attempt<A>-worker<W>.jsonl, one line per replica step: {"epoch", "step", "ids"}.
The model in Keras 3 when $TFPAR_TEST_KERAS is "3".
"""

import json
import os
import signal
import sys
import time

import numpy as np

import tfpar
from tests.models import keras_of_env, process_strategy

backup, records = sys.argv[1], sys.argv[2]
attempt = int(sys.argv[sys.argv.index("--attempt") + 1]) if "--attempt" in sys.argv else int(
    os.environ.get("TFPAR_RESTART_COUNT", "0"))
strategy, worker = process_strategy()
import tensorflow as tf  # noqa: E402

k = keras_of_env()
where = {"epoch": 0, "step": 0}
log = open(os.path.join(records, f"attempt{attempt}-worker{worker}.jsonl"), "a", encoding="utf-8")


def record(ids):
    trained = [int(i) for i in ids.numpy() if i > 0]
    log.write(json.dumps({"epoch": int(where["epoch"]), "step": int(where["step"]), "ids": trained}) + "\n")
    log.flush()
    return np.int32(0)


class Record(k.layers.Layer):
    """Records the ids of the batch it trains on; passes the features on."""

    def call(self, x, training=None):
        if training:
            done = tf.py_function(record, [x[:, 0]], tf.int32)
            with tf.control_dependencies([done]):
                return tf.identity(x[:, 1:])
        return x[:, 1:]


# The chief says when the backup after step 5 of epoch 2 is written (Where runs after FaultTolerance),
# and worker 1 dies only then: without it, the launcher could stop the chief in the middle of that
# backup when worker 1 dies, and the job would rightly resume from the one before (a race, not a fault).
saved = os.path.join(os.path.dirname(os.path.abspath(backup)), "chief-saved-step-5")


class Where(k.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        where["epoch"] = epoch

    def on_train_batch_begin(self, batch, logs=None):
        where["step"] = batch
        if attempt == 0 and worker == 1 and where["epoch"] == 1 and batch == 5:
            deadline = time.monotonic() + 60
            while not os.path.exists(saved) and time.monotonic() < deadline:
                time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGKILL)

    def on_train_batch_end(self, batch, logs=None):
        if attempt == 0 and worker == 0 and where["epoch"] == 1 and batch == 4:
            open(saved, "w").close()


n = 320
rng = np.random.default_rng(0)
x = np.concatenate([np.arange(1, n + 1, dtype="float32")[:, None], rng.normal(size=(n, 4)).astype("float32")], 1)
y = rng.normal(size=n).astype("float32")
with strategy.scope():
    k.utils.set_random_seed(0)
    model = k.Sequential([k.layers.Input((5,)), Record(), k.layers.Dense(1)])
    model.compile(k.optimizers.SGD(0.01), "mse")
train = tfpar.data.distribute(tf.data.Dataset.from_tensor_slices((x, y)), strategy, 32, shuffle_buffer=320, seed=3)
model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=4, verbose=0,
          callbacks=[tfpar.callbacks.FaultTolerance(backup, save_freq=5), Where()])
log.close()
if worker == 0:
    print("DONE", flush=True)
