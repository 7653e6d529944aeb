"""One worker of bench/model_parallel.py's pipeline jobs: a 2-stage pipeline on 2 virtual CPU
devices, fed a fixed batch per worker by tfpar.data; prints ``BENCH {json}`` (its median step time)
on worker 0. Run alone, or under `tfpar launch -n 2` (then the workers are data-parallel replicas);
with ``span``, under `tfpar launch -n 2`, one pipeline whose 2 stages are on the 2 workers' one
device each (``span_workers=True``).

Usage: _model_parallel_worker.py PER_WORKER_BATCH STEPS DIM HIDDEN [span]
"""

import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tfpar  # noqa: E402

per_worker, steps, dim, hidden = (int(a) for a in sys.argv[1:5])
span = sys.argv[5:] == ["span"]
tfpar.configure_devices(1 if span else 2)
# first: it joins the job
pipeline = tfpar.pipeline.Pipeline(num_stages=2, num_microbatches=4, span_workers=span)
import tensorflow as tf  # noqa: E402

from tfpar.demo.tokens import token_data, transformer  # noqa: E402

workers = pipeline.topology.num_workers
x, y = token_data(per_worker * workers * steps, vocab=256, length=32)
model = pipeline.stage(transformer(vocab=256, length=32, dim=dim, heads=8, blocks=4, hidden=hidden))
model.compile(
    tfpar.keras.optimizers.Adam(1e-3),
    tfpar.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
)
train = tfpar.data.distribute(
    tf.data.Dataset.from_tensor_slices((x, y)), pipeline, per_worker * workers
)


class StepTimes(tfpar.keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        self.start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.times.append(time.perf_counter() - self.start)


timer = StepTimes()
model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=1, verbose=0)  # traces
timer.times = []
model.fit(
    train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=2, verbose=0, callbacks=[timer]
)
if pipeline.topology.is_chief:
    print(
        "BENCH " + json.dumps({"step": statistics.median(timer.times), "workers": workers}),
        flush=True,
    )
