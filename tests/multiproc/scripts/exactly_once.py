"""The mid-epoch resume job, as a user writes it: FaultTolerance(save_freq=5) over a shuffled,
seeded tfpar.data input (320 examples, global batch 32: 10 steps an epoch, 4 epochs).

Usage: exactly_once.py BACKUP_DIR RECORDS_DIR [--horovod] [--attempt N] [--elastic HOSTS_FILE
[--undisturbed]]
                       [--elastic-nodes]
Under `tfpar launch --max-restarts 1` the attempt is $TFPAR_RESTART_COUNT; under horovodrun,
--attempt. In attempt 0, worker (rank) 1 SIGKILLs itself at the start of step 6 of epoch 2 (batch 5
of epoch index 1), once the chief has written the backup of step 5. Every replica step appends the
ids it trains on (examples are numbered from 1; padding rows are zeros, weight 0, and carry id 0, so
only ids > 0 at a weight > 0 are recorded) to RECORDS_DIR/attempt<A>-worker<W>.jsonl, one line per
replica step: {"epoch", "step", "ids", "time"}. The model in Keras 3 when $TFPAR_TEST_KERAS is "3".

With --elastic (under an elastic `tfpar launch --host-discovery-file HOSTS_FILE` of 3 workers, the
third on "localhost"): 480 examples, global batch 48 (10 steps), 5 epochs; in attempt 0 worker 2
takes localhost out of HOSTS_FILE and SIGKILLs itself at the start of step 7 of epoch 2 (after the
backup of step 5), writing the time to RECORDS_DIR/lost; in the attempt after, worker 0 puts
localhost back at the start of epoch 4 and trains on once the launcher has asked for a backup to
grow from. Worker 0 prints the final loss over all examples ("LOSS x").

With --elastic-nodes (under 3 agents of `tfpar launch --nnodes 2:3`, a worker each), the same job,
except that worker 2's host is lost with it: it SIGKILLs its agent, then itself; and worker 0 writes
RECORDS_DIR/back at the start of epoch 4 (the test then starts another agent) and trains on once the
rendezvous has asked for a backup.
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
attempt = (
    int(sys.argv[sys.argv.index("--attempt") + 1])
    if "--attempt" in sys.argv
    else int(os.environ.get("TFPAR_RESTART_COUNT", "0"))
)
strategy, worker = process_strategy()
import tensorflow as tf  # noqa: E402

k = keras_of_env()
hosts = sys.argv[sys.argv.index("--elastic") + 1] if "--elastic" in sys.argv else None
elastic = hosts is not None or "--elastic-nodes" in sys.argv
n, global_batch, epochs, victim, kill_step = (480, 48, 5, 2, 6) if elastic else (320, 32, 4, 1, 5)
# the same job, nobody killed (bench/elastic.py)
victim = -1 if "--undisturbed" in sys.argv else victim
where = {"epoch": 0, "step": 0}
log = open(os.path.join(records, f"attempt{attempt}-worker{worker}.jsonl"), "a", encoding="utf-8")


def record(ids, weights):
    trained = [int(i) for i, w in zip(ids.numpy(), weights.numpy()) if i > 0 and w > 0]
    log.write(
        json.dumps(
            {
                "epoch": int(where["epoch"]),
                "step": int(where["step"]),
                "ids": trained,
                "time": time.time(),
            }
        )
        + "\n"
    )
    log.flush()
    return np.int32(0)


class Recorded(k.Sequential):
    """Records the ids of each batch it trains on at a weight above 0 (a resume under
    --elastic-batch scale-lr carries the examples its step trained already at weight 0)."""

    def train_step(self, data):
        weights = data[2] if len(data) == 3 else tf.ones_like(data[0][:, 0])
        tf.py_function(record, [data[0][:, 0], weights], tf.int32)
        return super().train_step(data)


# The chief says when the backup after step 5 of epoch 2 is written (Where runs after
# FaultTolerance), and worker 1 dies only then: without it, the launcher could stop the chief in the
# middle of that backup when worker 1 dies, and the job would rightly resume from the one before (a
# race, not a fault).
saved = os.path.join(os.path.dirname(os.path.abspath(backup)), "chief-saved-step-5")


class Where(k.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        where["epoch"] = epoch

    def on_train_batch_begin(self, batch, logs=None):
        where["step"] = batch
        if attempt == 0 and worker == victim and where["epoch"] == 1 and batch == kill_step:
            deadline = time.monotonic() + 60
            while not os.path.exists(saved) and time.monotonic() < deadline:
                time.sleep(0.05)
            if hosts:  # its host is gone for good: out of discovery before it dies
                with open(hosts, "w") as f:
                    f.write("127.0.0.1:2\n")
            if elastic:
                with open(os.path.join(records, "lost"), "w") as f:
                    f.write(repr(time.time()))
            if "--elastic-nodes" in sys.argv:  # its host is gone: its agent first
                os.kill(os.getppid(), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)
        if (
            elastic
            and attempt > 0
            and worker == 0
            and where["epoch"] == 3
            and batch == 0
            and os.path.exists(os.path.join(records, "lost"))
            and not os.path.exists(os.path.join(records, "back"))
        ):
            if hosts:  # capacity returns
                with open(hosts, "w") as f:
                    f.write("127.0.0.1:2\nlocalhost:1\n")
            open(os.path.join(records, "back"), "w").close()
            # Paced as the kill is: training goes on once the launcher has seen it (it looks every
            # second, and an epoch here is shorter), so that a backup follows to grow from.
            deadline = time.monotonic() + 60
            while (
                not os.path.exists(os.path.join(os.environ["TFPAR_LAUNCH_DIR"], "grow"))
                and time.monotonic() < deadline
            ):
                time.sleep(0.05)

    def on_train_batch_end(self, batch, logs=None):
        if attempt == 0 and worker == 0 and where["epoch"] == 1 and batch == 4:
            open(saved, "w").close()


rng = np.random.default_rng(0)
x = np.concatenate(
    [np.arange(1, n + 1, dtype="float32")[:, None], rng.normal(size=(n, 4)).astype("float32")], 1
)
y = rng.normal(size=n).astype("float32")
with strategy.scope():
    k.utils.set_random_seed(0)
    model = Recorded([k.layers.Input((5,)), k.layers.Lambda(lambda t: t[:, 1:]), k.layers.Dense(1)])
    model.compile(k.optimizers.SGD(0.01), "mse")
train = tfpar.data.distribute(
    tf.data.Dataset.from_tensor_slices((x, y)), strategy, global_batch, shuffle_buffer=n, seed=3
)
model.fit(
    train.dataset,
    steps_per_epoch=train.steps_per_epoch,
    epochs=epochs,
    verbose=0,
    callbacks=[tfpar.callbacks.FaultTolerance(backup, save_freq=5), Where()],
)
log.close()
kernel, bias = model.get_weights()
# the trained model's, over every example
loss = float(np.mean((x[:, 1:] @ kernel[:, 0] + bias[0] - y) ** 2))
if worker == 0:
    print(f"LOSS {loss!r}", flush=True)
    print("DONE", flush=True)
