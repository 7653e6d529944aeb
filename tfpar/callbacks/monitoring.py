"""Callbacks that make a distributed run's numbers global and visible, and guard it.

- `MetricAverage`: epoch logs averaged across workers (worker 0 prints the global value);
- `Throughput`: examples/second in total and per worker, step time, scaling efficiency;
- `NaNGuard`: stops every worker at the same step when the loss stops being finite, and
  puts back the last good weights.

All three use epoch-level hooks by default, so they also run under ParameterServer
(where Keras refuses batch-level ones).
"""

import math
import time

from tfpar._keras import keras, tf
from tfpar.callbacks._hooks import EpochLevelUnderCoordinator

__all__ = ["MetricAverage", "NaNGuard", "Throughput", "num_workers"]


def num_workers(strategy):
    """How many worker processes train under ``strategy`` (1 for a one-process strategy)."""
    if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        return strategy.extended._num_workers
    try:
        local = len(strategy.extended.worker_devices) or 1
    except RuntimeError:  # the default strategy (no scope): one process, one device
        return 1
    return max(1, strategy.num_replicas_in_sync // local)


class MetricAverage(keras.callbacks.Callback):
    """Averages the epoch's numeric logs over the workers, in place, at each epoch's end.

    Keras' own loss and compiled metrics are already global under tfpar's strategies;
    this is for numbers computed per worker (a callback's figures, a custom metric
    read on each worker). Every worker must log the same keys. Put it before the
    callbacks that read those numbers (the progress bar and History come last anyway).

    Args:
        keys: the log keys to average (default: every numeric one).
    """

    def __init__(self, keys=None):
        super().__init__()
        self.keys = None if keys is None else list(keys)

    def on_epoch_end(self, epoch, logs=None):
        strategy = self.model.distribute_strategy
        if logs is None or num_workers(strategy) == 1 or \
                isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
            return  # one process: nothing to average (a PS coordinator is one process)
        keys = sorted(k for k, v in logs.items() if isinstance(v, (int, float)) or hasattr(v, "dtype"))
        if self.keys is not None:
            keys = [k for k in self.keys if k in logs]
        if not keys:
            return
        values = tf.constant([float(logs[k]) for k in keys], tf.float64)
        summed = strategy.run(
            lambda v: tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, v), args=(values,))
        # Each worker's value was counted once per local replica.
        mean = strategy.experimental_local_results(summed)[0].numpy() / strategy.num_replicas_in_sync
        for key, value in zip(keys, mean):
            logs[key] = float(value)


class Throughput(keras.callbacks.Callback):
    """Logs ``examples_per_second`` (total), ``examples_per_second_per_worker``, ``step_time`` and,
    given a one-replica reference, ``scaling_efficiency`` at each epoch's end.

    Scaling efficiency = total examples/s ÷ (reference examples/s × replicas): 1.0 is
    perfect linear scaling. The first epoch includes tracing; compare later ones.

    Args:
        global_batch_size: examples per step over all replicas.
        reference_examples_per_second: what one replica alone reaches (measured by you,
            e.g. with this callback on one device), or None.
        log_dir: a TensorBoard directory for the same numbers as scalars, or None.

    Raises:
        ValueError: a batch size or reference that is not positive.
    """

    def __init__(self, global_batch_size, reference_examples_per_second=None, log_dir=None):
        super().__init__()
        if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, int) or global_batch_size < 1:
            raise ValueError(f"global_batch_size must be an int >= 1. Received: {global_batch_size!r}.")
        if reference_examples_per_second is not None and not reference_examples_per_second > 0:
            raise ValueError("reference_examples_per_second must be > 0 (or None). Received: "
                             f"{reference_examples_per_second!r}.")
        self.global_batch_size = global_batch_size
        self.reference = reference_examples_per_second
        self.log_dir = log_dir
        self._writer = None

    def on_train_begin(self, logs=None):
        if self.log_dir is not None and self.model.distribute_strategy.extended.should_checkpoint:
            self._writer = tf.summary.create_file_writer(self.log_dir)

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        seconds = time.perf_counter() - self._start
        steps = self.params.get("steps") or 1
        strategy = self.model.distribute_strategy
        total = steps * self.global_batch_size / seconds
        numbers = {"examples_per_second": total,
                   "examples_per_second_per_worker": total / num_workers(strategy),
                   "step_time": seconds / steps}
        if self.reference:
            numbers["scaling_efficiency"] = total / (self.reference * strategy.num_replicas_in_sync)
        if logs is not None:
            logs.update(numbers)
        if self._writer is not None:
            with self._writer.as_default():
                for name, value in numbers.items():
                    tf.summary.scalar(f"throughput/{name}", value, step=epoch)
            self._writer.flush()

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class NaNGuard(EpochLevelUnderCoordinator, keras.callbacks.Callback):
    """Stops training when the loss is NaN or infinite, on every worker at the same step, and
    restores the weights of the last check that found a finite loss.

    Under tfpar's strategies the logged loss is the global one (reduced over all
    replicas), so every worker sees the same value at the same step and they stop
    together: none is left waiting in a collective.

    Args:
        check: "batch" (after every step; at epoch ends under ParameterServer, which has no
            batch hooks) or "epoch".
    """

    def __init__(self, check="batch"):
        super().__init__()
        if check not in ("batch", "epoch"):
            raise ValueError(f"check must be 'batch' or 'epoch'. Received: check={check!r}.")
        self.check = check
        self.stopped_at_step = None
        """The optimizer step at which the guard stopped training, or None."""

    def on_train_begin(self, logs=None):
        self.stopped_at_step = None
        self._good = self.model.get_weights()

    def _inspect(self, logs):
        loss = (logs or {}).get("loss")
        if loss is None:
            return
        if math.isfinite(float(loss)):
            self._good = self.model.get_weights()
            return
        self.stopped_at_step = int(self.model.optimizer.iterations.numpy())
        self.model.set_weights(self._good)
        self.model.stop_training = True
        if self.model.distribute_strategy.extended.should_checkpoint:
            print(f"tfpar: loss {float(loss)} at step {self.stopped_at_step}: training stopped, the last "
                  "weights with a finite loss restored", flush=True)

    def on_train_batch_end(self, batch, logs=None):
        if self.check == "batch":
            self._inspect(logs)

    def on_epoch_end(self, epoch, logs=None):
        self._inspect(logs)
