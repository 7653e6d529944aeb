"""One process of a data-parallel benchmark job; prints ``BENCH {json}`` on worker 0.

Modes:
  tfpar     tfpar.DataParallel + tfpar.data.distribute, timed in fit (--compression: its
            gradients' on the wire)
  bare      tf.distribute.MultiWorkerMirroredStrategy from TF_CONFIG, same
            communication options, the plain Keras input recipe, timed in fit
  allreduce all-reduce of a float32 tensor of --mib MiB with tfpar.DataParallel
"""

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

parser = argparse.ArgumentParser()
parser.add_argument("mode", choices=["tfpar", "bare", "allreduce"])
parser.add_argument("--model", choices=["cnn", "mlp"], default="cnn")
parser.add_argument("--per-worker-batch", type=int, default=64)
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--mib", type=int, default=64)
parser.add_argument("--iters", type=int, default=5)
parser.add_argument("--compression", choices=["none", "bf16", "fp16"], default="none")
parser.add_argument("--bytes-per-pack", type=int, default=0)
args = parser.parse_args()

import tfpar  # noqa: E402  (sets TF_USE_LEGACY_KERAS before TensorFlow)

# isort: split
import tensorflow as tf  # noqa: E402

TIMEOUT = 300.0
if args.mode == "bare":
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING,
            timeout_seconds=TIMEOUT,
        )
    )
else:
    strategy = tfpar.DataParallel(
        all_reduce="auto",
        timeout_seconds=TIMEOUT,
        compression=args.compression,
        bytes_per_pack=args.bytes_per_pack,
    )


from common import bus_bandwidth, make_data, make_model  # noqa: E402

cluster = tfpar.ClusterInfo.from_tf_config()
workers = cluster.num_workers if cluster else 1
is_chief = cluster is None or cluster.is_chief


def report(result):
    if is_chief:
        print("BENCH " + json.dumps(result), flush=True)


if args.mode == "allreduce":
    n = args.mib * 2**20 // 4
    value = tf.ones([n], tf.float32)

    @tf.function
    def reduce():
        ctx = tf.distribute.get_replica_context()
        return ctx.all_reduce(tf.distribute.ReduceOp.SUM, value)

    times = []
    for i in range(args.iters + 1):
        start = time.perf_counter()
        out = strategy.experimental_local_results(strategy.run(reduce))
        _ = out[0][:1].numpy()
        if i:  # the first call traces and sets the ring up
            times.append(time.perf_counter() - start)
    assert float(out[0][0]) == strategy.num_replicas_in_sync
    seconds = statistics.median(times)
    size = n * 4
    report(
        {
            "seconds": seconds,
            "busbw": bus_bandwidth(size, workers, seconds),
            "bytes": size,
            "workers": workers,
        }
    )
    raise SystemExit(0)

keras = tfpar.keras
global_batch = args.per_worker_batch * strategy.num_replicas_in_sync
x, y = make_data(args.model, global_batch * args.steps)
with strategy.scope():
    keras.utils.set_random_seed(0)
    model = make_model(args.model)
    model.compile(keras.optimizers.SGD(0.01), "sparse_categorical_crossentropy")
source = tf.data.Dataset.from_tensor_slices((x, y))
if args.mode == "tfpar":
    train = tfpar.data.distribute(source, strategy, global_batch)
    data, steps = train.dataset, train.steps_per_epoch
else:  # the recipe of the TensorFlow tutorial: global batch, auto-sharding by the strategy
    data, steps = source.batch(global_batch).repeat(), args.steps


history = model.fit(
    data,
    steps_per_epoch=steps,
    epochs=args.epochs,
    verbose=0,
    callbacks=[tfpar.callbacks.Throughput(global_batch)],
)
step_times = history.history["step_time"][1:]  # epoch 1 traces
step = statistics.median(step_times)
report(
    {
        "step_seconds": step,
        "examples_per_second": global_batch / step,
        "workers": workers,
        "replicas": strategy.num_replicas_in_sync,
        "params": model.count_params(),
    }
)
