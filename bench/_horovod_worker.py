"""One rank of a Horovod benchmark job (run under horovodrun); rank 0 prints ``BENCH {json}``.

Modes:
  strategy  tfpar HorovodStrategy in model.fit, input from tfpar.data
  recipe    the plain Horovod recipe: a tf.function loop with hvd.DistributedGradientTape,
            variables broadcast from rank 0 after the first step, input sharded by rank
  allreduce hvd.allreduce of a float32 tensor of --mib MiB
"""

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

parser = argparse.ArgumentParser()
parser.add_argument("mode", choices=["strategy", "recipe", "allreduce"])
parser.add_argument("--per-worker-batch", type=int, default=64)
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--mib", type=int, default=64)
parser.add_argument("--iters", type=int, default=5)
args = parser.parse_args()

import tfpar  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfpar.strategies.horovod import HorovodStrategy, import_horovod  # noqa: E402
from common import bus_bandwidth, make_data, make_model  # noqa: E402

hvd = import_horovod()
keras = tfpar.keras


def report(result):
    if hvd.rank() == 0:
        print("BENCH " + json.dumps(result), flush=True)


if args.mode == "allreduce":
    n = args.mib * 2**20 // 4
    value = tf.ones([n], tf.float32)
    times = []
    for i in range(args.iters + 1):
        start = time.perf_counter()
        out = hvd.allreduce(value, op=hvd.Sum, name="bench_allreduce")
        _ = out[:1].numpy()
        if i:
            times.append(time.perf_counter() - start)
    assert float(out[0]) == hvd.size()
    seconds = statistics.median(times)
    size = n * 4
    report({"seconds": seconds, "busbw": bus_bandwidth(size, hvd.size(), seconds)})
    raise SystemExit(0)


global_batch = args.per_worker_batch * hvd.size()
x, y = make_data("cnn", global_batch * args.steps)
source = tf.data.Dataset.from_tensor_slices((x, y))
epoch_times = []

if args.mode == "strategy":
    strategy = HorovodStrategy()
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = make_model("cnn")
        model.compile(keras.optimizers.SGD(0.01), "sparse_categorical_crossentropy")
    train = tfpar.data.distribute(source, strategy, global_batch)

    history = model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=args.epochs, verbose=0,
                        callbacks=[tfpar.callbacks.Throughput(global_batch)])
    epoch_times = [t * train.steps_per_epoch for t in history.history["step_time"]]
else:
    keras.utils.set_random_seed(0)
    model = make_model("cnn")
    optimizer = keras.optimizers.SGD(0.01)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    data = iter(source.shard(hvd.size(), hvd.rank()).batch(args.per_worker_batch).repeat())

    @tf.function
    def step(xb, yb, first):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        if first:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(optimizer.variables(), root_rank=0)
        return loss

    for epoch in range(args.epochs):
        start = time.perf_counter()
        for i in range(args.steps):
            xb, yb = next(data)
            loss = step(xb, yb, epoch == 0 and i == 0)
        float(loss)
        epoch_times.append(time.perf_counter() - start)

steps = args.steps
step_seconds = statistics.median(t / steps for t in epoch_times[1:])  # epoch 1 traces
report({"step_seconds": step_seconds, "examples_per_second": global_batch / step_seconds})
