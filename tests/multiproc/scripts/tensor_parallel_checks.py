"""Tensor parallelism that needs more devices than the test process has (8 virtual CPU devices, its
own process: the device split is fixed per process): T = 4 alone (each model with SGD with momentum
under one Keras and Adam under the other), and on one host tensor x pipeline, tensor x data and all
three (2 x 2 x 2), each against the plain model, under both Kerases (the compositions with Adam: tests/multiproc/test_tensor_parallel.py
runs them across workers with SGD too). Prints JSON: {run: {weight: largest difference}}."""

import importlib
import json

import tfpar

tfpar.configure_devices(8)

from tests.models import train_tensor_parallel_pair, weight_differences  # noqa: E402
from tfpar.pipeline import Pipeline  # noqa: E402

LAYOUTS = {  # name -> Pipeline options (None: TensorParallel with T = 4 alone)
    "tensor 4": None,
    "pipeline 2 x tensor 2": dict(num_stages=2, num_microbatches=2, tensor_parallel=2),
    "data 2 x tensor 2": dict(num_stages=1, num_microbatches=1, replicas=2, tensor_parallel=2),
    "data 2 x pipeline 2 x tensor 2": dict(num_stages=2, num_microbatches=2, replicas=2, tensor_parallel=2),
}
report = {}
for keras_name in ("tf_keras", "keras"):
    k = importlib.import_module(keras_name)
    for layout, options in LAYOUTS.items():
        # T = 4 alone: each model with each optimizer once over the two Kerases (T = 2 runs them all).
        flip = keras_name == "keras"
        runs = ([("mlp", "adam" if flip else "sgd"), ("block", "sgd" if flip else "adam"),
                 ("embedding", "adam" if flip else "sgd")] if options is None else [("block", "adam")])
        for name, optimizer in runs:
            split = None if options is None else (
                lambda m, plan, o=options: Pipeline(tensor_plan=plan, **o).stage(m))
            plain, got, model, initial = train_tensor_parallel_pair(name, 4, optimizer, k=k, epochs=1, split=split)
            moved = max(float(abs(a - b).max()) for a, b in zip(initial, plain))
            report[f"{keras_name} {layout} {name} {optimizer}"] = {
                "differences": weight_differences(model.plain_model(), plain, got, optimizer), "moved": moved}
print(json.dumps(report))
