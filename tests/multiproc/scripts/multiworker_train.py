"""Trains the equivalence model on every worker of `tfpar launch -n N` (MultiWorkerDataParallel);
writes worker_<i>.npz (weights) and scored_<i>.npz (evaluate's loss on the padded input, predict's
output on every example).

Usage: multiworker_train.py OUT_DIR GLOBAL_BATCH EPOCHS EXAMPLES [OPTION=VALUE ...]
(DataParallel's options, e.g. all_reduce=ring bytes_per_pack=4096 gradient_accumulation_steps=2)
(the model in Keras 3 when $TFPAR_TEST_KERAS is "3")
"""

import os
import sys

import numpy as np

import tfpar

out, global_batch, epochs, examples = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
options = {key: int(value) if value.isdigit() else value for key, value in (a.split("=", 1) for a in sys.argv[5:])}
strategy = tfpar.DataParallel(timeout_seconds=120, **options)

import tensorflow as tf  # noqa: E402

from tests.models import compile_for_equivalence, equivalence_data, equivalence_model, keras_of_env  # noqa: E402

k = keras_of_env()
x, y = equivalence_data(examples)
index = tfpar.ClusterInfo.from_tf_config().worker_index
seed = 1 if index == 0 else 100 + index  # only the strategy's broadcast can make the workers start alike
local_start = equivalence_model(seed, k).get_weights()
with strategy.scope():
    model = equivalence_model(seed, k)
    compile_for_equivalence(model, k)
np.savez(os.path.join(out, f"start_{index}.npz"), *model.get_weights())
np.savez(os.path.join(out, f"local_start_{index}.npz"), *local_start)
print(strategy.describe(global_batch_size=global_batch, model=model), flush=True)
train = tfpar.data.distribute(tf.data.Dataset.from_tensor_slices((x, y)), strategy, global_batch)
model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=epochs, verbose=2)
np.savez(os.path.join(out, f"worker_{index}.npz"), *model.get_weights())
scores = model.evaluate(train.dataset, steps=train.steps_per_epoch, verbose=0, return_dict=True)
np.savez(os.path.join(out, f"scored_{index}.npz"), loss=scores["loss"],
         predictions=model.predict(x, batch_size=global_batch, verbose=0))
