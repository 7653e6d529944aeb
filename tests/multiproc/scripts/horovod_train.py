"""Trains the equivalence model under HorovodStrategy; writes rank_<r>.npz.

Usage: horovod_train.py OUT_DIR GLOBAL_BATCH EPOCHS [op] [compression] [backward_passes_per_step]
$EXAMPLES: how many examples of the equivalence data (default 96); the model in Keras 3 when
$TFPAR_TEST_KERAS is "3".
"""

import json
import os
import sys

import numpy as np

import tfpar
from tfpar.strategies.horovod import HorovodStrategy

out, global_batch, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
op = sys.argv[4] if len(sys.argv) > 4 else "average"
compression = sys.argv[5] if len(sys.argv) > 5 else "none"
passes = int(sys.argv[6]) if len(sys.argv) > 6 else 1
strategy = HorovodStrategy(op=op, compression=compression, backward_passes_per_step=passes)

import tensorflow as tf  # noqa: E402

from tests.models import compile_for_equivalence, equivalence_data, equivalence_model, keras_of_env  # noqa: E402

k = keras_of_env()

x, y = equivalence_data(int(os.environ.get("EXAMPLES", 96)))
rank = strategy.rank
seed = 1 if rank == 0 else 100 + rank  # only the broadcast can make the ranks start alike
local_start = equivalence_model(seed, k).get_weights()  # what this rank would start from alone
with strategy.scope():
    model = equivalence_model(seed, k)
    compile_for_equivalence(model, k)
    model.compile(model.optimizer, model.loss, weighted_metrics=["accuracy"])
np.savez(os.path.join(out, f"start_{rank}.npz"), *model.get_weights())
np.savez(os.path.join(out, f"local_start_{rank}.npz"), *local_start)
print(strategy.describe(global_batch_size=global_batch, model=model), flush=True)
train = tfpar.data.distribute(tf.data.Dataset.from_tensor_slices((x, y)), strategy, global_batch)


class RankNumber(k.callbacks.Callback):
    """A per-rank number (rank + 1) for MetricAverage to average over the ranks."""

    def on_epoch_end(self, epoch, logs=None):
        logs["rank_number"] = float(rank + 1)


history = model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=epochs, verbose=2, callbacks=[
    RankNumber(), tfpar.callbacks.Throughput(global_batch), tfpar.callbacks.MetricAverage(),
    tfpar.callbacks.NaNGuard()])
np.savez(os.path.join(out, f"rank_{rank}.npz"), *model.get_weights())
with open(os.path.join(out, f"rank_{rank}.json"), "w") as f:
    json.dump({k: [float(v) for v in vals] for k, vals in history.history.items()}, f)
