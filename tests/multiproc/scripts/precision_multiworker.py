"""Precision across processes, one job: run under `tfpar launch -n 2` (multi-worker DataParallel),
or with --horovod under `horovodrun -np 2` (HorovodStrategy).

First QAT and TFMOT's collaborative chain: QAT of the trained model (TFMOT's default 8-bit);
pruning, then pruning-preserving QAT, and clustering that keeps the zeros, then cluster-preserving
QAT, both with exact ranges. Writes ``worker_<i>.json`` into the folder given as the first
argument, with this worker's QAT ranges and weights, pruning masks, cluster centroids and indices,
whole (compared element by element): a file, because horovodrun forwards each rank's output in
chunks and a line this long can come back interleaved with the other rank's.

Then the loss-scale consistency check, under tf_keras and then Keras 3 with the same strategy: an
inf gradient on the first worker's replica only, under mixed_float16; prints ``REPORT {json}`` per
Keras. With --horovod, then Adam's under HorovodStrategy with the optimizer state sharded over the
ranks and without, per Keras ("zero": 1 or 0 in the report)."""

import importlib
import json
import os
import sys

import numpy as np

import tfpar
from tests.models import digits_subset, overflow_step, process_strategy, qat_model
from tfpar.quantization import cluster, prune, quantize, quantizer_ranges

keras = tfpar.keras
strategy, worker = process_strategy()
x, y, _, _ = digits_subset(256)
tf = __import__("tensorflow")
train = tfpar.data.distribute(tf.data.Dataset.from_tensor_slices((x, y)), strategy, 64)


def fit(model, epochs=1, callbacks=()):
    with strategy.scope():
        model.compile(
            keras.optimizers.Adam(1e-3),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    model.fit(
        train.dataset,
        steps_per_epoch=train.steps_per_epoch,
        epochs=epochs,
        callbacks=list(callbacks),
        verbose=0,
    )
    return model


def values(model, *markers):
    """Name -> value (this worker's, as a list) of the variables whose name holds a marker."""
    return {
        v.name: np.asarray(v.numpy()).tolist()
        for v in model.variables
        if any(m in v.name for m in markers)
    }


with strategy.scope():
    trained = qat_model()
fit(trained, epochs=2)
with strategy.scope():
    qat = quantize(trained)
fit(qat, epochs=2)
with strategy.scope():
    pruned, callbacks = prune(trained, 0.5, end_step=4, frequency=2)
fit(pruned, epochs=2, callbacks=callbacks)
with strategy.scope():
    pqat = quantize(pruned, preserve="sparsity", ranges="exact")
fit(pqat)
with strategy.scope():
    clustered = cluster(pruned, clusters=4, preserve_sparsity=True)
fit(clustered)
with strategy.scope():
    cqat = quantize(clustered, preserve=("clusters", "sparsity"), ranges="exact")
fit(cqat)
with open(os.path.join(sys.argv[1], f"worker_{worker}.json"), "w") as f:
    json.dump(
        {
            "worker": worker,
            "qat_ranges": {
                name: [np.asarray(v).tolist() for v in vs]
                for name, vs in quantizer_ranges(qat).items()
            },
            "qat_weights": [w.tolist() for w in qat.get_weights()],
            "masks": values(pruned, "mask"),
            "centroids": values(clustered, "cluster_centroids", "pulling_indices"),
            "pqat": values(pqat, "_min", "_max", "kernel"),
            "cqat": values(cqat, "_min", "_max", "kernel"),
        },
        f,
    )

for keras_version in ("2", "3"):
    k = importlib.import_module("keras") if keras_version == "3" else tfpar.keras
    report = overflow_step(strategy, global_batch=8, first_worker=worker == 0, k=k)
    print("REPORT " + json.dumps({"worker": worker, "keras": keras_version, **report}), flush=True)
    for zero in (1, 0) if "--horovod" in sys.argv else ():
        from tfpar.strategies.horovod import HorovodStrategy

        report = overflow_step(
            HorovodStrategy(zero_stage=zero),
            global_batch=8,
            first_worker=worker == 0,
            k=k,
            optimizer=lambda k: k.optimizers.Adam(0.01),
        )
        print(
            "REPORT "
            + json.dumps({"worker": worker, "keras": keras_version, "zero": zero, **report}),
            flush=True,
        )
