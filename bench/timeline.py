"""The Timeline's cost: the demo's training (digits CNN, DataParallel on 2 virtual CPU devices,
global batch 64) with and without `tfpar.callbacks.Timeline`, side by side in one process.

    python bench/timeline.py [--quick]

Each turn is one fit of 4 epochs, in the order plain, timeline, exchange, exchange, timeline,
plain ("exchange": `Timeline(exchange=True)`, which also splits each step where the gradients
exist); the first epoch of each fit is not timed (a fit with a Timeline rebuilds the training
function with its timestamps, and writes the trace at its end). Keras' progress bar is off in
all. Goal: overhead <= 1.03.

Last line:
    RESULT timeline overhead=<median epoch time with the Timeline / without> overhead_exchange=<...>
"""

import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from common import quick_options  # noqa: E402

import tfpar  # noqa: E402


class EpochTimes(tfpar.keras.callbacks.Callback):
    def __init__(self, into):
        super().__init__()
        self.into = into

    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        if epoch > 0:
            self.into.append(time.perf_counter() - self.start)


def main():
    opts = quick_options(__doc__)
    rounds, epochs = (1, 2) if opts.quick else (4, 4)
    tfpar.configure_devices(2)
    import tensorflow as tf

    from tfpar.demo import compiled_model, load_digits

    strategy = tfpar.DataParallel()
    (x, y), _ = load_digits()
    train = tfpar.data.distribute(
        tf.data.Dataset.from_tensor_slices((x, y)), strategy, 64, shuffle_buffer=len(x), seed=0
    )
    models = {name: strategy.build(compiled_model) for name in ("plain", "timeline", "exchange")}
    times = {name: [] for name in models}
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(rounds):
            for name in ("plain", "timeline", "exchange", "exchange", "timeline", "plain"):
                callbacks = [EpochTimes(times[name])]
                if name != "plain":
                    callbacks.append(
                        tfpar.callbacks.Timeline(
                            os.path.join(folder, "timeline.json"), exchange=name == "exchange"
                        )
                    )
                models[name].fit(
                    train.dataset,
                    steps_per_epoch=train.steps_per_epoch,
                    epochs=epochs,
                    verbose=0,
                    callbacks=callbacks,
                )
    step = {name: statistics.median(t) / train.steps_per_epoch for name, t in times.items()}
    for name, seconds in step.items():
        print(
            f"{name:>9}: {seconds * 1e3:.2f} ms/step, "
            f"{len(times[name])} epochs of {train.steps_per_epoch} steps timed",
            flush=True,
        )
    print(
        f"RESULT timeline overhead={step['timeline'] / step['plain']:.3f} "
        f"overhead_exchange={step['exchange'] / step['plain']:.3f}"
    )


if __name__ == "__main__":
    main()
