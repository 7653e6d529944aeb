"""Tensor parallelism that needs more devices than the test process has (8 virtual CPU devices, its
own process: the device split is fixed per process): T = 4 alone (the three models, SGD with
momentum and Adam among them), and on one host tensor x pipeline, tensor x data and all three
(2 x 2 x 2), each against the plain model, each run under one Keras, both Kerases among them (T = 2
runs every model, optimizer and Keras on the test process's devices;
tests/multiproc/test_tensor_parallel.py runs the compositions across workers). Prints JSON: {run:
{weight: largest difference}}."""

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
    "data 2 x pipeline 2 x tensor 2": dict(
        num_stages=2, num_microbatches=2, replicas=2, tensor_parallel=2
    ),
}
RUNS = [  # (Keras, layout, model, optimizer): each once (the CI budget)
    ("tf_keras", "tensor 4", "mlp", "sgd"),
    ("keras", "tensor 4", "block", "adam"),
    ("tf_keras", "tensor 4", "embedding", "adam"),
    ("keras", "pipeline 2 x tensor 2", "block", "sgd"),
    ("tf_keras", "data 2 x tensor 2", "block", "adam"),
    ("keras", "data 2 x pipeline 2 x tensor 2", "block", "adam"),
    ("tf_keras", "data 2 x pipeline 2 x tensor 2", "block", "sgd"),
]
report = {}
for keras_name, layout, name, optimizer in RUNS:
    k, options = importlib.import_module(keras_name), LAYOUTS[layout]
    split = (
        None
        if options is None
        else (lambda m, plan, o=options: Pipeline(tensor_plan=plan, **o).stage(m))
    )
    plain, got, model, initial = train_tensor_parallel_pair(
        name, 4, optimizer, k=k, epochs=1, split=split
    )
    moved = max(float(abs(a - b).max()) for a, b in zip(initial, plain))
    report[f"{keras_name} {layout} {name} {optimizer}"] = {
        "differences": weight_differences(model.plain_model(), plain, got, optimizer),
        "moved": moved,
    }
print(json.dumps(report))
