"""One rank of a Horovod benchmark job (run under horovodrun); rank 0 prints ``BENCH {json}``.

Modes:
  strategy  tfpar HorovodStrategy in model.fit, input from tfpar.data
  recipe    the plain Horovod recipe: a tf.function loop with hvd.DistributedGradientTape,
            variables broadcast from rank 0 after the first step, input sharded by rank
  allreduce hvd.allreduce of a float32 tensor of --mib MiB

With --profile, strategy and recipe also report where rank 0's step goes (medians, seconds):
"forward_backward" (the local gradients), "exchange_apply" (Horovod's all-reduce and the
optimizer's update, which both sides run together) and "host" (the rest of the wall step: the
input, Keras' fit loop and callbacks, or the recipe's Python loop). The strategy side reads them
from tfpar's Timeline (exchange=True); the recipe side from tf.timestamp ops in its step, which
then reduces its gradients with hvd.grouped_allreduce itself, as DistributedGradientTape does.
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
parser.add_argument("--profile", action="store_true")
args = parser.parse_args()

import tfpar  # noqa: E402  (sets TF_USE_LEGACY_KERAS before TensorFlow)

# isort: split
import tensorflow as tf  # noqa: E402
from common import bus_bandwidth, make_data, make_model  # noqa: E402

from tfpar.strategies.horovod import HorovodStrategy, import_horovod  # noqa: E402

hvd = import_horovod()
keras = tfpar.keras


def timeline_phases(path, skip):
    """Medians (seconds) of rank 0's forward+backward and exchange+apply spans in a Timeline
    file, its first ``skip`` steps (the traced epoch) left out."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    names = {
        e["tid"]: e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e["name"] == "thread_name" and e["pid"] == 0
    }
    spans = {"forward+backward": [], "exchange+apply": []}
    for e in events:
        if e.get("ph") == "X" and e["pid"] == 0 and names.get(e["tid"]) in spans:
            spans[names[e["tid"]]].append(e["dur"] / 1e6)
    return {
        "forward_backward": statistics.median(spans["forward+backward"][skip:]),
        "exchange_apply": statistics.median(spans["exchange+apply"][skip:]),
    }


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
    callbacks = [tfpar.callbacks.Throughput(global_batch)]
    trace = os.path.join(
        os.environ.get("TMPDIR", "/tmp"), f"tfpar_bench_timeline_{os.getpid()}.json"
    )
    if args.profile:
        callbacks.append(tfpar.callbacks.Timeline(trace, exchange=True))
    history = model.fit(
        train.dataset,
        steps_per_epoch=train.steps_per_epoch,
        epochs=args.epochs,
        verbose=0,
        callbacks=callbacks,
    )
    epoch_times = [t * train.steps_per_epoch for t in history.history["step_time"]]
else:
    keras.utils.set_random_seed(0)
    model = make_model("cnn")
    optimizer = keras.optimizers.SGD(0.01)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    data = iter(source.shard(hvd.size(), hvd.rank()).batch(args.per_worker_batch).repeat())

    def after(tensors):
        """The time once ``tensors`` exist (a timestamp ordered after them)."""
        with tf.control_dependencies(tf.nest.flatten(tensors)):
            return tf.timestamp()

    @tf.function
    def step(xb, yb, first):
        started = tf.timestamp() if args.profile else None
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        if args.profile:  # what DistributedGradientTape does, with the time its gradients exist
            grads = tape.gradient(loss, model.trainable_variables)
            local = after(grads)
            grads = hvd.grouped_allreduce(grads, op=hvd.Average)
        else:  # the recipe as Horovod writes it: nothing added
            grads = hvd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        if first:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(optimizer.variables(), root_rank=0)
        if not args.profile:
            return loss, tf.zeros([3], tf.float64)
        done = after([v.value() for v in model.trainable_variables])
        return loss, tf.stack([started, local, done])

    stamps = []
    for epoch in range(args.epochs):
        start = time.perf_counter()
        for i in range(args.steps):
            xb, yb = next(data)
            loss, times = step(xb, yb, epoch == 0 and i == 0)
            stamps.append(times)
        float(loss)
        epoch_times.append(time.perf_counter() - start)

steps = args.steps
step_seconds = statistics.median(t / steps for t in epoch_times[1:])  # epoch 1 traces
result = {
    "step_seconds": step_seconds,
    "examples_per_second": global_batch / step_seconds,
    "keras": type(model).__module__.split(".")[0],
}
if args.profile and args.mode == "strategy":  # rank 0 writes the job's Timeline
    result["phases"] = timeline_phases(trace, skip=steps) if hvd.rank() == 0 else {}
elif args.profile:
    in_step = [[float(t) for t in s.numpy()] for s in stamps[steps:]]  # epoch 1 traces
    result["phases"] = {
        "forward_backward": statistics.median(b - a for a, b, _ in in_step),
        "exchange_apply": statistics.median(c - b for _, b, c in in_step),
    }
if args.profile and hvd.rank() == 0:
    phases = result["phases"]
    phases["host"] = step_seconds - phases["forward_backward"] - phases["exchange_apply"]
report(result)
