"""A Horovod Keras script as users write them (the shape of Horovod's tensorflow2_keras_mnist.py),
on the UCI digits instead of MNIST, read from a local .npz as the example reads Keras' mnist.npz
(the file tfpar's demo ships: tfpar.demo.DIGITS_FILE). Nothing of tfpar is imported: it must run
unchanged under `horovodrun -np 2 -H localhost:2 --gloo python hvd_keras_digits.py OUT EPOCHS
DIGITS_NPZ`.

Besides training it records, for the test: each rank's weights before and after `fit`, its own
metrics at each epoch's end before and after MetricAverageCallback, and the learning rate at
every batch; rank 0 writes checkpoints into OUT, as Horovod's example does.
"""

import json
import os
import sys

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf


class Record(tf.keras.callbacks.Callback):
    """Copies the epoch-end logs (where it stands in the list decides: local or averaged)."""

    def __init__(self):
        super().__init__()
        self.epochs = []

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append({key: float(value) for key, value in (logs or {}).items()})


class RecordLearningRate(tf.keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.rates = []

    def on_train_batch_begin(self, batch, logs=None):
        self.rates.append(float(tf.keras.backend.get_value(self.model.optimizer.lr)))


def train(out, epochs, digits_file):
    # Horovod: initialize Horovod.
    hvd.init()
    with np.load(digits_file) as digits:
        images = (digits["images"][..., np.newaxis] / 16.0).astype("float32")
        labels = digits["target"].astype("int64")
    dataset = tf.data.Dataset.from_tensor_slices((images, labels))
    dataset = (
        dataset.shard(hvd.size(), hvd.rank()).repeat().shuffle(1000, seed=hvd.rank()).batch(32)
    )

    tf.random.set_seed(100 + hvd.rank())  # each rank starts elsewhere: the broadcast must fix it
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Conv2D(8, [3, 3], activation="relu", input_shape=(8, 8, 1)),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(32, activation="relu"),
            tf.keras.layers.Dense(10, activation="softmax"),
        ]
    )
    initial = model.get_weights()

    # Horovod: adjust learning rate based on number of workers.
    scaled_lr = 0.002 * hvd.size()
    opt = tf.optimizers.Adam(scaled_lr)
    # Horovod: add Horovod DistributedOptimizer.
    opt = hvd.DistributedOptimizer(
        opt, backward_passes_per_step=1, average_aggregated_gradients=True
    )
    # Horovod: `experimental_run_tf_function=False` so that TensorFlow uses
    # hvd.DistributedOptimizer().
    model.compile(
        loss=tf.losses.SparseCategoricalCrossentropy(),
        optimizer=opt,
        metrics=["accuracy"],
        experimental_run_tf_function=False,
    )

    local, averaged, rates = Record(), Record(), RecordLearningRate()
    callbacks = [
        # Horovod: broadcast initial variable states from rank 0 to all other processes.
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        local,
        # Horovod: average metrics among workers at the end of every epoch.
        hvd.callbacks.MetricAverageCallback(),
        averaged,
        # Horovod: scale the learning rate from scaled_lr / size to scaled_lr over 2 epochs.
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=2, verbose=1),
        # Horovod: then half the rate from the third epoch on.
        hvd.callbacks.LearningRateScheduleCallback(
            initial_lr=scaled_lr, multiplier=lambda epoch: 0.5, start_epoch=2
        ),
        rates,
    ]
    # Horovod: save checkpoints only on worker 0 to prevent other workers from corrupting them.
    if hvd.rank() == 0:
        callbacks.append(
            tf.keras.callbacks.ModelCheckpoint(os.path.join(out, "checkpoint-{epoch}.h5"))
        )
    # Horovod: write logs on worker 0.
    verbose = 1 if hvd.rank() == 0 else 0
    steps_per_epoch = 60 // hvd.size()
    model.fit(
        dataset,
        steps_per_epoch=steps_per_epoch,
        callbacks=callbacks,
        epochs=epochs,
        verbose=verbose,
    )

    np.savez(os.path.join(out, f"rank_{hvd.rank()}.npz"), *model.get_weights())
    np.savez(os.path.join(out, f"initial_{hvd.rank()}.npz"), *initial)
    with open(os.path.join(out, f"rank_{hvd.rank()}.json"), "w") as f:
        json.dump(
            {
                "local": local.epochs,
                "averaged": averaged.epochs,
                "lr": rates.rates,
                "size": hvd.size(),
                "steps_per_epoch": steps_per_epoch,
                "initial_lr": scaled_lr,
                "keras": type(model).__module__.split(".")[0],
            },
            f,
        )


if __name__ == "__main__":
    train(sys.argv[1], int(sys.argv[2]), sys.argv[3])
