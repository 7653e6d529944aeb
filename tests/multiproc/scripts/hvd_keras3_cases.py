"""Two cases of Horovod's own test suite (test/parallel/test_tensorflow.py) that fail there on
Keras 3, written as a ``horovod.tensorflow`` user writes them: tf.keras layers and variables, with
nothing of tfpar imported and nothing set (so tf.keras is Keras 3 unless TF_USE_LEGACY_KERAS=1).
Run under `horovodrun -np 2 -H localhost:2 --gloo`; each rank prints ``CASE <name> <rank> <json>``.

- syncbn: SyncBatchNormalization on each rank's slice of a batch equals BatchNormalization on the
  whole batch, outputs and moving statistics (test_horovod_syncbn_cpu);
- partial-tape: PartialDistributedGradientTape averages the shared layer's gradients over the ranks
  and leaves the local layer's alone, scaled by 1 / size (test_partial_distributed_gradient_tape);
- model-parallel: a hidden layer split by units over the ranks (each rank's part a local layer),
  its activations allgathered, a shared output layer; one SGD step through
  PartialDistributedGradientTape equals that step of the whole model in one process (the pattern
  of test_model_parallel_model);
- optimizer: ``hvd.DistributedOptimizer`` (horovod.tensorflow's) over a Keras 3 SGD in
  ``model.fit``, each rank on its half of the batch: equal to one process on the whole batch.
"""

import json

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

hvd.init()
rank, size = hvd.rank(), hvd.size()


def report(name, **values):
    print(f"CASE {name} {rank} {json.dumps(values)}", flush=True)


# syncbn: the rows of every rank, stacked; this rank normalizes its own row.
for channels in (2, 1):
    # (size, 4, channels)
    x = tf.convert_to_tensor(
        np.stack(
            [
                np.array([[r + c, r * 2 + c, r * 3 + c, r * 4 + c] for c in range(channels)]).T
                for r in range(size)
            ]
        ),
        np.float32,
    )
    bn = tf.keras.layers.BatchNormalization(axis=1)
    sync_bn = hvd.SyncBatchNormalization(axis=1)
    whole = bn(x, training=True).numpy()
    mine = sync_bn(tf.expand_dims(x[rank], 0), training=True).numpy()
    report(
        "syncbn",
        keras=type(bn).__module__.split(".")[0],
        channels=channels,
        output=float(np.abs(mine - whole[rank : rank + 1]).max()),
        moving_mean=float(
            np.abs(np.asarray(sync_bn.moving_mean) - np.asarray(bn.moving_mean)).max()
        ),
        moving_variance=float(
            np.abs(np.asarray(sync_bn.moving_variance) - np.asarray(bn.moving_variance)).max()
        ),
    )

# partial-tape: a shared Dense and a local one, each rank with its own input.
tf.random.set_seed(0)  # the same weights on every rank
inputs = tf.keras.Input((3,))
shared = tf.keras.layers.Dense(4, name="shared")
local = tf.keras.layers.Dense(2, name="local")
model = tf.keras.Model(inputs, local(shared(inputs)))
x = tf.fill((2, 3), float(rank + 1))


def loss():
    return tf.reduce_sum(model(x) ** 2)


with tf.GradientTape() as plain:
    value = loss()
own = plain.gradient(value, model.trainable_variables)
with tf.GradientTape() as tape:
    value = loss()
tape = hvd.PartialDistributedGradientTape(tape, local_layers=[local])
reduced = tape.gradient(value, model.trainable_variables)
every = [hvd.allgather(tf.expand_dims(g, 0)).numpy() for g in own]  # each gradient, from every rank
errors = {}
for variable, g, gathered in zip(model.trainable_variables, reduced, every):
    is_local = any(variable is w for w in local.trainable_weights)
    expected = gathered[rank] / size if is_local else gathered.mean(0)
    errors[variable.path if hasattr(variable, "path") else variable.name] = (
        is_local,
        float(np.abs(g.numpy() - expected).max()),
    )
report(
    "partial-tape",
    keras=type(model).__module__.split(".")[0],
    errors=errors,
    local_differs=bool(np.abs(every[-1][0] - every[-1][1]).max() > 0),
)


# model-parallel: the whole model, then rank r's half of its hidden units as a local layer.
tf.keras.utils.set_random_seed(1)  # the same whole model and data on every rank
x = tf.random.normal((8, 4))
y = tf.random.normal((8, 1))
hidden_whole, out_whole = tf.keras.layers.Dense(4, activation="relu"), tf.keras.layers.Dense(1)
whole = tf.keras.Sequential([tf.keras.Input((4,)), hidden_whole, out_whole])
kernel, bias = (np.asarray(w) for w in hidden_whole.get_weights())
part = tf.keras.layers.Dense(2, activation="relu", name="part")
part.build((None, 4))
part.set_weights([kernel[:, 2 * rank : 2 * rank + 2], bias[2 * rank : 2 * rank + 2]])
out = tf.keras.layers.Dense(1, name="out")
out.build((None, 4))
out.set_weights(out_whole.get_weights())


def split_forward(x):
    units = hvd.allgather(tf.transpose(part(x)))  # (4, batch): rank 0's units, then rank 1's
    return out(tf.transpose(units))


for forward, variables, distributed in (
    (whole, whole.trainable_variables, False),
    (split_forward, part.trainable_variables + out.trainable_variables, True),
):
    with tf.GradientTape() as tape:
        value = tf.reduce_mean((forward(x) - y) ** 2)
    if distributed:
        tape = hvd.PartialDistributedGradientTape(
            tape, local_layers=[part], scale_local_gradients=False
        )
    tf.keras.optimizers.SGD(0.1).apply_gradients(zip(tape.gradient(value, variables), variables))
kernel, bias = (np.asarray(w) for w in hidden_whole.get_weights())
expected = [
    kernel[:, 2 * rank : 2 * rank + 2],
    bias[2 * rank : 2 * rank + 2],
    *out_whole.get_weights(),
]
report(
    "model-parallel",
    keras=type(part).__module__.split(".")[0],
    error=float(
        max(
            np.abs(np.asarray(a) - np.asarray(b)).max()
            for a, b in zip(part.get_weights() + out.get_weights(), expected)
        )
    ),
    output=float(np.abs(split_forward(x).numpy() - whole(x).numpy()).max()),
)

# optimizer: DistributedOptimizer over Keras 3's SGD in fit, each rank on half of the batch.
tf.random.set_seed(2)
x = tf.random.normal((8, 3))
y = tf.random.normal((8, 1))
models = []
for optimizer in (
    tf.keras.optimizers.SGD(0.1),
    hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1)),
):
    tf.keras.utils.set_random_seed(3)  # the same weights in both models, on both ranks
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer, "mse")
    models.append(model)
# the whole batch, one process
models[0].fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
models[1].fit(
    x[4 * rank : 4 * rank + 4],
    y[4 * rank : 4 * rank + 4],
    batch_size=4,
    epochs=2,
    shuffle=False,
    verbose=0,
)
report(
    "optimizer",
    keras=type(models[1].optimizer).__module__.split(".")[0],
    wrapped=type(models[1].optimizer).__name__,
    error=float(
        max(np.abs(a - b).max() for a, b in zip(models[0].get_weights(), models[1].get_weights()))
    ),
)
