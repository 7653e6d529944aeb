"""A Horovod job whose rank 1 dies after its first epoch (the test expects the job to fail)."""

import os

import numpy as np

import tfpar
from tfpar.strategies.horovod import HorovodStrategy

strategy = HorovodStrategy()
keras = tfpar.keras
with strategy.scope():
    model = keras.Sequential([keras.layers.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")


class Die(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if strategy.rank == 1:
            print("rank 1 dies now", flush=True)
            os._exit(9)


model.fit(np.ones((64, 4)), np.ones(64), batch_size=8, epochs=50, verbose=0, callbacks=[Die()])
print("rank finished all epochs", flush=True)
