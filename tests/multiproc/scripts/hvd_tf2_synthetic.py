"""A ``horovod.tensorflow`` script as users write them (the shape of Horovod's
tensorflow2_synthetic_benchmark.py: DistributedGradientTape, broadcast_variables, a model from
``tensorflow.keras.applications``), on a small input instead of 224 x 224. Nothing of tfpar is
imported: it runs unchanged under `horovodrun -np 2 -H localhost:2 --gloo python
hvd_tf2_synthetic.py`, on whichever Keras ``tensorflow.keras`` is in this environment.

One line differs from Horovod's file: the optimizer's variables are ``opt.variables`` on Keras 3
(a property) and ``opt.variables()`` on tf_keras (a method); Horovod's file calls the method.
``--out DIR`` makes each rank save its trainable weights there (initial_<r>.npz and rank_<r>.npz)
and the Keras it ran (rank_<r>.json), for the test.
"""

import argparse
import json
import os
import timeit

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from tensorflow.keras import applications

parser = argparse.ArgumentParser(
    description="TensorFlow Synthetic Benchmark",
    formatter_class=argparse.ArgumentDefaultsHelpFormatter,
)
parser.add_argument(
    "--fp16-allreduce",
    action="store_true",
    default=False,
    help="use fp16 compression during allreduce",
)
parser.add_argument("--model", type=str, default="MobileNetV2", help="model to benchmark")
parser.add_argument("--batch-size", type=int, default=8, help="input batch size")
parser.add_argument(
    "--num-warmup-batches",
    type=int,
    default=2,
    help="number of warm-up batches that don't count towards benchmark",
)
parser.add_argument(
    "--num-batches-per-iter", type=int, default=3, help="number of batches per benchmark iteration"
)
parser.add_argument("--num-iters", type=int, default=3, help="number of benchmark iterations")
parser.add_argument("--out", help="folder for rank_<r>.npz and rank_<r>.json")
args = parser.parse_args()

# Horovod: initialize Horovod.
hvd.init()
os.environ["CUDA_VISIBLE_DEVICES"] = "-1"

# Set up standard model (on 32 x 32 images, 10 classes).
# each rank draws its own weights: the broadcast must make them alike
tf.random.set_seed(hvd.rank())
model = getattr(applications, args.model)(weights=None, input_shape=(32, 32, 3), classes=10)
opt = tf.optimizers.SGD(0.01)
if args.out:  # what this rank drew
    np.savez(
        os.path.join(args.out, f"initial_{hvd.rank()}.npz"),
        *[v.numpy() for v in model.trainable_variables],
    )

data = tf.random.uniform([args.batch_size, 32, 32, 3], seed=1)
target = tf.random.uniform([args.batch_size, 1], minval=0, maxval=9, dtype=tf.int64, seed=2)


@tf.function
def benchmark_step(first_batch):
    # Horovod: (optional) compression algorithm.
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

    # Horovod: use DistributedGradientTape
    with tf.GradientTape() as tape:
        probs = model(data, training=True)
        loss = tf.losses.sparse_categorical_crossentropy(target, probs)

    # Horovod: add Horovod Distributed GradientTape.
    tape = hvd.DistributedGradientTape(tape, compression=compression)

    gradients = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(gradients, model.trainable_variables))

    # Horovod: broadcast initial variable states from rank 0 to all other processes, after the
    # first step (so that the optimizer's variables exist).
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(
            opt.variables() if callable(opt.variables) else opt.variables, root_rank=0
        )


def log(s, nl=True):
    if hvd.rank() != 0:
        return
    print(s, end="\n" if nl else "")


log("Model: %s" % args.model)
log("Batch size: %d" % args.batch_size)
log("Number of CPUs: %d" % hvd.size())

with tf.device("CPU"):
    # Warm-up
    log("Running warmup...")
    benchmark_step(first_batch=True)
    timeit.timeit(lambda: benchmark_step(first_batch=False), number=args.num_warmup_batches)

    # Benchmark
    log("Running benchmark...")
    img_secs = []
    for x in range(args.num_iters):
        time = timeit.timeit(
            lambda: benchmark_step(first_batch=False), number=args.num_batches_per_iter
        )
        img_sec = args.batch_size * args.num_batches_per_iter / time
        log("Iter #%d: %.1f img/sec per CPU" % (x, img_sec))
        img_secs.append(img_sec)

    # Results
    img_sec_mean = np.mean(img_secs)
    img_sec_conf = 1.96 * np.std(img_secs)
    log("Img/sec per CPU: %.1f +-%.1f" % (img_sec_mean, img_sec_conf))
    log(
        "Total img/sec on %d CPU(s): %.1f +-%.1f"
        % (hvd.size(), hvd.size() * img_sec_mean, hvd.size() * img_sec_conf)
    )

if args.out:
    # the trainable weights: BatchNormalization's moving statistics follow each rank's own data
    np.savez(
        os.path.join(args.out, f"rank_{hvd.rank()}.npz"),
        *[v.numpy() for v in model.trainable_variables],
    )
    with open(os.path.join(args.out, f"rank_{hvd.rank()}.json"), "w") as f:
        json.dump({"keras": type(model).__module__.split(".")[0]}, f)
