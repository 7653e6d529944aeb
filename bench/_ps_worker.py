"""One side of the parameter-server benchmark; prints ``BENCH {json}``.

  ps  a model (--model cnn|mlp|linear) on ParameterServer.local(num_workers=2, num_ps=1), timed in fit
  dp  the same model and global batch on DataParallel over 2 virtual CPU devices
"""

import argparse
import json
import os
import statistics

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
parser = argparse.ArgumentParser()
parser.add_argument("mode", choices=["ps", "dp"])
parser.add_argument("--model", choices=["cnn", "mlp", "linear"], default="cnn")
parser.add_argument("--global-batch", type=int, default=128)
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--steps-per-execution", type=int, default=1)
parser.add_argument("--num-ps", type=int, default=1)
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
    model.compile(keras.optimizers.SGD(0.01), "sparse_categorical_crossentropy",
                  steps_per_execution=args.steps_per_execution)
train = tfpar.data.distribute(lambda: tf.data.Dataset.from_tensor_slices((x, y)), strategy, args.global_batch)
history = model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=args.epochs, verbose=0,
                    callbacks=[tfpar.callbacks.Throughput(args.global_batch)])
step = statistics.median(history.history["step_time"][1:])  # epoch 1 traces
variable_bytes = sum(int(v.shape.num_elements()) * v.dtype.size for v in model.trainable_variables)
print("BENCH " + json.dumps({"step_seconds": step, "variable_bytes": variable_bytes}), flush=True)
