"""A 2-stage pipeline over the 2 workers of `tfpar launch -n 2` (``span_workers=True``) whose worker
1 is killed (SIGKILL) after the second epoch: worker 0 must fail at once, not wait. Prints
``LOST after <seconds> s: <error type>`` from worker 0.
"""

import json
import os
import signal
import time

import tfpar

tfpar.configure_devices(1)
# worker 1 serves here
pipeline = tfpar.pipeline.Pipeline(num_stages=2, num_microbatches=2, span_workers=True)

import numpy as np  # noqa: E402

k = tfpar.keras
staged = pipeline.stage(
    k.Sequential([k.Input((8,)), k.layers.Dense(16, activation="relu"), k.layers.Dense(3)])
)
staged.compile("sgd", k.losses.SparseCategoricalCrossentropy(from_logits=True))


class KillWorker1(k.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1:
            import psutil

            port = int(
                json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"][1].rsplit(":", 1)[1]
            )
            (pid,) = {
                c.pid
                for c in psutil.net_connections("tcp")
                if c.status == "LISTEN" and c.laddr.port == port
            }
            os.kill(pid, signal.SIGKILL)  # the process serving worker 1's address
            self.killed = time.monotonic()


kill = KillWorker1()
try:
    staged.fit(
        np.ones((32, 8), "float32"),
        np.zeros(32),
        batch_size=8,
        epochs=1000,
        verbose=0,
        callbacks=[kill],
    )
except Exception as error:  # noqa: BLE001 (what TensorFlow raised is the finding)
    print(f"LOST after {time.monotonic() - kill.killed:.1f} s: {type(error).__name__}", flush=True)
    raise SystemExit(3)
print("FINISHED without noticing", flush=True)
