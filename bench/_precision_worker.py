"""One side of the precision benchmark: ``python _precision_worker.py POLICY`` prints
``BENCH {json}`` with the median training step time of the MLP under that policy."""

import json
import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tfpar  # noqa: E402

policy, steps, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tfpar.configure_devices(1)
tfpar.precision.use(policy)
import tensorflow as tf  # noqa: E402
from common import make_data, make_model  # noqa: E402

keras = tfpar.keras
keras.utils.set_random_seed(0)
model = make_model("mlp")
model.compile(keras.optimizers.SGD(0.01), "sparse_categorical_crossentropy")
x, y = make_data("mlp", 256 * steps)
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(256, drop_remainder=True).repeat()
history = model.fit(
    dataset,
    steps_per_epoch=steps,
    epochs=epochs + 1,
    verbose=0,
    callbacks=[tfpar.callbacks.Throughput(256)],
)
print(
    "BENCH " + json.dumps({"step_seconds": statistics.median(history.history["step_time"][1:])}),
    flush=True,
)
