"""ZeRO benchmark: `DataParallel(zero_stage=1)` against unsharded, one host, 2 and 3 replicas, and
on 2 workers; `HorovodStrategy(zero_stage=1)` against unsharded on 2 ranks.

    python bench/zero.py [--quick]

One process with 3 virtual CPU devices, then a job of 2 workers (tfpar launch -n 2) and one of 2
ranks (horovodrun --gloo), each running this file with --ranks ENGINE. The model is an MLP of 4
Dense layers 1600 wide (10.3 M parameters), trained with Adam (float32), batch 32 per replica.

Last line:
    RESULT zero opt_bytes_ratio_2=<a> opt_bytes_ratio_3=<b> wire_ratio=<w> step_ratio=<s>
           step_ratio_workers=<s> wire_ratio_workers=<w> step_ratio_horovod=<s>
           wire_ratio_horovod=<w> opt_bytes_expected_2=<c> opt_bytes_expected_3=<d>
           largest_unsharded=<n> largest_zero_2=<n> largest_zero_3=<n>

- opt_bytes_ratio_N: the optimizer-state bytes the fullest replica holds with zero_stage=1, from
  where each slot variable lives, ÷ what a replica holds unsharded (every slot of a Mirrored
  variable on every device); opt_bytes_expected_N: 1/N of it plus the padding of the last chunk;
- wire_ratio: the bytes a replica sends per step (reduce-scatter and all-gather, from the shapes of
  the tensors that cross devices) ÷ a ring all-reduce's, 2 (N-1)/N of the gradients' bytes (N = 2);
- step_ratio: a training step with zero_stage=1 ÷ unsharded, 2 replicas, timed in turns (a b b a,
  4 rounds), each the fastest of its epochs (as timeit advises: other processes only add time; this
  shared machine moved the median by up to 40 % between runs).
  On this CPU the devices share the cores;
- step_ratio_workers, wire_ratio_workers: the same on 2 workers of `tfpar launch` (processes on this
  host; TensorFlow's all-to-all and all-gather against MultiWorkerMirroredStrategy's all-reduce);
- step_ratio_horovod, wire_ratio_horovod: the same on 2 Horovod ranks (hvd.alltoall and
  hvd.allgather against Horovod's ring all-reduce);
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
        model = k.Sequential(
            [k.Input((width,))]
            + [k.layers.Dense(width, activation="relu") for _ in range(layers)]
            + [k.layers.Dense(10)]
        )
        model.compile(
            k.optimizers.Adam(1e-4), k.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
    return model


def data(replicas, quick, seed=0):
    """``(x, y)``: 32 examples per replica for each step of an epoch."""
    import numpy as np

    rng, n = np.random.default_rng(seed), 32 * replicas * (3 if quick else 6)
    return rng.normal(size=(n, 256 if quick else 1600)).astype("float32"), rng.integers(0, 10, n)


def ranks_part(engine, quick, stages):
    """One worker (``launch``) or rank (``horovod``) of a 2-process job: a model for each zero stage
    of ``stages``, timed in turns if there are two (one multi-worker DataParallel a process: its
    collectives' keys are the strategy's own); the first prints ``BENCH``."""
    import json
    import time

    import tensorflow as tf

    from tfpar.strategies.horovod import HorovodStrategy

    make = HorovodStrategy if engine == "horovod" else tfpar.DataParallel
    names = {0: "plain", 1: "zero"}
    models = {names[stage]: compiled(make(zero_stage=stage), quick) for stage in stages}
    x, y = data(2, quick)  # each its half of every global batch
    trains = {
        name: tfpar.data.distribute(
            tf.data.Dataset.from_tensor_slices((x, y)), model.distribute_strategy, 64
        )
        for name, model in models.items()
    }

    def epoch(name):
        models[name].fit(
            trains[name].dataset, steps_per_epoch=trains[name].steps_per_epoch, epochs=1, verbose=0
        )

    for name in models:
        epoch(name)  # builds every slot, traces the step
    steps = next(iter(trains.values())).steps_per_epoch
    if len(models) == 2:
        step = print_step_times(
            median_seconds_in_turns(list(models), 1 if quick else 4, epoch, min), steps
        )
    else:
        (name,) = models
        times = []
        for _ in range(3 if quick else 8):
            start = time.perf_counter()
            epoch(name)
            times.append(time.perf_counter() - start)
        step = {name: min(times) / steps}
    report = {f"step_{name}": seconds for name, seconds in step.items()}
    if "zero" in models:
        params = models["zero"].count_params()
        report["wire_ratio"] = models["zero"]._tfpar_zero.sent_bytes[0] / (
            2 * (2 - 1) / 2 * 4 * params
        )
    first = (
        tfpar.ClusterInfo.from_tf_config().worker_index == 0
        if engine == "launch"
        else models["zero"].distribute_strategy.rank == 0
    )
    if first:
        print("BENCH " + json.dumps(report), flush=True)


def processes_part(quick):
    """``{engine: {"step_ratio", "wire_ratio"}}`` on 2 workers of `tfpar launch` (a job for each
    stage, in turns: plain, zero, zero, plain, twice; the fastest epoch of each stage's jobs) and 2
    Horovod ranks (one job, the two models in turns)."""

    def job(command, engine, stages):
        run = subprocess.run(
            command
            + [sys.executable, __file__, "--ranks", engine, stages]
            + (["--quick"] if quick else []),
            capture_output=True,
            text=True,
            timeout=1200,
        )
        if run.returncode:
            raise RuntimeError(
                f"the {engine} job failed:\n{run.stdout[-3000:]}{run.stderr[-3000:]}"
            )
        return parse_bench_line(run.stdout)

    launch = ["tfpar", "launch", "-n", "2", "--"]
    runs = [job(launch, "launch", stage) for stage in ("0", "1", "1", "0") * (1 if quick else 2)]
    step = {
        name: min(r[f"step_{name}"] for r in runs if f"step_{name}" in r)
        for name in ("plain", "zero")
    }
    horovod = job(["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo"], "horovod", "0,1")
    results = {
        "workers": {
            "step_ratio": step["zero"] / step["plain"],
            "wire_ratio": runs[1]["wire_ratio"],
        },
        "horovod": {
            "step_ratio": horovod["step_zero"] / horovod["step_plain"],
            "wire_ratio": horovod["wire_ratio"],
        },
    }
    for name, result in results.items():
        print(
            f"2 {'Horovod ranks' if name == 'horovod' else 'workers (tfpar launch)'}: "
            f"the sharded step takes {result['step_ratio']:.3f}x the unsharded one; "
            f"each sends {result['wire_ratio']:.4f}x a ring all-reduce's bytes",
            flush=True,
        )
    return results


def main():
    if "--ranks" in sys.argv:
        at = sys.argv.index("--ranks")
        engine, stages = sys.argv[at + 1 : at + 3]
        del sys.argv[at : at + 3]
        return ranks_part(
            engine, quick_options(__doc__).quick, [int(stage) for stage in stages.split(",")]
        )
    opts = quick_options(__doc__)
    tfpar.configure_devices(3)
    steps = 3 if opts.quick else 6

    def on(devices, stage):
        return compiled(
            tfpar.DataParallel(
                devices=tuple(f"/cpu:{i}" for i in range(devices)), zero_stage=stage
            ),
            opts.quick,
        )

    ratios, expected, per_parameter = {}, {}, {}
    for n in (2, 3):
        plain, sharded = on(n, 0), on(n, 1)
        x, y = data(n, opts.quick, seed=n)
        for model in (plain, sharded):
            model.fit(x, y, batch_size=32 * n, epochs=1, verbose=0)  # builds every slot
        params = plain.count_params()
        whole = _bytes_on(plain.optimizer.variables, "CPU:0", skip=("iteration", "learning_rate"))
        zero = sharded._tfpar_zero
        fullest = max(_bytes_on(zero.slot_variables(), f"CPU:{j}") for j in range(n))
        ratios[n], expected[n] = fullest / whole, 2 * 4 * zero.chunk / whole
        per_parameter[n] = 8 + fullest / params
        print(
            f"{n} replicas: {params:,} parameters; Adam's slots per replica {whole:,} B unsharded, "
            f"{fullest:,} B sharded (the fullest replica): "
            f"{ratios[n]:.4f} (expected {expected[n]:.4f})",
            flush=True,
        )
        if n == 2:
            wire = max(zero.sent_bytes) / (2 * (n - 1) / n * 4 * params)
            models, (x2, y2) = {"plain": plain, "zero": sharded}, (x, y)
    timed = median_seconds_in_turns(
        ["plain", "zero"],
        1 if opts.quick else 4,
        lambda name: models[name].fit(x2, y2, batch_size=64, epochs=1, verbose=0),
        min,
    )
    step = print_step_times(timed, steps)
    ranks = processes_part(opts.quick)
    largest = {"unsharded": BUDGET / 16, **{f"zero_{n}": BUDGET / per_parameter[n] for n in (2, 3)}}
    print(
        "largest model for a 16 GiB replica (Adam, float32): "
        + ", ".join(f"{name}: {count / 1e9:.2f}B parameters" for name, count in largest.items()),
        flush=True,
    )
    print(
        f"RESULT zero opt_bytes_ratio_2={ratios[2]:.4f} opt_bytes_ratio_3={ratios[3]:.4f} "
        f"wire_ratio={wire:.4f} "
        f"step_ratio={step['zero'] / step['plain']:.3f} "
        + "".join(
            f"step_ratio_{name}={ranks[name]['step_ratio']:.3f} "
            f"wire_ratio_{name}={ranks[name]['wire_ratio']:.4f} "
            for name in ranks
        )
        + f"opt_bytes_expected_2={expected[2]:.4f} "
        f"opt_bytes_expected_3={expected[3]:.4f} "
        + " ".join(f"largest_{name}={count:.3g}" for name, count in largest.items()),
        flush=True,
    )


def _bytes_on(variables, device, skip=()):
    """Bytes of the (components of the) variables that live on ``device``."""
    import tensorflow as tf

    from tfpar.strategies._zero_state import tf_variable

    total = 0
    for v in variables:
        if any(word in v.name for word in skip):
            continue
        v = tf_variable(v)  # Keras 3 wraps it
        for part in getattr(v, "values", (v,)):
            if part.device.endswith(device):
                total += part.shape.num_elements() * tf.as_dtype(part.dtype).size
    return total


if __name__ == "__main__":
    sys.exit(main())
