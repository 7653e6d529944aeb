"""Trains the equivalence model on every worker of a multi-worker job (MultiWorkerDataParallel),
once per case, under one strategy (one TensorFlow start and one collective for every case).

Usage: multiworker_train.py OUT_DIR GLOBAL_BATCH EPOCHS CASE[,CASE ...] [OPTION=VALUE ...]
                             [+ CASE[,CASE ...] [OPTION=VALUE ...] ...]
Each group after a ``+`` trains its cases under a strategy of its own options, in the same
processes (a second MultiWorkerDataParallel keeps the first one's server). A CASE is
``NAME:EXAMPLES:KERAS[:OPTIMIZER]`` (KERAS 2: tf_keras, 3: Keras 3; OPTIMIZER one of
tests.models.ZERO_OPTIMIZERS, else SGD with momentum); the options are DataParallel's (e.g.
all_reduce=ring bytes_per_pack=4096 gradient_accumulation_steps=2 zero_stage=1, a list as
remat=[conv2d*]), and ``zero_bucket_bytes=N``, which sets ZeRO's bucket size for the group
(`tfpar.strategies._zero_state.BUCKET_BYTES`). With zero_stage, each worker also writes the
weights with the optimizer state: ckpt_<i> (tf_keras' TF format, Keras 3's .weights.h5), and
FaultTolerance backs them up after each epoch in OUT_DIR/NAME/backup. Each case writes to
OUT_DIR/NAME: start_<i>.npz and local_start_<i>.npz (the weights after creation, and those the
worker drew alone), worker_<i>.npz (the trained weights) and, without OPTIMIZER, scored_<i>.npz
(evaluate's loss on the padded input, predict's output on every example).
"""

import importlib
import os
import sys

import numpy as np
from in_turn import split_at  # this folder's

import tfpar
from tfpar.strategies import _zero_state

DEFAULT_BUCKET_BYTES = _zero_state.BUCKET_BYTES

out, global_batch, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])


def _groups(argv):
    """[(cases, options)] of the groups of ``argv`` (CASES [OPTION=VALUE ...], joined by "+")."""
    return [
        (
            [case.split(":") for case in cases.split(",")],
            {k: _value(v) for k, v in (a.split("=", 1) for a in options)},
        )
        for cases, *options in split_at(argv, "+")
    ]


def _value(text):
    """An option's value: a number, a list (``[a,b]``) or a string."""
    if text.isdigit():
        return int(text)
    if text.startswith("["):
        return text.strip("[]").split(",")
    return text


def _strategy(options):
    """A DataParallel of a group's ``options``, ZeRO's buckets as they say (else the default)."""
    _zero_state.BUCKET_BYTES = options.get("zero_bucket_bytes", DEFAULT_BUCKET_BYTES)
    dp_options = {k: v for k, v in options.items() if k != "zero_bucket_bytes"}
    return tfpar.DataParallel(timeout_seconds=120, **dp_options)


groups = _groups(sys.argv[4:])
strategy = _strategy(groups[0][1])

import tensorflow as tf  # noqa: E402

from tests.models import (  # noqa: E402
    compile_for_equivalence,
    equivalence_data,
    equivalence_model,
    zero_optimizer,
)

index = tfpar.ClusterInfo.from_tf_config().worker_index
# only the strategy's broadcast can make the workers start alike
seed = 1 if index == 0 else 100 + index


def train_case(strategy, name, examples, keras_version, *optimizer, options):
    k = importlib.import_module("keras") if keras_version == "3" else tfpar.keras
    folder = os.path.join(out, name)
    os.makedirs(folder, exist_ok=True)
    x, y = equivalence_data(int(examples))
    local_start = equivalence_model(seed, k).get_weights()
    with strategy.scope():
        model = equivalence_model(seed, k)
        compile_for_equivalence(model, k)
        if optimizer:
            model.compile(zero_optimizer(k, optimizer[0]), model.loss)
    np.savez(os.path.join(folder, f"start_{index}.npz"), *model.get_weights())
    np.savez(os.path.join(folder, f"local_start_{index}.npz"), *local_start)
    print(strategy.describe(global_batch_size=global_batch, model=model), flush=True)
    data = tfpar.data.distribute(tf.data.Dataset.from_tensor_slices((x, y)), strategy, global_batch)
    # sharded: backed up after each epoch, the chief's backup gathered from both workers
    backups = [
        tfpar.callbacks.FaultTolerance(os.path.join(folder, "backup"), delete_checkpoint=False)
    ]
    model.fit(
        data.dataset,
        steps_per_epoch=data.steps_per_epoch,
        epochs=epochs,
        verbose=2,
        callbacks=backups if options.get("zero_stage") else [],
    )
    np.savez(os.path.join(folder, f"worker_{index}.npz"), *model.get_weights())
    if options.get("zero_stage"):
        model.save_weights(
            os.path.join(folder, f"ckpt_{index}" + (".weights.h5" if keras_version == "3" else ""))
        )
    if optimizer:  # the sharded cases: evaluate and predict are the default job's
        return
    scores = model.evaluate(data.dataset, steps=data.steps_per_epoch, verbose=0, return_dict=True)
    np.savez(
        os.path.join(folder, f"scored_{index}.npz"),
        loss=scores["loss"],
        predictions=model.predict(x, batch_size=global_batch, verbose=0),
    )


for number, (cases, options) in enumerate(groups):
    if number:
        strategy = _strategy(options)
    for case in cases:
        train_case(strategy, *case, options=options)
