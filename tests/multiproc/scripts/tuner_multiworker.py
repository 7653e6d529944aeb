"""A 2-trial KerasTuner RandomSearch under a multi-worker DataParallel, run on every worker of
`tfpar launch -n N` with tfpar's callbacks; writes tuner_<i>.json (the trials as this worker saw
them, and each trial's fit logs).

Usage: tuner_multiworker.py DIRECTORY
"""

import json
import os
import sys

import numpy as np

import tfpar

strategy = tfpar.DataParallel(timeout_seconds=120)

import keras  # noqa: E402
import keras_tuner as kt  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfpar.callbacks import LearningRateWarmup, Throughput  # noqa: E402

directory = sys.argv[1]
index = tfpar.ClusterInfo.from_tf_config().worker_index


def build(hp):
    keras.utils.set_random_seed(4)
    model = keras.Sequential(
        [keras.layers.Input((6,)), keras.layers.Dense(12, activation="tanh"), keras.layers.Dense(3)]
    )
    model.compile(
        keras.optimizers.Adam(hp.Choice("lr", [1e-2, 3e-2])),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=["accuracy"],
    )
    return model


rng = np.random.default_rng(1)
x = rng.normal(size=(90, 6)).astype("float32")
y = (x[:, 0] > 0).astype("int64") + (x[:, 1] > 0).astype("int64")
train = tfpar.data.distribute(tf.data.Dataset.from_tensor_slices((x, y)), strategy, 16)
val = tfpar.data.distribute(tf.data.Dataset.from_tensor_slices((x, y)), strategy, 16)
runs = []


class Seen(Throughput):
    """Records each trial's fit logs (KerasTuner copies the callbacks for every trial)."""

    def on_train_end(self, logs=None):
        runs.append(
            {
                "strategy": type(self.model.distribute_strategy).__name__,
                "replicas": self.model.distribute_strategy.num_replicas_in_sync,
                "history": self.model.history.history,
            }
        )


# Every worker runs the same search (the same seed draws the same trials, so their collectives
# meet); KerasTuner lets only the chief report and save (the others write to temporary folders).
tuner = kt.RandomSearch(
    build,
    objective="val_accuracy",
    max_trials=2,
    seed=1,
    distribution_strategy=strategy,
    directory=directory,
    project_name="search",
)
tuner.search(
    train.dataset,
    steps_per_epoch=train.steps_per_epoch,
    epochs=2,
    validation_data=val.dataset,
    validation_steps=val.steps_per_epoch,
    verbose=0,
    callbacks=[Seen(16), LearningRateWarmup(warmup_epochs=1, scale=2)],
)
trials = [
    {"lr": t.hyperparameters.get("lr"), "status": t.status, "score": t.score}
    for t in tuner.oracle.trials.values()
]
with open(os.path.join(directory, f"tuner_{index}.json"), "w") as f:
    json.dump(
        {"trials": trials, "runs": runs, "best": tuner.get_best_hyperparameters()[0].values}, f
    )
print(
    f"worker {index}: {len(trials)} trials, best "
    f"{trials and tuner.get_best_hyperparameters()[0].values}",
    flush=True,
)
