"""One side of the pipeline benchmark; prints ``BENCH {json}`` with seconds per step.

baseline  one compute unit (1 intra-op, 1 inter-op thread): the plain model, a
          1-stage pipeline with 1 microbatch, and with 8 microbatches
pipeline  two compute units (1 intra-op thread per op, 2 inter-op threads, 2
          virtual CPU devices): the 2-stage pipeline under each schedule (1F1B, GPipe,
          interleaved with 2 chunks per stage, ZB-H1), with its measured bubble
"""

import argparse
import json
import os
import statistics

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
parser = argparse.ArgumentParser()
parser.add_argument("mode", choices=["baseline", "pipeline"])
parser.add_argument("--width", type=int, default=2048)
parser.add_argument("--depth", type=int, default=8)
parser.add_argument("--batch", type=int, default=512)
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfpar  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1 if args.mode == "baseline" else 2)
tfpar.configure_devices(2)

from tfpar.pipeline import Pipeline  # noqa: E402

keras = tfpar.keras
STAGES, MICROBATCHES = 2, 8


def build():
    keras.utils.set_random_seed(0)
    layers = [keras.layers.Input((args.width,))]
    layers += [keras.layers.Dense(args.width, activation="relu") for _ in range(args.depth)]
    return keras.Sequential(layers + [keras.layers.Dense(10)])


rng = np.random.default_rng(0)
x = rng.normal(size=(args.batch * args.steps, args.width)).astype("float32")
y = rng.integers(0, 10, size=args.batch * args.steps)
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch, drop_remainder=True).repeat()
if args.mode == "baseline":
    variants = {
        "plain": build(),
        "1 stage x 1": Pipeline(num_stages=1, num_microbatches=1).stage(build()),
        "1 stage x 8": Pipeline(num_stages=1, num_microbatches=MICROBATCHES).stage(build()),
    }
else:
    variants = {
        "2 stages x 8" + ("" if schedule == "1f1b" else f" {schedule}"): Pipeline(
            num_stages=STAGES, num_microbatches=MICROBATCHES, schedule=schedule, balance="time"
        ).stage(build())
        for schedule in ("1f1b", "gpipe", "interleaved", "zb-h1")
    }
    print(variants["2 stages x 8"].partition.describe(), flush=True)
report = {}
for name, model in variants.items():
    model.compile(
        keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    callbacks = [tfpar.callbacks.Throughput(args.batch)]
    callbacks += [tfpar.callbacks.PipelineBubble()] if args.mode == "pipeline" else []
    history = model.fit(
        dataset, steps_per_epoch=args.steps, epochs=args.epochs + 1, verbose=0, callbacks=callbacks
    )
    report[name] = statistics.median(history.history["step_time"][1:])  # the first epoch traces
    if args.mode == "pipeline":
        report[f"bubble {name}"] = statistics.median(history.history["bubble"][1:])
        report[f"bubble_theory {name}"] = history.history["bubble_theory"][-1]
print("BENCH " + json.dumps(report), flush=True)
