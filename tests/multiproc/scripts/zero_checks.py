"""ZeRO over 3 replicas (3 virtual CPU devices, its own process: the device split is fixed per
process): each optimizer under each Keras, sharded (stages 1 and 2) against one device. Prints JSON:
{run: {"difference": largest weight difference, "chunk": elements per replica, "total": parameters}}."""

import importlib
import json

import numpy as np

import tfpar

tfpar.configure_devices(3)

from tests.models import ZERO_OPTIMIZERS, train_zero_pair  # noqa: E402

report = {}
for keras_name in ("tf_keras", "keras"):
    k = importlib.import_module(keras_name)
    for i, optimizer in enumerate(ZERO_OPTIMIZERS):
        stage = 1 + i % 2
        whole, sharded, model = train_zero_pair(k, optimizer, ["/cpu:0", "/cpu:1", "/cpu:2"], stage)
        report[f"{keras_name} {optimizer} stage {stage}"] = {
            "difference": max(float(np.abs(a - b).max()) for a, b in zip(whole, sharded)),
            "chunk": model._tfpar_zero.chunk, "total": model._tfpar_zero.total,
            "slot_devices": sorted({v.device.split("device:")[-1] for state in model._tfpar_zero.slots
                                    for v in state.values()})}
print(json.dumps(report))
