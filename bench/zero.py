"""ZeRO benchmark: `DataParallel(zero_stage=1)` against unsharded, one host, 2 and 3 replicas; and
`HorovodStrategy(zero_stage=1)` against unsharded on 2 ranks.

    python bench/zero.py [--quick]

One process with 3 virtual CPU devices, then a job of 2 ranks (horovodrun --gloo, this file with
--ranks). The model is an MLP of 4 Dense layers 1600 wide (10.3 M parameters), trained with Adam
(float32), batch 32 per replica.

Last line:
    RESULT zero opt_bytes_ratio_2=<a> opt_bytes_ratio_3=<b> wire_ratio=<w> step_ratio=<s>
           step_ratio_workers=<s> wire_ratio_workers=<w> opt_bytes_expected_2=<c> opt_bytes_expected_3=<d>
           largest_unsharded=<n> largest_zero_2=<n> largest_zero_3=<n>

- opt_bytes_ratio_N: the optimizer-state bytes the fullest replica holds with zero_stage=1, from
  where each slot variable lives, ÷ what a replica holds unsharded (every slot of a Mirrored
  variable on every device); opt_bytes_expected_N: 1/N of it plus the padding of the last chunk;
- wire_ratio: the bytes a replica sends per step (reduce-scatter and all-gather, from the shapes of
  the tensors that cross devices) ÷ a ring all-reduce's, 2 (N-1)/N of the gradients' bytes (N = 2);
- step_ratio: a training step with zero_stage=1 ÷ unsharded, 2 replicas, timed in turns (a b b a).
  On this CPU the devices share the cores;
- step_ratio_workers, wire_ratio_workers: the same on 2 Horovod ranks (processes on this host;
  hvd.reducescatter and hvd.allgather against Horovod's ring all-reduce). DataParallel's zero_stage
  is one host only in this version: its multi-worker step is not measured;
- largest_*: the most parameters that fit a 16 GiB replica with float32 Adam: 4 bytes of weights
  and 4 of gradients per parameter, plus the optimizer state per parameter measured above.
"""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

from common import median_seconds_in_turns, parse_bench_line, print_step_times, quick_options  # noqa: E402

import tfpar  # noqa: E402

BUDGET = 16 * 2**30


def compiled(strategy, quick):
    """The benchmark's MLP under ``strategy``, compiled with Adam."""
    k = tfpar.keras
    width, layers = (256, 2) if quick else (1600, 4)
    with strategy.scope():
        model = k.Sequential([k.Input((width,))] + [k.layers.Dense(width, activation="relu") for _ in range(layers)]
                             + [k.layers.Dense(10)])
        model.compile(k.optimizers.Adam(1e-4), k.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def data(replicas, quick, seed=0):
    """``(x, y)``: 32 examples per replica for each step of an epoch."""
    import numpy as np

    rng, n = np.random.default_rng(seed), 32 * replicas * (3 if quick else 6)
    return rng.normal(size=(n, 256 if quick else 1600)).astype("float32"), rng.integers(0, 10, n)


def ranks_part(quick):
    """One rank of the Horovod job: unsharded and sharded, timed in turns; rank 0 prints ``BENCH``."""
    import json

    import tensorflow as tf

    from tfpar.strategies.horovod import HorovodStrategy

    models = {name: compiled(HorovodStrategy(zero_stage=stage), quick) for name, stage in (("plain", 0), ("zero", 1))}
    x, y = data(2, quick)  # each rank its half of every global batch
    trains = {name: tfpar.data.distribute(tf.data.Dataset.from_tensor_slices((x, y)), model.distribute_strategy, 64)
              for name, model in models.items()}

    def epoch(name):
        models[name].fit(trains[name].dataset, steps_per_epoch=trains[name].steps_per_epoch, epochs=1, verbose=0)

    for name in models:
        epoch(name)  # builds every slot, traces the step
    step = print_step_times(median_seconds_in_turns(["plain", "zero"], 1 if quick else 2, epoch),
                            trains["plain"].steps_per_epoch)
    params = models["plain"].count_params()
    wire = models["zero"]._tfpar_zero.sent_bytes[0] / (2 * (2 - 1) / 2 * 4 * params)
    if models["plain"].distribute_strategy.rank == 0:
        print("BENCH " + json.dumps({"step_ratio": step["zero"] / step["plain"], "wire_ratio": wire}), flush=True)


def main():
    if "--ranks" in sys.argv:
        sys.argv.remove("--ranks")
        return ranks_part(quick_options(__doc__).quick)
    opts = quick_options(__doc__)
    tfpar.configure_devices(3)
    steps = 3 if opts.quick else 6

    def on(devices, stage):
        return compiled(tfpar.DataParallel(devices=tuple(f"/cpu:{i}" for i in range(devices)), zero_stage=stage),
                        opts.quick)

    ratios, expected, per_parameter = {}, {}, {}
    for n in (2, 3):
        plain, sharded = on(n, 0), on(n, 1)
        x, y = data(n, opts.quick, seed=n)
        for model in (plain, sharded):
            model.fit(x, y, batch_size=32 * n, epochs=1, verbose=0)  # builds every slot
        params = plain.count_params()
        whole = _bytes_on(plain.optimizer.variables, "CPU:0", skip=("iteration", "learning_rate"))
        zero = sharded._tfpar_zero
        fullest = max(_bytes_on([v for state in zero.slots for v in state.values()],
                                f"CPU:{j}") for j in range(n))
        ratios[n], expected[n] = fullest / whole, 2 * 4 * zero.chunk / whole
        per_parameter[n] = 8 + fullest / params
        print(f"{n} replicas: {params:,} parameters; Adam's slots per replica {whole:,} B unsharded, "
              f"{fullest:,} B sharded (the fullest replica): {ratios[n]:.4f} (expected {expected[n]:.4f})", flush=True)
        if n == 2:
            wire = max(zero.sent_bytes) / (2 * (n - 1) / n * 4 * params)
            models, (x2, y2) = {"plain": plain, "zero": sharded}, (x, y)
    timed = median_seconds_in_turns(["plain", "zero"], 1 if opts.quick else 2,
                                    lambda name: models[name].fit(x2, y2, batch_size=64, epochs=1, verbose=0))
    step = print_step_times(timed, steps)
    job = subprocess.run(["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, __file__, "--ranks"]
                         + (["--quick"] if opts.quick else []), capture_output=True, text=True, timeout=1200)
    if job.returncode:
        raise RuntimeError(f"the Horovod job failed:\n{job.stdout[-3000:]}{job.stderr[-3000:]}")
    ranks = parse_bench_line(job.stdout)
    print(f"2 Horovod ranks: the sharded step takes {ranks['step_ratio']:.3f}x the unsharded one; a rank sends "
          f"{ranks['wire_ratio']:.4f}x a ring all-reduce's bytes", flush=True)
    largest = {"unsharded": BUDGET / 16, **{f"zero_{n}": BUDGET / per_parameter[n] for n in (2, 3)}}
    print("largest model for a 16 GiB replica (Adam, float32): " + ", ".join(
        f"{name}: {count / 1e9:.2f}B parameters" for name, count in largest.items()), flush=True)
    print(f"RESULT zero opt_bytes_ratio_2={ratios[2]:.4f} opt_bytes_ratio_3={ratios[3]:.4f} wire_ratio={wire:.4f} "
          f"step_ratio={step['zero'] / step['plain']:.3f} step_ratio_workers={ranks['step_ratio']:.3f} "
          f"wire_ratio_workers={ranks['wire_ratio']:.4f} opt_bytes_expected_2={expected[2]:.4f} "
          f"opt_bytes_expected_3={expected[3]:.4f} " + " ".join(f"largest_{name}={count:.3g}"
                                                                 for name, count in largest.items()), flush=True)


def _bytes_on(variables, device, skip=()):
    """Bytes of the (components of the) variables that live on ``device``."""
    import tensorflow as tf

    from tfpar.strategies._zero import _tf_variable

    total = 0
    for v in variables:
        if any(word in v.name for word in skip):
            continue
        v = _tf_variable(v)  # Keras 3 wraps it
        for part in getattr(v, "values", (v,)):
            if part.device.endswith(device):
                total += part.shape.num_elements() * tf.as_dtype(part.dtype).size
    return total


if __name__ == "__main__":
    sys.exit(main())
