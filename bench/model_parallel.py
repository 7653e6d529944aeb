"""Model-parallel benchmark: a 4-block transformer split by tensor parallelism over 2 and 4 devices.

    python bench/model_parallel.py [--quick]

One process with 4 virtual CPU devices. The model is `tfpar.demo.tokens.transformer` (4 blocks;
width 256, 8 heads, MLP 1024, vocabulary 512, 32 tokens), trained with Adam.

Last line:
    RESULT model_parallel tp2_bytes_ratio=<a> tp4_bytes_ratio=<b> tp2_step_ratio=<c>
           pp_dp_weak_scaling=<w> pp_span_step_ratio=<s> reductions_per_block=<F>/<B>
           tp2_bytes_expected=<d> tp4_bytes_expected=<e> largest_tp1=<n>
           largest_tp2=<n> largest_tp4=<n> llama_params=<n> llama_tp2_bytes_ratio=<a>
           llama_tp4_bytes_ratio=<b> llama_tp2_bytes_expected=<d> llama_tp4_bytes_expected=<e>
           llama_tp2_step_ratio=<c>

- tpT_bytes_ratio: the most any device holds (weights and Adam's slots, from where each variable
  lives) ÷ what one device holds unsplit; tpT_bytes_expected: 1/T of the planned layers plus the
  replicated ones, from the plan (the ratio must be within 2 % of it);
- tp2_step_ratio: a training step split over 2 devices ÷ the plain model's on one device, timed in
  turns (a b b a), on a narrower model of the same shape (width 128, MLP 512). On this CPU the
  devices share the cores, so it measures the cost of the split, not a speed-up: the baseline for a
  GPU run;
- pp_dp_weak_scaling: a 2-stage pipeline's step on 1 worker ÷ on 2 workers under `tfpar launch -n 2`
  (pipeline x data: each worker the same per-worker batch, the gradients all-reduced between them),
  the jobs alternating a b b a. 1.0 is perfect weak scaling; here 2 workers share 2 cores;
- pp_span_step_ratio: the same 2-stage pipeline with its stages on 2 workers
  (`span_workers=True` under `tfpar launch -n 2`: worker 0 drives both, each activation and
  gradient crossing between the processes over gRPC on 127.0.0.1) ÷ on 2 devices of one process,
  the same batch, in the same turns. Above 1 is the cost of the crossing; here the 2 workers also
  share the 2 cores;
- reductions_per_block: all-reduces forward/backward per block, counted from the ops of a traced
  training step (Megatron-LM: 2/2);
- llama_*: the same figures for KerasHub's LlamaCausalLM (56 M parameters, random weights; 8
  blocks, width 512, 8 query and 4 key/value heads, vocabulary 32,000, untied), split by its
  backbone's own ``LlamaBackbone.get_layout_map(mesh)``: the bytes over 2 and 4 devices, and its
  step split over 2 ÷ on one device (batch 4 of 32 tokens);
- largest_tpT: the most parameters of this architecture that fit a 16 GiB device with Adam in
  float32 (16 bytes a parameter: weights, gradient and two slots), from the measured split.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

from common import quick_options, run_job  # noqa: E402

import tfpar  # noqa: E402

BUDGET = 16 * 2**30
BYTES_PER_PARAMETER = 16


def main():
    opts = quick_options(__doc__)
    tfpar.configure_devices(4)
    import tensorflow as tf

    from tfpar.demo.tokens import TRANSFORMER_PLAN, token_data, transformer
    from tfpar.tensor_parallel import TensorParallel
    from tfpar.tensor_parallel.ops import (
        BACKWARD_REDUCTION,
        FORWARD_REDUCTION,
        count_communication,
    )

    k = tfpar.keras
    size = dict(vocab=512, length=32, dim=256, heads=8, blocks=4, hidden=1024)
    if opts.quick:
        size.update(dim=64, hidden=256, vocab=128)
    batch, steps = (16, 3) if opts.quick else (32, 8)
    x, y = token_data(batch * steps, vocab=size["vocab"], length=size["length"])
    loss = k.losses.SparseCategoricalCrossentropy(from_logits=True)

    def compiled(model):
        model.compile(k.optimizers.Adam(1e-3), loss)
        return model

    plain = compiled(transformer(k, **size))
    plain.optimizer.build(plain.trainable_variables)
    whole = sum(v.shape.num_elements() * 4 for v in plain.weights)
    whole += sum(v.shape.num_elements() * 4 for v in plain.optimizer.variables if v.shape.rank)
    print(
        f"model: {plain.count_params():,} parameters, "
        f"{whole:,} bytes with Adam's slots on one device",
        flush=True,
    )
    ratios, expected, split = {}, {}, {}
    for degree in (2, 4):
        model = compiled(
            TensorParallel(degree=degree, plan=TRANSFORMER_PLAN).shard(transformer(k, **size))
        )
        held = model.device_bytes()
        most = max(sum(h.values()) for h in held.values())
        ratios[degree] = most / whole
        # the split weights: not a row layer's bias
        planned = sum(
            v.shape.num_elements()
            for layer in plain.layers
            if layer.name in model.styles
            for v in layer.weights
            if len(v.shape) > 1
        )
        expected[degree] = (
            planned / degree + (plain.count_params() - planned)
        ) / plain.count_params()
        print(
            f"T={degree}: "
            + ", ".join(f"{d} {sum(h.values()):,} B" for d, h in held.items())
            + f"; most {ratios[degree]:.3f} of one device (plan: {expected[degree]:.3f})",
            flush=True,
        )
        split[degree] = model
    two = split[2]

    @tf.function
    def traced(x, y):
        with tf.GradientTape() as tape:
            value = loss(y, two(x, training=True))
        return tape.gradient(value, two.trainable_variables)

    counts = count_communication(traced.get_concrete_function(x[:2], y[:2]).graph.as_graph_def())
    blocks = size["blocks"]
    forward = (
        counts[FORWARD_REDUCTION] - 1
    ) / blocks  # the embedding's one reduction is not a block's
    backward = counts[BACKWARD_REDUCTION] / blocks
    timed_size = dict(size, dim=64 if opts.quick else 128, hidden=256 if opts.quick else 512)
    models = {
        "plain": compiled(transformer(k, **timed_size)),
        "tp2": compiled(
            TensorParallel(degree=2, plan=TRANSFORMER_PLAN).shard(transformer(k, **timed_size))
        ),
    }
    step = step_times(models, x, y, batch, rounds=1 if opts.quick else 2)
    llama = keras_hub_llama(opts.quick)
    weak, span = pipeline_jobs(opts.quick)
    largest = {1: BUDGET / BYTES_PER_PARAMETER}
    largest.update({t: BUDGET / BYTES_PER_PARAMETER / ratios[t] for t in ratios})
    print(
        "largest model for a 16 GiB device (Adam, float32): "
        + ", ".join(f"T={t}: {n / 1e9:.2f}B parameters" for t, n in largest.items()),
        flush=True,
    )
    print(
        f"RESULT model_parallel tp2_bytes_ratio={ratios[2]:.3f} tp4_bytes_ratio={ratios[4]:.3f} "
        f"tp2_step_ratio={step['tp2'] / step['plain']:.3f} pp_dp_weak_scaling={weak:.3f} "
        f"pp_span_step_ratio={span:.3f} "
        f"reductions_per_block={forward:g}/{backward:g} "
        f"tp2_bytes_expected={expected[2]:.3f} tp4_bytes_expected={expected[4]:.3f} "
        f"largest_tp1={largest[1]:.3g} largest_tp2={largest[2]:.3g} largest_tp4={largest[4]:.3g} "
        f"llama_params={llama['params']} llama_tp2_bytes_ratio={llama['tp2_bytes']:.3f} "
        f"llama_tp4_bytes_ratio={llama['tp4_bytes']:.3f} "
        f"llama_tp2_bytes_expected={llama['tp2_expected']:.3f} "
        f"llama_tp4_bytes_expected={llama['tp4_expected']:.3f} "
        f"llama_tp2_step_ratio={llama['tp2_step']:.3f}",
        flush=True,
    )


def keras_hub_llama(quick):
    """KerasHub's LlamaCausalLM (random weights; 8 blocks, width 512, 8 query and 4 key/value
    heads, MLP 1408, vocabulary 32,000, untied: 56 M parameters) split by its backbone's own
    ``get_layout_map`` over 2 and 4 devices: {"params", "tpT_bytes", "tpT_expected",
    "tp2_step"}. The bytes as for the transformer; the step ratio on the same model, batch 4 of
    32 tokens."""
    import keras
    import keras_hub
    import numpy as np

    from tfpar.tensor_parallel import TensorParallel
    from tfpar.tensor_parallel.nested import layer_tree

    size = dict(
        vocabulary_size=32000,
        num_layers=8,
        hidden_dim=512,
        intermediate_dim=1408,
        num_query_heads=8,
        num_key_value_heads=4,
    )
    if quick:
        size.update(vocabulary_size=2000, num_layers=2, hidden_dim=128, intermediate_dim=256)
    batch, length, steps = 4, 32, 2 if quick else 4
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.LlamaBackbone(**size)
    plain = keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)
    ids = np.random.default_rng(0).integers(0, size["vocabulary_size"], (batch * steps, length))
    x = {"token_ids": ids, "padding_mask": np.ones_like(ids, dtype=bool)}
    y = np.roll(ids, -1, axis=1)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def compiled(model):
        model.compile(keras.optimizers.Adam(1e-3), loss)
        model.optimizer.build(model.trainable_variables)
        return model

    compiled(plain)
    params = plain.count_params()
    whole = 3 * 4 * params  # float32 weights and Adam's two slots
    figures = {"params": params}
    split = {}
    for degree in (2, 4):
        mesh = keras.distribution.DeviceMesh(
            (1, degree), ("batch", "model"), devices=[f"cpu:{i}" for i in range(degree)]
        )
        tp = TensorParallel(plan=keras_hub.models.LlamaBackbone.get_layout_map(mesh))
        model = compiled(tp.shard(plain))
        held = model.device_bytes()
        tree = layer_tree(plain)
        planned = sum(
            v.shape.num_elements()
            for path in model.styles
            for v in tree[path].weights
            if len(v.shape) > 1
        )
        figures[f"tp{degree}_bytes"] = max(sum(h.values()) for h in held.values()) / whole
        figures[f"tp{degree}_expected"] = (planned / degree + params - planned) / params
        print(
            f"Llama {params / 1e6:.1f} M, T={degree}: "
            + ", ".join(f"{d} {sum(h.values()):,} B" for d, h in held.items())
            + f"; most {figures[f'tp{degree}_bytes']:.3f} of one device "
            f"(plan: {figures[f'tp{degree}_expected']:.3f})",
            flush=True,
        )
        split[degree] = model
    step = step_times({"llama": plain, "llama_tp2": split[2]}, x, y, batch, rounds=1)
    figures["tp2_step"] = step["llama_tp2"] / step["llama"]
    return figures


def step_times(models, x, y, batch, rounds):
    """{name: median seconds per training step}, each model's steps timed in turns a b b a (after a
    first epoch that traces), from the start to the end of each step (Keras' batch hooks)."""
    import statistics
    import time

    from tfpar._keras import keras_of

    class Steps(keras_of(next(iter(models.values()))).callbacks.Callback):  # the models' Keras
        def on_train_batch_begin(self, batch, logs=None):
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            times.append(time.perf_counter() - self.start)

    seconds: dict = {name: [] for name in models}
    for name, model in models.items():
        model.fit(x, y, batch_size=batch, epochs=1, verbose=0)  # traces
    first, second = models
    for _ in range(rounds):
        for name in (first, second, second, first):
            times: list = []
            models[name].fit(x, y, batch_size=batch, epochs=1, verbose=0, callbacks=[Steps()])
            seconds[name].extend(times)
    step = {name: statistics.median(t) for name, t in seconds.items()}
    for name, value in step.items():
        print(f"{name:>8}: {value * 1e3:.2f} ms/step, {len(seconds[name])} steps timed", flush=True)
    return step


def pipeline_jobs(quick):
    """(weak scaling, span ratio): a 2-stage pipeline's step on 1 worker ÷ on 2 workers as
    data-parallel replicas (`tfpar launch -n 2`); its stages on 2 workers ÷ on 1 (the same batch).
    Jobs in turns a b c c b a."""
    import statistics

    worker = [
        sys.executable,
        os.path.join(HERE, "_model_parallel_worker.py"),
        *(["8", "3", "32", "128"] if quick else ["16", "6", "128", "512"]),
    ]
    launch = [sys.executable, "-m", "tfpar.cli", "launch", "-n", "2", "--"]
    jobs = {
        "1 worker": worker,
        "2 workers, data x pipeline": [*launch, *worker],
        "2 workers, one pipeline over both": [*launch, *worker, "span"],
    }
    steps: dict = {name: [] for name in jobs}
    for name in list(jobs) if quick else [*jobs, *reversed(jobs)]:
        steps[name].append(run_job(jobs[name], cwd=HERE)["step"])
        print(f"pipeline, {name}: {steps[name][-1] * 1e3:.1f} ms/step", flush=True)
    one, data, span = (statistics.median(steps[name]) for name in jobs)
    return one / data, span / one


if __name__ == "__main__":
    sys.exit(main())
