"""A Horovod Keras script as users write them (the shape of Horovod's
tensorflow2_keras_synthetic_benchmark.py: ``from tensorflow.keras import applications`` after
``import horovod.tensorflow.keras``), with a small CNN instead of ResNet50 (tracing an
application model costs a minute here; test_horovod_scripts.py runs one). Nothing of tfpar is
imported: it must run unchanged under
`horovodrun -np 2 -H localhost:2 --gloo python hvd_keras_synthetic.py [options]`.

``--out DIR`` makes each rank save its weights there, for the test.
"""

import argparse
import os
from timeit import default_timer as timer

import horovod.tensorflow.keras as hvd
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
parser.add_argument(
    "--backward-passes-per-step",
    type=int,
    default=1,
    help="accumulate this many batches' gradients locally before each all-reduce",
)
parser.add_argument("--batch-size", type=int, default=16, help="input batch size")
parser.add_argument(
    "--num-batches-per-iter", type=int, default=4, help="number of batches per benchmark iteration"
)
parser.add_argument("--num-iters", type=int, default=3, help="number of benchmark iterations")
parser.add_argument("--out", help="folder for rank_<r>.npz")
args = parser.parse_args()
device = "CPU"

# Horovod: initialize Horovod.
hvd.init()

if hvd.rank() == 0:
    print("Model: small CNN")
    print("Batch size: %d" % args.batch_size)
    print("Number of %ss: %d" % (device, hvd.size()))

# Set up a small model (the original: getattr(applications, args.model)(weights=None)).
tf.random.set_seed(hvd.rank())
model = tf.keras.Sequential(
    [
        tf.keras.layers.Conv2D(8, 3, activation="relu", input_shape=(32, 32, 3)),
        tf.keras.layers.GlobalAveragePooling2D(),
        tf.keras.layers.Dense(100),
    ]
)
opt = tf.optimizers.SGD(0.01)
if hvd.rank() == 0:
    print(
        "Keras of the model: %s, of applications: %s"
        % (type(model).__module__.split(".")[0], applications.__name__.split(".")[0])
    )

# Synthetic dataset
data = tf.random.uniform([args.batch_size, 32, 32, 3], seed=1)
target = tf.random.uniform([args.batch_size, 1], minval=0, maxval=99, dtype=tf.int64, seed=2)
dataset = tf.data.Dataset.from_tensor_slices((data, target)).cache().repeat().batch(args.batch_size)

# Horovod: (optional) compression algorithm.
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

# Horovod: add Horovod DistributedOptimizer.
opt = hvd.DistributedOptimizer(
    opt, compression=compression, backward_passes_per_step=args.backward_passes_per_step
)

# Horovod: Specify `experimental_run_tf_function=False` to ensure TensorFlow
# uses hvd.DistributedOptimizer() to compute gradients.
model.compile(
    loss=tf.losses.SparseCategoricalCrossentropy(from_logits=True),
    optimizer=opt,
    experimental_run_tf_function=False,
)

callbacks = [
    # Horovod: broadcast initial variable states from rank 0 to all other processes.
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    # Horovod: average metrics among workers at the end of every epoch.
    hvd.callbacks.MetricAverageCallback(),
]


class TimingCallback(tf.keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.img_secs = []

    def on_train_end(self, logs=None):
        img_sec_mean = np.mean(self.img_secs)
        img_sec_conf = 1.96 * np.std(self.img_secs)
        print("Img/sec per %s: %.1f +-%.1f" % (device, img_sec_mean, img_sec_conf))
        print(
            "Total img/sec on %d %s(s): %.1f +-%.1f"
            % (hvd.size(), device, hvd.size() * img_sec_mean, hvd.size() * img_sec_conf)
        )

    def on_epoch_begin(self, epoch, logs=None):
        self.starttime = timer()

    def on_epoch_end(self, epoch, logs=None):
        time = timer() - self.starttime
        img_sec = args.batch_size * args.num_batches_per_iter / time
        print("Iter #%d: %.1f img/sec per %s, loss %.4f" % (epoch, img_sec, device, logs["loss"]))
        # skip warm up epoch
        if epoch > 0:
            self.img_secs.append(img_sec)


# Horovod: write logs on worker 0.
if hvd.rank() == 0:
    callbacks.append(TimingCallback())

# Train the model.
model.fit(
    dataset,
    steps_per_epoch=args.num_batches_per_iter,
    callbacks=callbacks,
    epochs=args.num_iters,
    verbose=0,
)
if args.out:
    np.savez(os.path.join(args.out, f"rank_{hvd.rank()}.npz"), *model.get_weights())
