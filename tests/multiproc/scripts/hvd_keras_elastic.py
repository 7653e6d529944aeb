"""Horovod's elastic Keras example as users write it (the shape of Horovod's
examples/elastic/tensorflow2/tensorflow2_keras_mnist_elastic.py: hvd.elastic.KerasState, its reset
callback, the three state callbacks, @hvd.elastic.run), on generated images instead of MNIST.
Nothing of tfpar is imported: it runs unchanged under
`horovodrun -np 2 --min-np 1 --max-np 2 --host-discovery-script DISCOVER python hvd_keras_elastic.py
HOSTS OUT`.

With --tfpar-data, the example with tfpar's input, as the Horovod guide says to change it: the
examples go to tfpar.integrations.horovod.ElasticInput (a global batch of 32 over whatever ranks
there are, shuffled with a seed), whose callback replaces Horovod's UpdateEpochStateCallback and
UpdateBatchStateCallback; the optimizer's slots are built instead of trained for one step, so that
no example trains outside the epochs; a commit every 3 batches, so that a rollback discards trained
steps. Each image carries its id (1 to 320, padding rows 0) in a first feature that the model's
first layer records and drops: every process appends {"epoch", "step", "ids", "time"} for each step
it trains (the step's place in the epoch, read from the state before it) and {"reset": [epoch,
batch], "time"} at each reset to OUT/pid<PID>.jsonl.

For the test, one callback plays the faults: with 2 ranks, in epoch 3 at batch 5, rank 1 takes its
host (HOROVOD_HOSTNAME) out of HOSTS (the discovery script prints it) and SIGKILLs itself; with 1
rank, in epoch 5, rank 0 puts that host back and waits until Horovod's driver has told it (it looks
every second). Each reset prints "RESET size N epoch E batch B" (the state it rolled back to), each
rank its last "DONE ..." line, and OUT/rank<R>-size<N>.json gets the epochs each (rank, size) ran.
"""

import json
import os
import signal
import sys
import time

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

hosts_file, out = sys.argv[1], sys.argv[2]
TFPAR = "--tfpar-data" in sys.argv
EPOCHS = 6 if TFPAR else 8

# Horovod: initialize Horovod.
hvd.init()

# Horovod: pin GPU to be used to process local rank (one GPU per process)
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

n = 320 if TFPAR else 1024
rng = np.random.default_rng(0)
images = rng.random((n, 8, 8, 1)).astype("float32")
labels = (images.reshape(n, -1).sum(1) > 32).astype("int64")
dataset = tf.data.Dataset.from_tensor_slices((images, labels)).repeat().shuffle(1024).batch(32)
where = {"epoch": -1, "step": -1}  # the step being trained (tfpar's mode); -1: none of the epochs'
log = open(os.path.join(out, f"pid{os.getpid()}.jsonl"), "a", encoding="utf-8")


def record(ids):
    if where["epoch"] >= 0:
        log.write(
            json.dumps(
                {**where, "ids": [int(i) for i in ids.numpy() if i > 0], "time": time.time()}
            )
            + "\n"
        )
        log.flush()
    return np.int32(0)


class Record(tf.keras.layers.Layer):
    """Records the ids of the batch it trains on (the first feature); passes the image on."""

    def call(self, x, training=None):
        image = tf.reshape(x[:, 1:], [-1, 8, 8, 1])
        if training:
            done = tf.py_function(record, [x[:, 0]], tf.int32)
            with tf.control_dependencies([done]):
                return tf.identity(image)
        return image


model = tf.keras.Sequential(
    [
        *([tf.keras.layers.Input((65,)), Record()] if TFPAR else []),
        tf.keras.layers.Conv2D(8, [3, 3], activation="relu"),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(2, activation="softmax"),
    ]
)

# Horovod: adjust learning rate based on number of GPUs.
scaled_lr = 0.001 * hvd.size()
opt = tf.optimizers.Adam(scaled_lr)

# Horovod: add Horovod DistributedOptimizer.
opt = hvd.DistributedOptimizer(opt, backward_passes_per_step=1, average_aggregated_gradients=True)

model.compile(
    loss=tf.losses.SparseCategoricalCrossentropy(),
    optimizer=opt,
    metrics=["accuracy"],
    experimental_run_tf_function=False,
)

# Horovod: initialize optimizer state so we can synchronize across workers
if TFPAR:
    model.optimizer.build(model.trainable_variables)
else:
    model.fit(dataset, steps_per_epoch=1, epochs=1, callbacks=None)

state = hvd.elastic.KerasState(model, batch=0, epoch=0)

if TFPAR:
    import tfpar

    ids = np.arange(1, n + 1, dtype="float32")[:, None]
    examples = tf.data.Dataset.from_tensor_slices(
        (np.concatenate([ids, images.reshape(n, -1)], 1), labels)
    )
    train_input = tfpar.integrations.horovod.ElasticInput(
        examples, state, global_batch_size=32, shuffle_buffer=n, seed=0
    )


def on_state_reset():
    print(f"RESET size {hvd.size()} epoch {state.epoch} batch {state.batch}", flush=True)
    log.write(json.dumps({"reset": [state.epoch, state.batch], "time": time.time()}) + "\n")
    log.flush()
    tf.keras.backend.set_value(state.model.optimizer.lr, 0.001 * hvd.size())
    # Re-initialize, to join with possible new ranks
    if not TFPAR:
        state.model.fit(dataset, steps_per_epoch=1, epochs=1, callbacks=None)


state.register_reset_callbacks([on_state_reset])


class Faults(tf.keras.callbacks.Callback):
    """The test's faults, what each (rank, size) ran, and (tfpar's mode) the step being trained."""

    def on_epoch_begin(self, epoch, logs=None):
        path = os.path.join(out, f"rank{hvd.rank()}-size{hvd.size()}.json")
        ran = json.load(open(path)) if os.path.exists(path) else []
        json.dump(ran + [state.epoch], open(path, "w"))

    def on_train_batch_begin(self, batch, logs=None):
        where.update(epoch=int(state.epoch), step=int(state.batch))
        if hvd.size() == 2 and hvd.rank() == 1 and state.epoch == 2 and batch == 5:
            mine = os.environ["HOROVOD_HOSTNAME"]
            with open(hosts_file, "w") as f:  # its host leaves discovery, and it dies
                f.write(
                    "".join(
                        line
                        for line in ("localhost:1\n", "127.0.0.1:1\n")
                        if not line.startswith(mine + ":")
                    )
                )
            os.kill(os.getpid(), signal.SIGKILL)
        if (
            hvd.size() == 1
            and state.epoch == 4
            and batch == 0
            and not os.path.exists(os.path.join(out, "added"))
        ):
            with open(hosts_file, "w") as f:  # the host is added again
                f.write("localhost:1\n127.0.0.1:1\n")
            open(os.path.join(out, "added"), "w").close()
            # Training goes on once Horovod's driver has told this rank (it looks every second), so
            # that the next commit grows the job (the new rank then starts TensorFlow).
            deadline = time.monotonic() + 60
            while state._host_messages.empty() and time.monotonic() < deadline:
                time.sleep(0.05)

    def on_train_batch_end(self, batch, logs=None):
        where.update(epoch=-1, step=-1)


if TFPAR:
    callbacks = [
        train_input.callback(),
        hvd.elastic.CommitStateCallback(state, batches_per_commit=3),
        Faults(),
    ]
else:
    callbacks = [
        hvd.elastic.UpdateEpochStateCallback(state),
        hvd.elastic.UpdateBatchStateCallback(state),
        hvd.elastic.CommitStateCallback(state),
        Faults(),
    ]


@hvd.elastic.run
def train(state):
    if TFPAR:
        state.model.fit(
            train_input.dataset(),
            steps_per_epoch=train_input.steps_per_epoch,
            epochs=EPOCHS - state.epoch,
            callbacks=callbacks,
            verbose=0,
        )
    else:
        state.model.fit(
            dataset,
            steps_per_epoch=20 // hvd.size(),
            epochs=EPOCHS - state.epoch,
            callbacks=callbacks,
            verbose=0,
        )


train(state)
print(f"DONE rank {hvd.rank()} size {hvd.size()} epoch {state.epoch}", flush=True)
