"""NaNGuard's cost: the demo's training (digits CNN, DataParallel on 2 virtual CPU devices,
global batch 64) with and without `tfpar.callbacks.NaNGuard()`, side by side in one process.

    python bench/nan_guard.py [--quick]

The two models train in turns (without, with, with, without, ...), one epoch each turn after a
first untimed epoch each; the guard's check runs after every step (check="batch"). Keras' own
progress bar is off in both (verbose=0), so the guard's per-step read of the loss is not hidden
behind the bar's. Goal: overhead <= 1.02.

Last line:
    RESULT nan_guard overhead=<median epoch time with the guard / without>
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from common import median_seconds_in_turns, print_step_times, quick_options  # noqa: E402

import tfpar  # noqa: E402


def main():
    opts = quick_options(__doc__)
    rounds = 1 if opts.quick else 8
    tfpar.configure_devices(2)
    import tensorflow as tf

    from tfpar.demo import build_model, load_digits

    keras = tfpar.keras
    strategy = tfpar.DataParallel()
    (x, y), _ = load_digits()
    train = tfpar.data.distribute(
        tf.data.Dataset.from_tensor_slices((x, y)), strategy, 64, shuffle_buffer=len(x), seed=0
    )
    runs = {}

    def epoch(name):
        model, callbacks = runs[name]
        model.fit(
            train.dataset,
            steps_per_epoch=train.steps_per_epoch,
            epochs=1,
            verbose=0,
            callbacks=callbacks,
        )

    for name in ("plain", "guarded"):
        with strategy.scope():
            model = build_model()
            model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy")
        callbacks = [tfpar.callbacks.NaNGuard()] if name == "guarded" else []
        runs[name] = (model, callbacks)
        epoch(name)  # the first, untimed

    timed = median_seconds_in_turns(("plain", "guarded"), rounds, epoch)
    step = print_step_times(timed, train.steps_per_epoch)
    print(f"RESULT nan_guard overhead={step['guarded'] / step['plain']:.3f}")


if __name__ == "__main__":
    main()
