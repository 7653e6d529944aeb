"""Trains the equivalence model under HorovodStrategy, once per case, in one job of ranks.

Usage: horovod_train.py OUT_DIR CASE [CASE ...], a CASE being
``NAME:GLOBAL_BATCH:EPOCHS:EXAMPLES:OP:COMPRESSION:BACKWARD_PASSES:KERAS[:ZERO_STAGE:OPTIMIZER]``
(KERAS 2: tf_keras, 3: Keras 3; OPTIMIZER one of tests.models.ZERO_OPTIMIZERS or
LAYERWISE_OPTIMIZERS, "-": SGD with momentum). Each case trains its own strategy and model in turn,
in the same processes (one TensorFlow and one Horovod start for them all), and writes to
OUT_DIR/NAME: start_<r>.npz and local_start_<r>.npz (the weights after creation, and those the rank
drew alone), rank_<r>.npz (the trained weights), rank_<r>.json (the history), describe_<r>.txt (the
strategy's description), reads_<r>.json (tf_keras: of the Horovod all-reduces of metrics in fit's
traced step, how many wait for the step's gradients); with a ZERO_STAGE, every rank also writes the
weights with the optimizer state, ckpt_<r> (tf_keras: TF format, Keras 3: .weights.h5), as ZeRO
needs: each rank holds a part of the state. ZeRO's buckets hold 1 KiB here
(`tfpar.strategies._zero_state.BUCKET_BYTES`): a step's exchange is several named collectives.
"""

import importlib
import json
import os
import sys

import numpy as np

import tfpar
from tfpar.strategies import _zero_state
from tfpar.strategies.horovod import HorovodStrategy

_zero_state.BUCKET_BYTES = 1024

out = sys.argv[1]
# "-": the model's own optimizer
cases = [case.split(":") + ["0", "-"][len(case.split(":")) - 8 :] for case in sys.argv[2:]]
# each refuses bad options before any training
strategies = [
    HorovodStrategy(
        op=op, compression=compression, backward_passes_per_step=int(passes), zero_stage=int(zero)
    )
    for _, _, _, _, op, compression, passes, _, zero, _ in cases
]

import tensorflow as tf  # noqa: E402

from tests.models import (  # noqa: E402
    compile_for_equivalence,
    equivalence_data,
    equivalence_model,
    zero_optimizer,
)


def metric_reads(model):
    """{"metrics": the Horovod all-reduces in fit's traced step that read a metric's variable,
    "after_gradients": how many of them have the step's gradients among their inputs' ancestors}."""
    graphs = [step.graph for step in model.train_function._list_all_concrete_functions()]
    reads = [
        op
        for graph in graphs
        for op in graph.get_operations()
        if op.type.startswith("Horovod") and _reads_a_variable(op)
    ]
    return {"metrics": len(reads), "after_gradients": sum(map(_after_gradients, reads))}


def _reads_a_variable(op):
    return any(t.op.type == "ReadVariableOp" for t in op.inputs)


def _after_gradients(op):
    """Whether ``op`` has one of the step's gradients ("gradient_tape/...") among its ancestors."""
    seen = set()
    stack = [op]
    while stack:
        current = stack.pop()
        if current.name.startswith("gradient_tape/"):
            return True
        for parent in [t.op for t in current.inputs] + list(current.control_inputs):
            if parent.name not in seen:
                seen.add(parent.name)
                stack.append(parent)
    return False


for strategy, (
    name,
    global_batch,
    epochs,
    examples,
    _,
    _,
    _,
    keras_version,
    zero,
    optimizer,
) in zip(strategies, cases):
    k = importlib.import_module("keras") if keras_version == "3" else tfpar.keras
    folder = os.path.join(out, name)
    os.makedirs(folder, exist_ok=True)
    global_batch = int(global_batch)
    x, y = equivalence_data(int(examples))
    rank = strategy.rank
    seed = 1 if rank == 0 else 100 + rank  # only the broadcast can make the ranks start alike
    local_start = equivalence_model(seed, k).get_weights()  # what this rank would start from alone
    with strategy.scope():
        model = equivalence_model(seed, k)
        compile_for_equivalence(model, k)
        opt = zero_optimizer(k, optimizer) if optimizer != "-" else model.optimizer
        model.compile(opt, model.loss, weighted_metrics=["accuracy"])
    np.savez(os.path.join(folder, f"start_{rank}.npz"), *model.get_weights())
    np.savez(os.path.join(folder, f"local_start_{rank}.npz"), *local_start)
    with open(os.path.join(folder, f"describe_{rank}.txt"), "w") as f:
        f.write(strategy.describe(global_batch_size=global_batch, model=model))
    train = tfpar.data.distribute(
        tf.data.Dataset.from_tensor_slices((x, y)), strategy, global_batch
    )

    class RankNumber(k.callbacks.Callback):
        """A per-rank number (rank + 1) for MetricAverage to average over the ranks."""

        def on_epoch_end(self, epoch, logs=None):
            logs["rank_number"] = float(rank + 1)

    history = model.fit(
        train.dataset,
        steps_per_epoch=train.steps_per_epoch,
        epochs=int(epochs),
        verbose=2,
        callbacks=[
            RankNumber(),
            tfpar.callbacks.Throughput(global_batch),
            tfpar.callbacks.MetricAverage(),
            tfpar.callbacks.NaNGuard(),
        ],
    )
    np.savez(os.path.join(folder, f"rank_{rank}.npz"), *model.get_weights())
    if int(zero):
        model.save_weights(
            os.path.join(folder, f"ckpt_{rank}" + (".weights.h5" if keras_version == "3" else ""))
        )
    if keras_version == "2":
        with open(os.path.join(folder, f"reads_{rank}.json"), "w") as f:
            json.dump(metric_reads(model), f)
    with open(os.path.join(folder, f"rank_{rank}.json"), "w") as f:
        json.dump({key: [float(v) for v in values] for key, values in history.history.items()}, f)
    print(f"CASE DONE {name} rank {rank}", flush=True)
