"""ZeRO benchmark: `DataParallel(zero_stage=1)` against unsharded, one host, 2 and 3 replicas.

    python bench/zero.py [--quick]

One process with 3 virtual CPU devices. The model is an MLP of 4 Dense layers 1600 wide
(10.3 M parameters), trained with Adam (float32), batch 32 per replica.

Last line:
    RESULT zero opt_bytes_ratio_2=<a> opt_bytes_ratio_3=<b> wire_ratio=<w> step_ratio=<s>
           opt_bytes_expected_2=<c> opt_bytes_expected_3=<d> largest_unsharded=<n> largest_zero_2=<n>
           largest_zero_3=<n>

- opt_bytes_ratio_N: the optimizer-state bytes the fullest replica holds with zero_stage=1, from
  where each slot variable lives, ÷ what a replica holds unsharded (every slot of a Mirrored
  variable on every device); opt_bytes_expected_N: 1/N of it plus the padding of the last chunk;
- wire_ratio: the bytes a replica sends per step (reduce-scatter and all-gather, from the shapes of
  the tensors that cross devices) ÷ a ring all-reduce's, 2 (N-1)/N of the gradients' bytes (N = 2);
- step_ratio: a training step with zero_stage=1 ÷ unsharded, 2 replicas, timed in turns (a b b a).
  On this CPU the devices share the cores;
- largest_*: the most parameters that fit a 16 GiB replica with float32 Adam: 4 bytes of weights
  and 4 of gradients per parameter, plus the optimizer state per parameter measured above.
- Not yet measured: the step across workers (zero_stage is one host only in this version).
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

from common import median_seconds_in_turns, print_step_times, quick_options  # noqa: E402

import tfpar  # noqa: E402

BUDGET = 16 * 2**30


def main():
    opts = quick_options(__doc__)
    tfpar.configure_devices(3)
    import numpy as np

    k = tfpar.keras
    width, layers = (256, 2) if opts.quick else (1600, 4)
    batch, steps = 32, 3 if opts.quick else 6
    rng = np.random.default_rng(0)

    def compiled(devices, stage):
        strategy = tfpar.DataParallel(devices=tuple(f"/cpu:{i}" for i in range(devices)), zero_stage=stage)
        with strategy.scope():
            model = k.Sequential([k.Input((width,))] + [k.layers.Dense(width, activation="relu") for _ in range(layers)]
                                 + [k.layers.Dense(10)])
            model.compile(k.optimizers.Adam(1e-4), k.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    def data(devices):
        n = batch * devices * steps
        return rng.normal(size=(n, width)).astype("float32"), rng.integers(0, 10, n)

    ratios, expected, per_parameter = {}, {}, {}
    for n in (2, 3):
        plain, sharded = compiled(n, 0), compiled(n, 1)
        x, y = data(n)
        for model in (plain, sharded):
            model.fit(x, y, batch_size=batch * n, epochs=1, verbose=0)  # builds every slot
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
                                    lambda name: models[name].fit(x2, y2, batch_size=batch * 2, epochs=1, verbose=0))
    step = print_step_times(timed, steps)
    largest = {"unsharded": BUDGET / 16, **{f"zero_{n}": BUDGET / per_parameter[n] for n in (2, 3)}}
    print("largest model for a 16 GiB replica (Adam, float32): " + ", ".join(
        f"{name}: {count / 1e9:.2f}B parameters" for name, count in largest.items()), flush=True)
    print(f"RESULT zero opt_bytes_ratio_2={ratios[2]:.4f} opt_bytes_ratio_3={ratios[3]:.4f} wire_ratio={wire:.4f} "
          f"step_ratio={step['zero'] / step['plain']:.3f} opt_bytes_expected_2={expected[2]:.4f} "
          f"opt_bytes_expected_3={expected[3]:.4f} " + " ".join(f"largest_{name}={count:.3g}"
                                                                 for name, count in largest.items()), flush=True)


def _bytes_on(variables, device, skip=()):
    """Bytes of the (components of the) variables that live on ``device``."""
    import tensorflow as tf

    total = 0
    for v in variables:
        if any(word in v.name for word in skip):
            continue
        v = v.value if hasattr(v, "value") and not isinstance(v, tf.Variable) else v  # Keras 3 wraps it
        for part in getattr(v, "values", (v,)):
            if part.device.endswith(device):
                total += part.shape.num_elements() * tf.as_dtype(part.dtype).size
    return total


if __name__ == "__main__":
    sys.exit(main())
