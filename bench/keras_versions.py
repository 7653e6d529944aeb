"""Keras 3 against tf_keras: the demo's model (digits CNN, DataParallel on 2 virtual CPU devices,
global batch 64, Adam) built in each Keras, trained side by side in one process.

    python bench/keras_versions.py [--quick]

The two models train in turns (tf_keras, Keras 3, Keras 3, tf_keras, ...), one epoch each turn
after a first untimed epoch each; the step time is the median epoch time over the steps of an
epoch. No target: the ratio is reported.

Last line:
    RESULT keras_versions step_time_ratio=<Keras 3 step time / tf_keras step time>
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from common import median_seconds_in_turns, print_step_times, quick_options  # noqa: E402

import tfpar  # noqa: E402


def main():
    opts = quick_options(__doc__)
    rounds = 1 if opts.quick else 6
    tfpar.configure_devices(2)
    import keras as keras3
    import tensorflow as tf

    from tfpar.demo import build_model, load_digits

    strategy = tfpar.DataParallel()
    (x, y), _ = load_digits()
    train = tfpar.data.distribute(
        tf.data.Dataset.from_tensor_slices((x, y)), strategy, 64, shuffle_buffer=len(x), seed=0
    )
    runs = {}
    for name, k in (("tf_keras", tfpar.keras), ("keras3", keras3)):
        model = strategy.build(lambda k=k: build_model(k))
        with strategy.scope():
            model.compile(k.optimizers.Adam(1e-3), "sparse_categorical_crossentropy")
        # traces
        model.fit(
            train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=1, verbose=0, shuffle=False
        )
        runs[name] = model

    def epoch(name):
        runs[name].fit(
            train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=1, verbose=0, shuffle=False
        )

    timed = median_seconds_in_turns(("tf_keras", "keras3"), rounds, epoch)
    step = print_step_times(timed, train.steps_per_epoch)
    print(f"RESULT keras_versions step_time_ratio={step['keras3'] / step['tf_keras']:.3f}")


if __name__ == "__main__":
    main()
