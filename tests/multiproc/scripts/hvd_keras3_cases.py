"""Two cases of Horovod's own test suite (test/parallel/test_tensorflow.py) that fail there on
Keras 3, written as a ``horovod.tensorflow`` user writes them: tf.keras layers and variables, with
nothing of tfpar imported and nothing set (so tf.keras is Keras 3 unless TF_USE_LEGACY_KERAS=1).
Run under `horovodrun -np 2 -H localhost:2 --gloo`; each rank prints ``CASE <name> <rank> <json>``.

- syncbn: SyncBatchNormalization on each rank's slice of a batch equals BatchNormalization on the
  whole batch, outputs and moving statistics (test_horovod_syncbn_cpu);
- partial-tape: PartialDistributedGradientTape averages the shared layer's gradients over the ranks
  and leaves the local layer's alone, scaled by 1 / size (test_partial_distributed_gradient_tape).
"""

import json

import numpy as np
import tensorflow as tf

import horovod.tensorflow as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()


def report(name, **values):
    print(f"CASE {name} {rank} {json.dumps(values)}", flush=True)


# syncbn: the rows of every rank, stacked; this rank normalizes its own row.
for channels in (2, 1):
    x = tf.convert_to_tensor(np.stack([np.array([[r + c, r * 2 + c, r * 3 + c, r * 4 + c] for c in range(channels)]).T
                                       for r in range(size)]), np.float32)  # (size, 4, channels)
    bn = tf.keras.layers.BatchNormalization(axis=1)
    sync_bn = hvd.SyncBatchNormalization(axis=1)
    whole = bn(x, training=True).numpy()
    mine = sync_bn(tf.expand_dims(x[rank], 0), training=True).numpy()
    report("syncbn", keras=type(bn).__module__.split(".")[0], channels=channels,
           output=float(np.abs(mine - whole[rank:rank + 1]).max()),
           moving_mean=float(np.abs(np.asarray(sync_bn.moving_mean) - np.asarray(bn.moving_mean)).max()),
           moving_variance=float(np.abs(np.asarray(sync_bn.moving_variance) - np.asarray(bn.moving_variance)).max()))

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
    errors[variable.path if hasattr(variable, "path") else variable.name] = (is_local, float(np.abs(g.numpy() - expected).max()))
report("partial-tape", keras=type(model).__module__.split(".")[0], errors=errors,
       local_differs=bool(np.abs(every[-1][0] - every[-1][1]).max() > 0))
