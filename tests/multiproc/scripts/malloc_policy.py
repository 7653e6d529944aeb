"""What a strategy's input pipeline does to glibc's allocation policy, in a fresh process: the page
faults per step of a conv net's ``fit`` on one device, first under bare MirroredStrategy, then
under tfpar's DataParallel (run with TF_ENABLE_ONEDNN_OPTS=0: TensorFlow's Eigen kernels, as on a
CPU without AVX-512 VNNI). Prints one JSON line."""

import json
import resource

import tensorflow as tf

import tfpar
from tfpar import _compat

keras = tfpar.keras
STEPS = 20


def faults_per_step(strategy):
    """Minor page faults per step of ``fit`` under ``strategy``, in its steady state: the fewest of
    epochs 2 to 4 (under a loaded machine's scheduling, a worker thread that first runs a kernel in
    a later epoch still grows its heap then: measured up to 4,600 a step in one epoch, against
    250-650 in the others)."""
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.layers.Input((16, 16, 1)),
                keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
                keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
                keras.layers.GlobalAveragePooling2D(),
                keras.layers.Dense(10),
            ]
        )
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    images = tf.random.stateless_normal([64 * STEPS, 16, 16, 1], seed=[0, 1])
    labels = tf.random.stateless_uniform([64 * STEPS], [0, 1], maxval=10, dtype=tf.int32)
    data = tf.data.Dataset.from_tensor_slices((images, labels)).batch(64)
    counts = []

    class Faults(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt

        def on_epoch_end(self, epoch, logs=None):
            counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - self.start)

    model.fit(data, epochs=4, verbose=0, callbacks=[Faults()])
    return min(counts[1:]) / STEPS


tfpar.configure_devices(1)
result = {"onednn": _compat.onednn_enabled()}
result["mirrored_faults_per_step"] = faults_per_step(tf.distribute.MirroredStrategy(["CPU:0"]))
result["tfpar_faults_per_step"] = faults_per_step(tfpar.DataParallel())
print(json.dumps(result), flush=True)
