"""Data-parallel training on the digits: one host, or many under `tfpar launch`.

One host (2 virtual CPU devices, or the GPUs):
    python examples/train_data_parallel.py
Several workers on this machine (MultiWorkerMirroredStrategy over loopback), a GPU (or a
virtual CPU device) each:
    tfpar launch --nproc-per-node 2 -- python examples/train_data_parallel.py
Several machines: on machine K of N,
    tfpar launch --hosts a:2222,b:2222 --task-index K -- python examples/train_data_parallel.py

``--out DIR`` writes each worker's final weights and losses (used by the tests).
"""

import argparse
import json
import os

import numpy as np

import tfpar
from tfpar.demo import build_model, default_epochs, load_digits


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--epochs", type=int, default=default_epochs(5), help="default 5, or $TFPAR_EPOCHS"
    )
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
    parser.add_argument("--out", help="folder for worker_<i>.npz and worker_<i>.json")
    args = parser.parse_args()

    devices = tfpar.configure_devices()  # one host: 2 virtual CPU devices (no-op for the GPU case)
    strategy = tfpar.DataParallel(timeout_seconds=120)
    keras, tf = tfpar.keras, __import__("tensorflow")
    keras.utils.set_random_seed(0)  # same initial weights on every worker
    (x, y), _ = load_digits()
    with strategy.scope():
        model = build_model()
        model.compile(
            keras.optimizers.Adam(1e-3),
            "sparse_categorical_crossentropy",
            weighted_metrics=["accuracy"],
        )
    print(strategy.describe(global_batch_size=args.batch_size, model=model))
    train = tfpar.data.distribute(
        tf.data.Dataset.from_tensor_slices((x, y)),
        strategy,
        args.batch_size,
        shuffle_buffer=len(x),
        seed=1,
    )
    history = model.fit(
        train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=args.epochs, verbose=2
    )
    losses = history.history["loss"]
    print(f"loss: first epoch {losses[0]:.4f}, last epoch {losses[-1]:.4f}")
    if args.out:
        cluster = tfpar.ClusterInfo.from_tf_config()
        index = cluster.worker_index if cluster else 0
        os.makedirs(args.out, exist_ok=True)
        np.savez(os.path.join(args.out, f"worker_{index}.npz"), *model.get_weights())
        with open(os.path.join(args.out, f"worker_{index}.json"), "w") as f:
            json.dump(
                {"loss": losses, "replicas": strategy.num_replicas_in_sync, "devices": devices}, f
            )


if __name__ == "__main__":
    main()
