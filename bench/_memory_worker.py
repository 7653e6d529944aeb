"""One configuration of bench/memory.py, in a process of its own: KerasHub's LlamaCausalLM (random
weights) trained with Adam under `tfpar.DataParallel` on one CPU device, or on each worker of a
`tfpar launch` job (one device each, ``--batch`` examples per worker); prints one ``BENCH {json}``
line (each worker its own).

    TF_CPU_ALLOCATOR_USE_BFC=true python bench/_memory_worker.py --remat blocks --layers 12 ...
    TF_CPU_ALLOCATOR_USE_BFC=true tfpar launch -n 2 -- python bench/_memory_worker.py --zero-stage 2

With several ``--remat``, each is measured in turn in this process (a test's one TensorFlow start),
and the line holds a list.

- persistent: the bytes the model adds to the device between steps, after a first step (the
  weights, Adam's slots, what fit keeps); state: the bytes of the model's and its optimizer's
  variables alone;
- peak: the most the device held during the timed steps (`tf.config.experimental.get_memory_info`
  after `reset_memory_stats`); activations: the peak less what the device held before them, what
  one step adds (its activations and gradients);
- step: seconds per step, the fastest of the timed epochs;
- zero: with ``--zero-stage``, ZeRO's ``{what: [bytes unsharded, bytes this replica holds]}``;
  sent: the bytes this worker's replica sends in a step.
"""

import argparse
import gc
import json
import os
import time


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--remat", action="append")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--intermediate", type=int, default=512)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocabulary", type=int, default=1000)
    parser.add_argument("--sequence", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--zero-stage", type=int, default=0)
    parser.add_argument("--accumulate", type=int, default=1, help="gradient_accumulation_steps")
    args = parser.parse_args()
    if os.environ.get("TF_CPU_ALLOCATOR_USE_BFC") != "true":
        raise SystemExit("Set TF_CPU_ALLOCATOR_USE_BFC=true: only then does TensorFlow count bytes")
    import tfpar

    tfpar.configure_devices(1)
    runs = [measure(args, remat) for remat in args.remat or ["none"]]
    print("BENCH " + json.dumps(runs if len(runs) > 1 else runs[0]), flush=True)


def llama(args):
    import keras
    import keras_hub

    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=args.vocabulary,
        num_layers=args.layers,
        num_query_heads=args.heads,
        num_key_value_heads=max(1, args.heads // 2),
        hidden_dim=args.hidden,
        intermediate_dim=args.intermediate,
    )
    model = keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(keras.optimizers.Adam(1e-4), loss)
    return model


def examples(args, count):
    import numpy as np

    ids = np.random.default_rng(0).integers(0, args.vocabulary, (count, args.sequence))
    x = {"token_ids": ids.astype("int32"), "padding_mask": np.ones(ids.shape, bool)}
    return x, np.roll(ids, -1, axis=1).astype("int32")


def measure(args, remat):
    import keras
    import tensorflow as tf

    import tfpar

    workers = tfpar.ClusterInfo.from_tf_config()
    one_device = {"devices": ["/cpu:0"]} if workers is None else {}
    # first: a multi-worker strategy starts its server before TensorFlow runs anything
    strategy = tfpar.DataParallel(
        remat=remat,
        zero_stage=args.zero_stage,
        gradient_accumulation_steps=args.accumulate,
        **one_device,
    )
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = llama(args)
    global_batch = args.batch * strategy.num_replicas_in_sync
    x, y = examples(args, global_batch * args.steps)
    train = tfpar.data.distribute(
        tf.data.Dataset.from_tensor_slices((x, y)), strategy, global_batch
    )

    def epoch():
        model.fit(train.dataset, steps_per_epoch=args.steps, epochs=1, verbose=0)

    epoch()  # traced, Adam's slots made
    gc.collect()  # what is held, not what waits for a collection
    held = tf.config.experimental.get_memory_info("CPU:0")["current"]
    tf.config.experimental.reset_memory_stats("CPU:0")
    seconds = []
    for _ in range(args.epochs):
        start = time.perf_counter()
        epoch()
        seconds.append((time.perf_counter() - start) / args.steps)
    peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
    zero = getattr(model, "_tfpar_zero", None)
    return {
        "remat": remat,
        "zero_stage": args.zero_stage,
        "worker": 0 if workers is None else workers.worker_index,
        "replicas": strategy.num_replicas_in_sync,
        "parameters": model.count_params(),
        "tokens": args.batch * args.sequence,
        "layers": args.layers,
        "hidden": args.hidden,
        "persistent": held - before,
        "state": sum(v.numpy().nbytes for v in [*model.weights, *model.optimizer.variables]),
        "zero": None if zero is None else zero.state_bytes(),
        "sent": None if zero is None else sum(zero.sent_bytes),
        "peak": peak,
        "activations": peak - held,
        "step": min(seconds),
        "described": strategy.describe(model=model),
        "blocks": len(tfpar.remat.plan_remat(model, remat).recomputed),
    }


if __name__ == "__main__":
    main()
