"""Ray Train against `tfpar launch`: the same 2-worker DataParallel job (the demo's model on the
digits, 2 epochs), started each way, in turns; the wall time from the command to its end.

    python bench/ray_startup.py [--quick]
    RESULT ray_startup ray_over_launch=<Ray's wall time / tfpar launch's> ray_seconds=<s>
           launch_seconds=<s>

Ray's time includes starting its local cluster (GCS, raylet, the Train controller, worker
actors); tfpar launch's, starting two Python processes. Both run on 127.0.0.1.
"""

import os
import subprocess
import sys
import textwrap

from common import median_seconds_in_turns, quick_options

LOOP = textwrap.dedent("""
    def train_loop(config=None):
        import tensorflow as tf
        import tfpar
        from tfpar.demo import build_model, load_digits
        strategy = tfpar.DataParallel()
        with strategy.scope():
            model = build_model()
            model.compile("adam", "sparse_categorical_crossentropy")
        (x, y), _ = load_digits()
        train = tfpar.data.distribute(tf.data.Dataset.from_tensor_slices((x, y)), strategy, 64)
        model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=EPOCHS, verbose=0)
""")
LAUNCHED = LOOP + "\ntrain_loop()\n"
RAY = (
    "import os\nos.environ.setdefault('RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER', '0')\n"
    + LOOP
    + textwrap.dedent("""
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    TensorflowTrainer(train_loop, scaling_config=ScalingConfig(num_workers=2),
                      run_config=RunConfig(storage_path="/tmp/tfpar-bench-ray")).fit()
    ray.shutdown()
""")
)


def main():
    args = quick_options(__doc__)
    epochs = 1 if args.quick else 2
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    commands = {
        "launch": [
            sys.executable,
            "-m",
            "tfpar.cli",
            "launch",
            "-n",
            "2",
            "--",
            sys.executable,
            "-c",
            LAUNCHED.replace("EPOCHS", str(epochs)),
        ],
        "ray": [sys.executable, "-c", RAY.replace("EPOCHS", str(epochs))],
    }

    def run(name):
        subprocess.run(
            commands[name],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=600,
        )

    timed = median_seconds_in_turns(("launch", "ray"), 1, run)
    ray_s, launch_s = timed["ray"][0], timed["launch"][0]
    for name, (seconds, runs) in timed.items():
        print(f"{name:>7}: {seconds:6.1f} s (median of {runs})")
    print(
        f"RESULT ray_startup ray_over_launch={ray_s / launch_s:.2f} ray_seconds={ray_s:.1f} "
        f"launch_seconds={launch_s:.1f}"
    )


if __name__ == "__main__":
    main()
