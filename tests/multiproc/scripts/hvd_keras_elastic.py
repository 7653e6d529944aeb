"""Horovod's elastic Keras example as users write it (the shape of Horovod's
examples/elastic/tensorflow2/tensorflow2_keras_mnist_elastic.py: hvd.elastic.KerasState, its reset
callback, the three state callbacks, @hvd.elastic.run), on generated images instead of MNIST. Nothing
of tfpar is imported: it runs unchanged under
`horovodrun -np 2 --min-np 1 --max-np 2 --host-discovery-script DISCOVER python hvd_keras_elastic.py HOSTS OUT`.

For the test, one callback plays the faults: with 2 ranks, in epoch 3 at batch 5, rank 1 takes its host
(HOROVOD_HOSTNAME) out of HOSTS (the discovery script prints it) and SIGKILLs itself; with 1 rank, in
epoch 5, rank 0 puts that host back and waits 10 s (Horovod's driver looks every second, the new rank
starts TensorFlow). Each reset prints "RESET size N epoch E batch B" (the state it rolled back to), each rank
its last "DONE ..." line, and OUT/rank<R>-size<N>.json gets the epochs each (rank, size) ran.
"""

import json
import os
import signal
import sys
import time

import numpy as np
import tensorflow as tf

import horovod.tensorflow.keras as hvd

hosts_file, out = sys.argv[1], sys.argv[2]

# Horovod: initialize Horovod.
hvd.init()

# Horovod: pin GPU to be used to process local rank (one GPU per process)
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

rng = np.random.default_rng(0)
images = rng.random((1024, 8, 8, 1)).astype("float32")
labels = (images.reshape(1024, -1).sum(1) > 32).astype("int64")
dataset = tf.data.Dataset.from_tensor_slices((images, labels)).repeat().shuffle(1024).batch(32)

model = tf.keras.Sequential([
    tf.keras.layers.Conv2D(8, [3, 3], activation="relu"),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(2, activation="softmax"),
])

# Horovod: adjust learning rate based on number of GPUs.
scaled_lr = 0.001 * hvd.size()
opt = tf.optimizers.Adam(scaled_lr)

# Horovod: add Horovod DistributedOptimizer.
opt = hvd.DistributedOptimizer(opt, backward_passes_per_step=1, average_aggregated_gradients=True)

model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=opt, metrics=["accuracy"],
              experimental_run_tf_function=False)

# Horovod: initialize optimizer state so we can synchronize across workers
model.fit(dataset, steps_per_epoch=1, epochs=1, callbacks=None)

state = hvd.elastic.KerasState(model, batch=0, epoch=0)


def on_state_reset():
    print(f"RESET size {hvd.size()} epoch {state.epoch} batch {state.batch}", flush=True)
    tf.keras.backend.set_value(state.model.optimizer.lr, 0.001 * hvd.size())
    # Re-initialize, to join with possible new ranks
    state.model.fit(dataset, steps_per_epoch=1, epochs=1, callbacks=None)


state.register_reset_callbacks([on_state_reset])


class Faults(tf.keras.callbacks.Callback):
    """The test's faults, and what each (rank, size) ran."""

    def on_epoch_begin(self, epoch, logs=None):
        path = os.path.join(out, f"rank{hvd.rank()}-size{hvd.size()}.json")
        ran = json.load(open(path)) if os.path.exists(path) else []
        json.dump(ran + [state.epoch], open(path, "w"))

    def on_train_batch_begin(self, batch, logs=None):
        if hvd.size() == 2 and hvd.rank() == 1 and state.epoch == 2 and batch == 5:
            mine = os.environ["HOROVOD_HOSTNAME"]
            with open(hosts_file, "w") as f:  # its host leaves discovery, and it dies
                f.write("".join(line for line in ("localhost:1\n", "127.0.0.1:1\n") if not line.startswith(mine + ":")))
            os.kill(os.getpid(), signal.SIGKILL)
        if hvd.size() == 1 and state.epoch == 4 and batch == 0 and not os.path.exists(os.path.join(out, "added")):
            with open(hosts_file, "w") as f:  # the host is added again
                f.write("localhost:1\n127.0.0.1:1\n")
            open(os.path.join(out, "added"), "w").close()
            time.sleep(10)  # Horovod's driver looks every second; the new rank starts TensorFlow


callbacks = [
    hvd.elastic.UpdateEpochStateCallback(state),
    hvd.elastic.UpdateBatchStateCallback(state),
    hvd.elastic.CommitStateCallback(state),
    Faults(),
]


@hvd.elastic.run
def train(state):
    state.model.fit(dataset, steps_per_epoch=20 // hvd.size(), epochs=8 - state.epoch, callbacks=callbacks,
                    verbose=0)


train(state)
print(f"DONE rank {hvd.rank()} size {hvd.size()} epoch {state.epoch}", flush=True)
