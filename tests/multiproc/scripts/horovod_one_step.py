"""One SGD step (rate 1) under HorovodStrategy(op=OP, compression=COMPRESSION) with known gradients
per rank, for each OP:COMPRESSION case in turn (in the same ranks); prints each case's kernel.

The loss is the model's output, so a rank's gradient is its own example: rank 0 gets [1, 0],
rank 1 gets [1, 1] (tfpar.data shards by rank); with COMPRESSION "fp16" or "bf16", [0.1, 0.2]
and [0.3, 0.7], which neither 16-bit format can hold exactly.
Usage: horovod_one_step.py OP:COMPRESSION [OP:COMPRESSION ...]; prints ``KERNEL <case> <rank> <kernel>``.
"""

import json
import sys

import numpy as np

import tfpar
from tfpar.strategies.horovod import HorovodStrategy

cases = [case.split(":") for case in sys.argv[1:]]
strategies = [HorovodStrategy(op=op, compression=compression) for op, compression in cases]

import tensorflow as tf  # noqa: E402

keras = tfpar.keras
for strategy, (op, compression) in zip(strategies, cases):
    with strategy.scope():
        model = keras.Sequential([keras.layers.Input((2,)),
                                  keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
        model.compile(keras.optimizers.SGD(1.0), loss=lambda y_true, y_pred: y_pred)
    x = np.array([[0.1, 0.2], [0.3, 0.7]] if compression != "none" else [[1.0, 0.0], [1.0, 1.0]], "float32")
    train = tfpar.data.distribute(tf.data.Dataset.from_tensor_slices((x, np.zeros((2, 1), "float32"))), strategy, 2)
    model.fit(train.dataset, steps_per_epoch=1, epochs=1, verbose=0)
    print(f"KERNEL {op}:{compression} {strategy.rank} " + json.dumps(model.get_weights()[0][:, 0].tolist()), flush=True)
