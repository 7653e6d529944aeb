"""One SGD step (rate 1) under HorovodStrategy(op=OP, compression=COMPRESSION) with known gradients
per rank, for each OP:COMPRESSION case in turn (in the same ranks); prints each case's kernel.

The loss is the model's output, so a rank's gradient is its own example: rank 0 gets [1, 0],
rank 1 gets [1, 1] (tfpar.data shards by rank); with COMPRESSION "fp16" or "bf16", [0.1, 0.2]
and [0.3, 0.7], which neither 16-bit format can hold exactly. A case OP:COMPRESSION:embedding
trains an Embedding(3, 1) instead, whose gradient is sparse: rank 0 looks up rows 0 and 1, rank 1
rows 0 and 2.
Usage: horovod_one_step.py OP:COMPRESSION[:embedding] ...; prints ``KERNEL <case> <rank> <kernel>``
(the tests run it in turn after horovod_train.py, in the same ranks: in_turn.py). Then each rank
reduces a boolean that only rank 1 holds true, under MEAN and SUM: ``BOOLEAN <op> <rank> <value>``.
"""

import json
import sys

import numpy as np
import tensorflow as tf

import tfpar
from tfpar.strategies.horovod import HorovodStrategy

keras = tfpar.keras


def _model(embedding):
    if embedding:
        return keras.Sequential(
            [
                keras.layers.Input((2,), dtype="int32"),
                keras.layers.Embedding(3, 1, embeddings_initializer="zeros"),
                keras.layers.Flatten(),
            ]
        )
    return keras.Sequential(
        [
            keras.layers.Input((2,)),
            keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros"),
        ]
    )


def _inputs(case):
    if case.endswith(":embedding"):
        return np.array([[0, 1], [0, 2]], "int32")
    if ":none" in case:
        return np.array([[1.0, 0.0], [1.0, 1.0]], "float32")
    return np.array([[0.1, 0.2], [0.3, 0.7]], "float32")


def one_step(cases):
    """One step of each case in turn, each under its own strategy; prints each rank's kernel."""
    for case in cases:
        strategy = HorovodStrategy(op=case.split(":")[0], compression=case.split(":")[1])
        with strategy.scope():
            model = _model(case.endswith(":embedding"))
            model.compile(keras.optimizers.SGD(1.0), loss=lambda y_true, y_pred: y_pred)
        y = np.zeros((2, 1), "float32")
        examples = tf.data.Dataset.from_tensor_slices((_inputs(case), y))
        train = tfpar.data.distribute(examples, strategy, 2)
        model.fit(train.dataset, steps_per_epoch=1, epochs=1, verbose=0)
        kernel = model.get_weights()[0][:, 0].tolist()
        print(f"KERNEL {case} {strategy.rank} " + json.dumps(kernel), flush=True)


def booleans():
    """A boolean only rank 1 holds true, reduced under MEAN and SUM (true where any rank's is)."""
    strategy = HorovodStrategy()
    for op in ("MEAN", "SUM"):
        reduced = strategy.reduce(op, tf.constant([strategy.rank == 1, False]), axis=None)
        print(f"BOOLEAN {op} {strategy.rank} {reduced.numpy().tolist()}", flush=True)


if __name__ == "__main__":
    one_step(sys.argv[1:])
    booleans()
