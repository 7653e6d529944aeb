"""Large-batch benchmark: a base batch against 16 times that batch, plain and with LAMB/LARS, the
scaling rule and a warm-up, trained side by side on one generated task.

    python bench/large_batch.py [--quick]

The task: 120,000 generated examples (100,000 to train, 20,000 to validate) of 32 Gaussian
features, labelled by a random teacher network (32 -> 16 tanh units -> 10 classes, the argmax). The
model: an MLP of 2 hidden layers of 256 with a LayerNormalization between them (its biases and the
LayerNorm excluded from weight decay and trust ratio). Every run trains it under
`tfpar.DataParallel` on 2 virtual CPU devices for the same 6 epochs, with the same cosine decay of
the rate to 0 over the epochs after the warm-up (the papers' budget: the same epochs, 16 times fewer
steps):

- base: global batch 64, SGD with momentum 0.9 at 0.05 (the model's own optimizer);
- big_plain: batch 1,024, the same SGD at the linearly scaled rate, 0.8 (Goyal et al.'s rule, no
  warm-up);
- big_adaptive: batch 1,024, LAMB at 5e-3 scaled by the square-root rule to 0.02, warmed up over
  epoch 1;
- big_lars: batch 1,024, LARS (eta 0.001) at the linearly scaled rate, warmed up over epoch 1;
- big_plain_warmup: batch 1,024, SGD at 0.8 warmed up over epoch 1 (Goyal et al.'s whole recipe).

The validation accuracy is measured 4 times per epoch; the steps to the target are the first step at
which it reached ``target`` (0.90: base reaches it in epoch 4 on this task), or -1 for never.

Last line:
    RESULT large_batch base_acc=<a> big_plain_acc=<a> big_adaptive_acc=<a> adaptive_gap=<g>
           plain_gap=<g> big_lars_acc=<a> big_plain_warmup_acc=<a> target=<t> base_steps=<n>
           big_plain_steps=<n> big_adaptive_steps=<n> big_lars_steps=<n> big_plain_warmup_steps=<n>

Accuracies are fractions (0.5 point = 0.005); a gap is base_acc minus that run's (negative: better
than the base batch); ``*_steps``: the steps to the target.
"""

import sys
import time

import numpy as np
from common import quick_options

import tfpar

NO_DECAY = ["bias", "layer_normalization"]


def task(n, seed=0, features=32, hidden=16, classes=10):
    """``(x, y), (x_val, y_val)``: a random teacher's labels of Gaussian inputs, the last sixth held
    out."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype("float32")
    w1 = rng.normal(size=(features, hidden)) / np.sqrt(features)
    w2 = rng.normal(size=(hidden, classes))
    y = np.argmax(np.tanh(x @ w1) @ w2, axis=1)
    split = n * 5 // 6
    return (x[:split], y[:split]), (x[split:], y[split:])


def model(k):
    k.utils.set_random_seed(1)
    return k.Sequential(
        [
            k.Input((32,)),
            k.layers.Dense(256, activation="relu"),
            k.layers.LayerNormalization(name="layer_normalization"),
            k.layers.Dense(256, activation="relu"),
            k.layers.Dense(10),
        ]
    )


class Accuracy(tfpar.keras.callbacks.Callback):
    """The validation accuracy ``per_epoch`` times per epoch (the last at its end), with the
    step."""

    def __init__(self, validation, steps_per_epoch, per_epoch=4):
        super().__init__()
        self.x, self.y = validation
        self.steps_per_epoch, self.every = steps_per_epoch, max(1, steps_per_epoch // per_epoch)
        self.curve, self.epochs, self.step = [], [], 0

    def measure(self):
        logits = self.model.predict(self.x, batch_size=4096, verbose=0)
        self.curve.append((self.step, float(np.mean(np.argmax(logits, axis=1) == self.y))))

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        if (batch + 1) % self.every == 0 and batch + 1 < self.steps_per_epoch:
            self.measure()

    def on_epoch_end(self, epoch, logs=None):
        self.measure()
        self.epochs.append(self.curve[-1][1])


def run(name, batch, make_optimizer, rate, warmup, data, epochs):
    """Trains one run; returns (final validation accuracy, its curve)."""
    from tfpar.callbacks import LearningRateSchedule, LearningRateWarmup, cosine_decay

    k = tfpar.keras
    (x, y), validation = data
    strategy = tfpar.DataParallel()
    with strategy.scope():
        net = model(k)
        # a warm-up climbs from the base batch's rate
        optimizer = make_optimizer(rate / 16 if warmup else rate)
        net.compile(optimizer, k.losses.SparseCategoricalCrossentropy(from_logits=True))
    steps = len(x) // batch
    accuracy = Accuracy(validation, steps)
    callbacks = [
        LearningRateSchedule(
            cosine_decay(warmup, epochs),
            initial_lr=rate,
            scale=1,
            start_epoch=warmup,
            staircase=False,
        ),
        accuracy,
    ]
    if warmup:
        callbacks.insert(
            0, LearningRateWarmup(warmup_epochs=warmup, scale=16, initial_lr=rate / 16)
        )
    started = time.perf_counter()
    net.fit(
        x, y, batch_size=batch, epochs=epochs, steps_per_epoch=steps, verbose=0, callbacks=callbacks
    )
    final = accuracy.epochs[-1]
    print(
        f"{name:>17}: batch {batch:5d}, {accuracy.step:6d} steps, validation accuracy "
        + " ".join(f"{a:.4f}" for a in accuracy.epochs)
        + f" (per epoch), {time.perf_counter() - started:.0f} s",
        flush=True,
    )
    return final, accuracy.curve


def steps_to(curve, target):
    return next((step for step, value in curve if value >= target), -1)


def main():
    args = quick_options(__doc__)
    tfpar.configure_devices(2)
    from tfpar.callbacks import scaled_learning_rate
    from tfpar.optimizers import LAMB, LARS

    k = tfpar.keras
    n, epochs, base_batch = (12_000, 2, 64) if args.quick else (120_000, 6, 64)
    data = task(n)
    big = 16 * base_batch
    sgd = lambda rate: k.optimizers.SGD(rate, momentum=0.9)  # noqa: E731
    runs = {
        "base": (base_batch, sgd, 0.05, 0),
        "big_plain": (big, sgd, scaled_learning_rate(0.05, big, base_batch, "linear"), 0),
        "big_adaptive": (
            big,
            lambda rate: LAMB(rate, weight_decay=1e-4, exclude_from_weight_decay=NO_DECAY),
            scaled_learning_rate(5e-3, big, base_batch, "sqrt"),
            1,
        ),
        "big_lars": (
            big,
            lambda rate: LARS(
                rate, momentum=0.9, eta=0.001, weight_decay=1e-4, exclude_from_weight_decay=NO_DECAY
            ),
            scaled_learning_rate(LARS_BASE_RATE, big, base_batch, "linear"),
            1,
        ),
        "big_plain_warmup": (big, sgd, scaled_learning_rate(0.05, big, base_batch, "linear"), 1),
    }
    target = 0.90
    results = {name: run(name, *settings, data, epochs) for name, settings in runs.items()}
    acc = {name: final for name, (final, _) in results.items()}
    figures = {
        "base_acc": acc["base"],
        "big_plain_acc": acc["big_plain"],
        "big_adaptive_acc": acc["big_adaptive"],
        "adaptive_gap": acc["base"] - acc["big_adaptive"],
        "plain_gap": acc["base"] - acc["big_plain"],
        "big_lars_acc": acc["big_lars"],
        "big_plain_warmup_acc": acc["big_plain_warmup"],
    }
    line = " ".join(f"{key}={value:.4f}" for key, value in figures.items())
    steps = " ".join(
        f"{name}_steps={steps_to(curve, target)}" for name, (_, curve) in results.items()
    )
    print(f"RESULT large_batch {line} target={target} {steps}", flush=True)


LARS_BASE_RATE = 0.3125
"""LARS' rate at the base batch (5 at 16 times it, with eta 0.001: a step of about 0.5 % of each
layer's norm)."""

if __name__ == "__main__":
    sys.exit(main())
