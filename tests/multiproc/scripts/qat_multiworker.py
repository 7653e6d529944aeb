"""QAT under MultiWorkerMirroredStrategy (run under `tfpar launch -n 2`): prints ``REPORT {json}``
with this worker's fake-quant ranges and weights, whole (compared element by element)."""

import json

import numpy as np

import tfpar
from tests.models import digits_subset, qat_model
from tfpar.quantization import quantize, quantizer_ranges

keras = tfpar.keras
strategy = tfpar.DataParallel(timeout_seconds=120)
x, y, x_val, y_val = digits_subset()
with strategy.scope():
    model = quantize(qat_model())
    model.compile(keras.optimizers.SGD(0.05), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
train = tfpar.data.distribute(__import__("tensorflow").data.Dataset.from_tensor_slices((x, y)), strategy, 64)
model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=2, verbose=0)
ranges = {name: [np.asarray(v).tolist() for v in values] for name, values in quantizer_ranges(model).items()}
print("REPORT " + json.dumps({
    "worker": tfpar.ClusterInfo.from_tf_config().worker_index,
    "ranges": ranges,
    "weights": [w.tolist() for w in model.get_weights()],
}), flush=True)
