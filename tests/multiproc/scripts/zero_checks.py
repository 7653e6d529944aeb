"""ZeRO over 3 replicas (3 virtual CPU devices, its own process: the device split is fixed per
process): each optimizer under one Keras, sharded (stages 1 and 2) against one device. Prints JSON:
{run: {"difference": largest weight difference, "chunk": elements per replica, "total":
parameters}}; and resharding: a checkpoint written on 2 replicas resumed on 3, one of 3 resumed on
one device."""

import importlib
import json
import tempfile

import numpy as np

import tfpar

tfpar.configure_devices(3)

from tests.models import ZERO_OPTIMIZERS, train_zero_pair, zero_resume  # noqa: E402

report = {}
# each under one Keras here (both on 2 replicas: tests/devices/test_zero.py)
for i, optimizer in enumerate(ZERO_OPTIMIZERS):
    keras_name, stage = ("tf_keras", "keras")[i % 2], 1 + i % 2
    whole, sharded, model = train_zero_pair(
        importlib.import_module(keras_name), optimizer, ["/cpu:0", "/cpu:1", "/cpu:2"], stage
    )
    report[f"{keras_name} {optimizer} stage {stage}"] = {
        "difference": max(float(np.abs(a - b).max()) for a, b in zip(whole, sharded)),
        "chunk": model._tfpar_zero.chunk,
        "total": model._tfpar_zero.total,
        "slot_devices": sorted(
            {v.device.split("device:")[-1] for v in model._tfpar_zero.slot_variables()}
        ),
    }
# a checkpoint of 2 replicas on 3, of 3 on one device
for keras_name, first, then in (("tf_keras", 2, 3), ("keras", 3, 1)):
    devices = ["/cpu:0", "/cpu:1", "/cpu:2"]
    report[f"{keras_name} resume {first} -> {then}"] = {
        "difference": zero_resume(
            importlib.import_module(keras_name), tempfile.mkdtemp(), devices[:first], devices[:then]
        )
    }
print(json.dumps(report))
