"""One fit of the equivalence model under `tfpar launch -n 2 --timeline DIR` (DataParallel or
HorovodStrategy by tfpar.strategies.auto()); worker SLOW's input sleeps 25 ms per example: 400 ms
a batch of 16, far longer than a step of this model takes even on a loaded 2-core machine, so its
prefetched input cannot hide the wait (at 5 ms, 80 ms a batch, a step slowed by the other tests'
processes did: measured 2026-12-06, worker 1's median wait 1.0 ms). Its first Dense layer
recomputes its forward in the backward (remat), on every worker's track of recomputed forwards.

Usage: timeline_slow_input.py SLOW (-1: none)
"""

import sys
import time

import tensorflow as tf

import tfpar
from tests.models import equivalence_data, verify_model

strategy = tfpar.strategies.auto(remat=["dense"])
slow = int(sys.argv[1])
index = strategy.rank if hasattr(strategy, "rank") else strategy.cluster_resolver.task_id
model = strategy.build(verify_model)
x, y = equivalence_data(192)


def source():
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    if index == slow:  # a slow input on this worker only

        def late(a, b):
            time.sleep(0.025)
            return a, b

        dataset = dataset.map(lambda a, b: tf.numpy_function(late, [a, b], (tf.float32, tf.int64)))
        dataset = dataset.map(lambda a, b: (tf.ensure_shape(a, (8, 8, 1)), tf.ensure_shape(b, ())))
    return dataset


train = tfpar.data.distribute(source, strategy, 32)
model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=1, verbose=0)
print("done", index, flush=True)
