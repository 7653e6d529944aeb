"""tfpar inside Ray Train on a local Ray cluster (127.0.0.1): TensorflowTrainer with 2 workers.

Usage: ray_train.py OUT_DIR [--kill-worker] [--zero] [--refuse-workers N]
First, with --refuse-workers, ScalingConfig(num_workers=N) is checked against the cluster (2 CPUs)
and its refusal printed ("REFUSED ..."). Then each worker trains 4 epochs under DataParallel (with
--zero, its optimizer state sharded over the workers: zero_stage=1) with tfpar.data and tfpar's
callbacks, reports a checkpoint to Ray at every epoch (tfpar.integrations.ray) and writes
worker_<rank>.npz. With --kill-worker, worker 1 SIGKILLs itself in epoch 3 of the first run;
FailureConfig(max_failures=1) restarts the group, which resumes from the last checkpoint. Prints
"RESULT {json}".
"""

import json
import os
import sys
import time

STARTED = time.monotonic()
import ray  # noqa: E402
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig  # noqa: E402
from ray.train.tensorflow import TensorflowTrainer  # noqa: E402

import tfpar.integrations.ray as tfpar_ray  # noqa: E402

out = sys.argv[1]


def _option(name):
    return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else None


def train_loop(config):
    import signal

    import numpy as np

    import tfpar

    # TF_CONFIG from Ray
    strategy = tfpar.DataParallel(timeout_seconds=60, zero_stage=config["zero"])
    import tensorflow as tf

    keras = tfpar.keras
    rank = ray.train.get_context().get_world_rank()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 8)).astype("float32")
    y = x.sum(1)
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.layers.Input((8,)),
                keras.layers.Dense(16, activation="tanh"),
                keras.layers.Dense(1),
            ]
        )
        model.compile(keras.optimizers.SGD(0.02, momentum=0.9), "mse")
    if rank == 0:
        print(strategy.describe(global_batch_size=32, model=model), flush=True)
    start = tfpar_ray.restore(model)
    print(f"worker {rank} starts at epoch {start + 1}", flush=True)
    train = tfpar.data.distribute(tf.data.Dataset.from_tensor_slices((x, y)), strategy, 32)

    class Die(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            marker = os.path.join(config["out"], "killed")
            if (
                config["kill"]
                and rank == 1
                and self.epoch == 2
                and batch == 3
                and not os.path.exists(marker)
            ):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

    history = model.fit(
        train.dataset,
        steps_per_epoch=train.steps_per_epoch,
        epochs=4,
        initial_epoch=start,
        verbose=0,
        callbacks=[tfpar.callbacks.Throughput(32), Die(), tfpar_ray.ReportCheckpoints()],
    )
    np.savez(os.path.join(config["out"], f"worker_{rank}.npz"), *model.get_weights())
    with open(os.path.join(config["out"], f"epochs_{rank}_{start}.json"), "w") as f:
        json.dump({"start": start, "loss": history.history["loss"]}, f)


ray.init(num_cpus=2, include_dashboard=False)
up = time.monotonic() - STARTED
if _option("--refuse-workers"):
    try:
        tfpar_ray.check_resources(ScalingConfig(num_workers=_option("--refuse-workers")))
    except ValueError as error:
        print(f"REFUSED after {time.monotonic() - STARTED - up:.3f} s: {error}", flush=True)
scaling = ScalingConfig(num_workers=2)
tfpar_ray.check_resources(scaling)
trainer = TensorflowTrainer(
    train_loop,
    train_loop_config={
        "out": out,
        "kill": "--kill-worker" in sys.argv,
        "zero": int("--zero" in sys.argv),
    },
    scaling_config=scaling,
    run_config=RunConfig(
        storage_path=os.path.join(out, "ray"),
        name="tfpar",
        failure_config=FailureConfig(max_failures=1),
        checkpoint_config=CheckpointConfig(num_to_keep=2),
    ),
)
result = trainer.fit()
print(
    "RESULT "
    + json.dumps(
        {
            "ray_start_seconds": up,
            "total_seconds": time.monotonic() - STARTED,
            "checkpoint": result.checkpoint.path if result.checkpoint else None,
            "metrics": result.metrics,
        }
    ),
    flush=True,
)
ray.shutdown()
