"""One side of the parameter-server benchmark; prints ``BENCH {json}``.

  ps  a model (--model cnn|mlp|linear) on ParameterServer.local(num_workers=2, num_ps=1),
      timed in fit
  dp  the same model and global batch on DataParallel over 2 virtual CPU devices

For ps, also the CPU seconds each process (the coordinator, each worker and ps) spends per step
over the timed epochs, and with ``--trace`` a profile of 3 more epochs: TensorFlow's profiler on
this process and, through the profiler service every TensorFlow server runs, on each worker and
ps, summed per task into what the step's time goes to (per step).
"""

import argparse
import json
import os
import re
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
parser = argparse.ArgumentParser()
parser.add_argument("mode", choices=["ps", "dp"])
parser.add_argument("--model", choices=["cnn", "mlp", "linear"], default="cnn")
parser.add_argument("--global-batch", type=int, default=128)
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--steps-per-execution", type=int, default=1)
parser.add_argument("--num-ps", type=int, default=1)
parser.add_argument("--trace", action="store_true", help="ps: profile 3 more epochs on every task")
args = parser.parse_args()

import tfpar  # noqa: E402

if args.mode == "ps":
    from tfpar.strategies.parameter_server import ParameterServer

    strategy = ParameterServer.local(num_workers=2, num_ps=args.num_ps)
else:
    tfpar.configure_devices(2)
    strategy = tfpar.DataParallel()
import tensorflow as tf  # noqa: E402
from common import make_data, make_model  # noqa: E402

keras = tfpar.keras
x, y = make_data(args.model, args.global_batch * args.steps)
with strategy.scope():
    keras.utils.set_random_seed(0)
    model = make_model(args.model)
    model.compile(
        keras.optimizers.SGD(0.01),
        "sparse_categorical_crossentropy",
        steps_per_execution=args.steps_per_execution,
    )
train = tfpar.data.distribute(
    lambda: tf.data.Dataset.from_tensor_slices((x, y)), strategy, args.global_batch
)


def cpu_seconds(pids):
    """User + system CPU seconds of each process (Linux /proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    seconds = {}
    for name, pid in pids.items():
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        seconds[name] = (int(fields[11]) + int(fields[12])) / ticks
    return seconds


class CPUPerStep(keras.callbacks.Callback):
    """CPU seconds per step of each process, from the second epoch (the first traces) to the end."""

    def __init__(self, pids):
        super().__init__()
        self.pids, self.start, self.steps, self.per_step = pids, None, 0, {}

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 1:
            self.start = cpu_seconds(self.pids)
        elif epoch > 1:
            self.steps += train.steps_per_epoch

    def on_train_end(self, logs=None):
        end, steps = cpu_seconds(self.pids), self.steps + train.steps_per_epoch
        self.per_step = {name: (end[name] - self.start[name]) / steps for name in end}


def ps_tasks():
    """{"coordinator": pid, "worker 0": pid, ..., "ps 0": pid} and the servers' addresses."""
    cluster = strategy.config.cluster.cluster
    pids = {
        "coordinator": os.getpid(),
        **{name: proc.pid for name, proc in strategy.local_servers.items()},
    }
    return pids, {
        name: cluster[name.split()[0]][int(name.split()[1])]
        for name in pids
        if name != "coordinator"
    }


def trace_epochs(addresses, optimizer_scope, epochs=3):
    """Profiles ``epochs`` epochs on every task; returns {task: {what: ms per step}}, and for a
    worker the mean wall time of its step function ("step function ms per call") and the steps it
    ran. Per step: over the steps the workers ran while their profilers recorded."""
    import glob
    import tempfile
    import threading

    logdir = tempfile.mkdtemp(prefix="tfpar-ps-trace-")
    service = ",".join("grpc://" + address for address in addresses.values())
    remote = threading.Thread(
        target=tf.profiler.experimental.client.trace, args=(service, logdir, 8000)
    )
    remote.start()
    time.sleep(1.0)  # the servers' profilers have started
    tf.profiler.experimental.start(logdir)
    model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=epochs, verbose=0)
    tf.profiler.experimental.stop()
    remote.join()
    by_address = {address: name for name, address in addresses.items()}
    profiles = {}
    for path in glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb")):
        host = os.path.basename(path)[: -len(".xplane.pb")].replace("_", ":")
        profiles[by_address.get(host, "coordinator")] = xplane_breakdown(path, optimizer_scope)
    steps = sum(calls for _, calls, _ in profiles.values()) or train.steps_per_epoch * epochs
    return {
        task: {
            **{what: total / steps for what, total in ms.items()},
            **({"step function ms per call": call_ms / calls, "steps run": calls} if calls else {}),
        }
        for task, (ms, calls, call_ms) in profiles.items()
    }


OP_EVENT = re.compile(r"^[\w/.\-]+:(_?\w+)$")  # "scope/name:OpType", one event per op run


def xplane_breakdown(path, optimizer_scope):
    """A task's profile as ({what: milliseconds}, step function calls, their wall milliseconds).
    What: the optimizer's update ops, sends and receives of tensors between tasks, matrix products,
    other ops. Ops on different threads add up: thread time, not wall time."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    totals, calls, call_ms = {}, 0, 0.0
    for plane in space.planes:
        names = {key: meta.name for key, meta in plane.event_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                name, ms = names.get(event.metadata_id, ""), event.duration_ps / 1e9
                if name.startswith("EagerLocalExecute: __inference_train_function"):
                    calls, call_ms = calls + 1, call_ms + ms
                    continue
                op = OP_EVENT.match(name)
                if op is None or name.startswith("EagerService"):
                    # the runtime's own spans (executor, eager service), which hold the ops
                    continue
                if name.startswith(optimizer_scope + "/"):
                    what = "optimizer update ops"
                elif op.group(1) in ("_Send", "_Recv", "_HostSend", "_HostRecv"):
                    what = "send/recv"
                elif "MatMul" in op.group(1):
                    what = "matmul"
                else:
                    what = "other ops"
                totals[what] = totals.get(what, 0.0) + ms
    return totals, calls, call_ms


pids = addresses = None
callbacks = [tfpar.callbacks.Throughput(args.global_batch)]
if args.mode == "ps":
    pids, addresses = ps_tasks()
    callbacks.append(CPUPerStep(pids))
history = model.fit(
    train.dataset,
    steps_per_epoch=train.steps_per_epoch,
    epochs=args.epochs,
    verbose=0,
    callbacks=callbacks,
)
step = statistics.median(history.history["step_time"][1:])  # epoch 1 traces
variable_bytes = sum(int(v.shape.num_elements()) * v.dtype.size for v in model.trainable_variables)
result = {"step_seconds": step, "variable_bytes": variable_bytes}
if args.mode == "ps":
    result["cpu_per_step"] = callbacks[-1].per_step
    if args.trace:
        result["trace_ms_per_step"] = trace_epochs(addresses, model.optimizer.name)
print("BENCH " + json.dumps(result), flush=True)
