"""One script for every pod of a parameter-server TFJob: ps and worker tasks serve at
ParameterServer(); the chief trains 2 epochs; an evaluator task is refused with the way to go."""

import numpy as np

import tfpar
from tfpar.strategies.parameter_server import ParameterServer

strategy = ParameterServer(connect_timeout_seconds=120)  # a ps or worker task serves here, for good
import tensorflow as tf  # noqa: E402

keras = tfpar.keras
rng = np.random.default_rng(0)
x = rng.random((512, 8)).astype("float32")
y = x.sum(1)
with strategy.scope():
    model = keras.Sequential([keras.layers.Input((8,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.05), "mse")
train = tfpar.data.distribute(lambda: tf.data.Dataset.from_tensor_slices((x, y)), strategy, 32)
history = model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=2, verbose=2)
print(f"chief finished: loss {history.history['loss'][0]:.4f} -> {history.history['loss'][-1]:.4f}", flush=True)
