"""Multi-worker training with tfpar.callbacks.FaultTolerance (run under `tfpar launch -n 2`).

Usage: fault_resume.py BACKUP_DIR [--kill] [--kill-at RESTART:WORKER:EPOCH:STEP ...] [--no-backup]
                       [--freeze-at RESTART:WORKER:EPOCH:STEP] [--horovod] [--zero-stage N]
With --kill, worker 1 SIGKILLs itself at the 6th step of epoch 3; --kill-at makes WORKER do so at
STEP (0-based) of EPOCH (1-based) in the run whose $TFPAR_RESTART_COUNT is RESTART (under
`tfpar launch --max-restarts`); --freeze-at makes it SIGSTOP itself there instead (it hangs,
alive; it prints "FREEZING <time>" first). The chief prints "EPOCH_COMPLETE k" after each completed
epoch, and "DONE {json}" (its losses per epoch) when training completes. --zero-stage N shards the
model's state as DataParallel(zero_stage=N) does (the optimizer has a momentum slot to resume).
"""

import json
import os
import signal
import sys
import time

import numpy as np

import tfpar

backup, kill = sys.argv[1], "--kill" in sys.argv
kill_at = {
    tuple(int(v) for v in sys.argv[i + 1].split(":"))
    for i, a in enumerate(sys.argv)
    if a == "--kill-at"
}
freeze_at = {
    tuple(int(v) for v in sys.argv[i + 1].split(":"))
    for i, a in enumerate(sys.argv)
    if a == "--freeze-at"
}
restart = int(os.environ.get("TFPAR_RESTART_COUNT", "0"))
stage = 0
if "--horovod" in sys.argv:  # under horovodrun (tfpar launch --horovod): ranks instead of workers
    from tfpar.strategies.horovod import HorovodStrategy

    strategy = HorovodStrategy()
    worker = strategy.rank
else:
    stage = int(sys.argv[sys.argv.index("--zero-stage") + 1]) if "--zero-stage" in sys.argv else 0
    strategy = tfpar.DataParallel(timeout_seconds=60, zero_stage=stage)
    worker = tfpar.ClusterInfo.from_tf_config().worker_index
import tensorflow as tf  # noqa: E402

keras = tfpar.keras
rng = np.random.default_rng(0)
w = rng.normal(size=(8, 1)).astype("float32")
x = rng.normal(size=(1024, 8)).astype("float32")
y = (x @ w)[:, 0] + 0.1 * rng.normal(size=1024).astype("float32")
with strategy.scope():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.layers.Input((8,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(1)]
    )
    model.compile(keras.optimizers.SGD(0.02, momentum=0.5), "mse")
train = tfpar.data.distribute(tf.data.Dataset.from_tensor_slices((x, y)), strategy, 64)


class Die(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if (kill and worker == 1 and self.epoch == 2 and batch == 5) or (
            restart,
            worker,
            self.epoch + 1,
            batch,
        ) in kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if (restart, worker, self.epoch + 1, batch) in freeze_at:
            print(f"FREEZING {time.time():.3f}", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)

    def on_epoch_end(self, epoch, logs=None):
        if worker == 0:
            print(f"EPOCH_COMPLETE {epoch + 1} restart {restart}", flush=True)


backups = [] if "--no-backup" in sys.argv else [tfpar.callbacks.FaultTolerance(backup)]
history = model.fit(
    train.dataset,
    steps_per_epoch=train.steps_per_epoch,
    epochs=5,
    verbose=2 if worker == 0 else 0,
    callbacks=[*backups, Die()],
)
if worker == 0:
    print("DONE " + json.dumps({"loss": history.history["loss"]}), flush=True)
    if stage:
        print(strategy.describe(model=model), flush=True)
