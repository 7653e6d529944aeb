"""One worker of a coverage job: records which example ids its replicas were fed.

Usage (under tfpar launch): coverage_worker.py N GLOBAL_BATCH OUT_DIR [--die-after-epoch K | --files
SIZES]

With ``--files 5,9,3,6`` the ids come from TFRecord files of those sizes in OUT_DIR (written
by the test, `tests.models.write_id_files`), counted once for the job (each worker its share).
"""

import json
import os
import sys

import tfpar

n, global_batch, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
die_after = int(sys.argv[5]) if len(sys.argv) > 5 and sys.argv[4] == "--die-after-epoch" else None
file_sizes = (
    [int(v) for v in sys.argv[5].split(",")]
    if len(sys.argv) > 5 and sys.argv[4] == "--files"
    else None
)

strategy = tfpar.DataParallel(timeout_seconds=float(os.environ.get("COLLECTIVE_TIMEOUT", "60")))
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

keras = tfpar.keras
worker = tfpar.ClusterInfo.from_tf_config().worker_index
ids = np.arange(n, dtype="float32")
source = tf.data.Dataset.from_tensor_slices((ids[:, None], ids))
options = {}
if file_sizes:
    import logging

    from tests.models import read_id_file

    logging.basicConfig()
    logging.getLogger("tfpar.data").setLevel(logging.INFO)
    source = sorted(os.path.join(out, f) for f in os.listdir(out) if f.endswith(".tfrecord"))
    options = {"reader": read_id_file}
train = tfpar.data.distribute(source, strategy, global_batch, **options)

# One epoch read through the distributed iterator: the ids each local replica got.
iterator = iter(train.dataset)
seen = []
for _ in range(train.steps_per_epoch):
    batch = next(iterator)
    for x, y, w in zip(*(strategy.experimental_local_results(t) for t in batch)):
        seen += [int(v) for v, keep in zip(y.numpy(), w.numpy()) if keep > 0]

# Then fit for several epochs: every epoch end must pass without a hang.
with strategy.scope():
    model = keras.Sequential([keras.layers.Input((1,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(1e-3), "mse")


class Die(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if die_after is not None and worker == 1 and epoch + 1 == die_after:
            print("worker 1 dies now", flush=True)
            os._exit(9)


history = model.fit(
    train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=3, verbose=2, callbacks=[Die()]
)
with open(os.path.join(out, f"worker_{worker}.json"), "w") as f:
    json.dump(
        {"seen": seen, "steps": train.steps_per_epoch, "epochs": len(history.history["loss"])}, f
    )
print("done", flush=True)
