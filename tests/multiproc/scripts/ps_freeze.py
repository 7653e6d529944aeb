"""The chief of `tfpar launch --ps 1 -n 2`: trains 4 epochs; at the start of epoch 2 it SIGSTOPs
the worker 1 server of its own cluster (found by its TF_CONFIG), which then holds its steps."""

import json
import os
import signal

import tfpar
from tfpar.strategies.parameter_server import ParameterServer

strategy = ParameterServer()
from tests.models import ps_sum_regression  # noqa: E402

keras = tfpar.keras
cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]


def worker_1_pid():
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
            config = json.loads(env.get(b"TF_CONFIG", b"{}"))
        except (OSError, ValueError):
            continue
        if config.get("cluster") == cluster and config.get("task") == {
            "type": "worker",
            "index": 1,
        }:
            return int(pid)
    raise RuntimeError("worker 1 not found")


class FreezeWorker1(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 1:
            print("FREEZING worker 1", flush=True)
            os.kill(worker_1_pid(), signal.SIGSTOP)


model, train = ps_sum_regression(strategy, 2048)
model.fit(
    train.dataset,
    steps_per_epoch=train.steps_per_epoch,
    epochs=4,
    verbose=2,
    callbacks=[FreezeWorker1()],
)
print("finished", flush=True)
