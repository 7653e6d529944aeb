"""Each worker of a `tfpar launch -n 2` (or `horovodrun -np 2`) job trains the transformer block of
tests.models under pipeline x data, tensor x data and pipeline x tensor x data (2 x 2 x 2), each
case from the same plain weights (worker 1 perturbs its copy first: only worker 0's broadcast makes
them agree), fed by tfpar.data. Writes OUT/<case>/worker_<i>.npz (the plain model's trained
weights).

The span layouts (alone in a job) are one pipeline over both workers (``span_workers=True``):
"span", 4 stages on the 2 x 2 devices; "span_tensor", 2 stages, each 2-way tensor-parallel on one
worker (Megatron's layout: tensor inside a host, pipeline across hosts). Worker 0 trains and writes
worker_0.npz; worker 1 serves its devices and ends with worker 0.

"gpt2" is KerasHub's GPT2CausalLM (tiny) under ``TensorParallel(degree=2)`` with its default plan:
tensor x data, each block's attention and MLP split inside its decoder block; "gpt2_<layout>" is
GPT-2 under that layout's pipeline ("gpt2_pipeline_tensor": cut between its backbone's blocks,
each stage split 2 ways, on each worker: 2 x 2 x 2).

Usage: model_parallel_workers.py OUT CASE[,CASE ...] where CASE is LAYOUT:KERAS:OPTIMIZER[:EXAMPLES]
(default 32 examples: 2 whole global batches of 16; 40: a last step of 8 examples, padded).
"""

import importlib
import os
import sys

import numpy as np

import tfpar

tfpar.configure_devices(4)  # 2 stages x 2-way tensor parallelism on each worker at most

out, cases = sys.argv[1], [case.split(":") for case in sys.argv[2].split(",")]
LAYOUTS = {
    "pipeline": dict(num_stages=2, num_microbatches=2),
    "tensor": dict(num_stages=1, num_microbatches=1, tensor_parallel=2),
    "pipeline_tensor": dict(num_stages=2, num_microbatches=2, tensor_parallel=2),
}
SPAN = {
    "span": dict(num_stages=4, num_microbatches=2, span_workers=True),
    "span_tensor": dict(num_stages=2, num_microbatches=2, tensor_parallel=2, span_workers=True),
}
spanning = {layout for layout, *_ in cases} & set(SPAN)
# first (worker 1 of a span job serves from the first spanning pipeline on, and goes no further)
parallelisms = {
    layout: tfpar.pipeline.Pipeline(**options)
    for layout, options in ({name: SPAN[name] for name in spanning} or LAYOUTS).items()
}
# the same as "tensor", as a user writes it
tensor_alone = None if spanning else tfpar.tensor_parallel.TensorParallel(degree=2)

import tensorflow as tf  # noqa: E402

from tests.models import case_model  # noqa: E402

index = next(iter(parallelisms.values())).topology.worker_index  # under tfpar launch or horovodrun
for layout, keras_name, optimizer, *examples in cases:
    k = importlib.import_module(keras_name)
    model, x, y = case_model(layout, k, int(examples[0]) if examples else 32)
    if index == 1:
        model.set_weights([w + 0.5 for w in model.get_weights()])
    alone = layout in ("tensor_alone", "gpt2")
    parallelism = tensor_alone if alone else parallelisms[layout.removeprefix("gpt2_")]
    split = parallelism.shard(model) if alone else parallelism.stage(model)
    print(parallelism.describe(global_batch_size=16, model=split), flush=True)
    if layout == "gpt2":  # the one-stage pipeline each worker runs: its split layers
        print(f"gpt2 styles: {sorted(split.stages[0].styles.items())}", flush=True)
    split.compile(
        k.optimizers.SGD(0.1, momentum=0.9) if optimizer == "sgd" else k.optimizers.Adam(0.003),
        k.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    train = tfpar.data.distribute(tf.data.Dataset.from_tensor_slices((x, y)), parallelism, 16)
    split.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=1, verbose=2)
    folder = os.path.join(out, "-".join([layout, keras_name, optimizer, *examples]))
    os.makedirs(folder, exist_ok=True)
    np.savez(os.path.join(folder, f"worker_{index}.npz"), *split.plain_model().get_weights())
print("done", flush=True)
