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
from collections.abc import Sequence
from typing import Any

from tfpar import _compat
from tfpar._checks import check_choice, check_int, check_names, check_number
from tfpar._keras import keras, tf
from tfpar._topology import topology_of
from tfpar.callbacks._hooks import EpochLevelUnderCoordinator, chief_print
from tfpar.strategies._windows import steps_trained

__all__ = ["MetricAverage", "NaNGuard", "Throughput", "num_workers"]


def num_workers(strategy: Any) -> int:
    """How many worker processes train under ``strategy`` (1 for a one-process strategy)."""
    return topology_of(strategy).num_workers


class MetricAverage(keras.callbacks.Callback):
    """Averages the epoch's numeric logs over the workers, in place, at each epoch's end.

    Keras' own loss and compiled metrics are already global under tfpar's strategies;
    this is for numbers computed per worker (a callback's figures, a custom metric
    read on each worker). Every worker must log the same keys. Put it before the
    callbacks that read those numbers (the progress bar and History come last anyway).

    Args:
        keys: the log keys to average (default: every numeric one).
    """

    def __init__(self, keys: Sequence[str] | None = None) -> None:
        super().__init__()
        self.keys = None if keys is None else list(check_names("keys", keys))

    def on_epoch_end(self, epoch, logs=None):
        strategy = self.model.distribute_strategy
        topology = topology_of(strategy)
        if logs is None or topology.num_workers == 1 or topology.coordinator:
            return  # one process: nothing to average (a PS coordinator is one process)
        keys = sorted(
            k for k, v in logs.items() if isinstance(v, (int, float)) or hasattr(v, "dtype")
        )
        if self.keys is not None:
            keys = [k for k in self.keys if k in logs]
        if not keys:
            return
        values = tf.constant([float(logs[k]) for k in keys], tf.float64)
        summed = strategy.run(
            lambda v: tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, v),
            args=(values,),
        )
        # Each worker's value was counted once per local replica.
        mean = (
            strategy.experimental_local_results(summed)[0].numpy() / strategy.num_replicas_in_sync
        )
        for key, value in zip(keys, mean):
            logs[key] = float(value)


class Throughput(keras.callbacks.Callback):
    """Logs ``examples_per_second`` (total), ``examples_per_second_per_worker``, ``step_time`` and,
    given a one-replica reference, ``scaling_efficiency`` at each epoch's end.

    Scaling efficiency = total examples/s ÷ (reference examples/s × replicas): 1.0 is
    perfect linear scaling. The first epoch includes tracing; compare later ones. An epoch's time
    ends where ``fit``'s validation begins: the validation's batches are not training steps.

    Args:
        global_batch_size: examples per step over all replicas.
        reference_examples_per_second: what one replica alone reaches (measured by you,
            e.g. with this callback on one device), or None.
        log_dir: a TensorBoard directory for the same numbers as scalars, or None.

    Raises:
        ValueError: a batch size or reference that is not positive.
    """

    def __init__(
        self,
        global_batch_size: int,
        reference_examples_per_second: float | None = None,
        log_dir: str | None = None,
    ) -> None:
        super().__init__()
        check_int("global_batch_size", global_batch_size, 1)
        check_number(
            "reference_examples_per_second", reference_examples_per_second, above=0, allow_none=True
        )
        self.global_batch_size = global_batch_size
        self.reference = reference_examples_per_second
        self.log_dir = log_dir
        self._writer = None

    def on_train_begin(self, logs=None):
        if self.log_dir is not None and self.model.distribute_strategy.extended.should_checkpoint:
            self._writer = tf.summary.create_file_writer(self.log_dir)

    def on_epoch_begin(self, epoch, logs=None):
        self._start, self._end = time.perf_counter(), None

    def on_test_begin(self, logs=None):
        # fit's validation: not a training step
        if getattr(self, "_start", None) is not None and self._end is None:
            self._end = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        seconds = (self._end or time.perf_counter()) - self._start
        self._start = None
        steps = self.params.get("steps") or 1
        strategy = self.model.distribute_strategy
        total = steps * self.global_batch_size / seconds
        numbers = {
            "examples_per_second": total,
            "examples_per_second_per_worker": total / num_workers(strategy),
            "step_time": seconds / steps,
        }
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
    restores the last weights whose loss was finite.

    The loss a step logs was computed on the weights from before that step's update, so
    the guard copies the weights at each step's start and keeps that copy once the step's
    loss proves finite: when a later loss is not, the weights of the last finite step are
    put back, not the update that diverged. The copies stay on the devices (two buffers of
    variables beside the model's, alternating, so the good one is never overwritten); no
    weight goes through the host.

    Under tfpar's strategies the logged loss is the global one (reduced over all
    replicas), so every worker sees the same value at the same step and they stop
    together: none is left waiting in a collective. A logged batch loss is the epoch's
    running mean, which stays finite exactly while every step's loss is.

    Args:
        check: "batch" (after every step; at epoch ends under ParameterServer, which has no
            batch hooks) or "epoch" (the weights at the start of the last finite epoch).
    """

    def __init__(self, check: str = "batch") -> None:
        super().__init__()
        _compat.take_logs_as_they_are(self)  # only the loss is read, once a step
        check_choice("check", check, ("batch", "epoch"))
        self.check = check
        self.stopped_at_step = None
        """The training step at which the guard stopped training, or None (``fit``'s steps, under
        gradient accumulation too, where the optimizer's ``iterations`` count updates)."""
        self.restored_step = None
        """The training step whose starting weights were put back (its loss was finite), or None."""

    def on_train_begin(self, logs=None):
        self.stopped_at_step = self.restored_step = None
        self._per_batch = self.check == "batch" and self._implements_train_batch_hooks()
        weights = self.model.weights
        # once per model, not per fit
        if getattr(self, "_buffers_for", None) != [id(w) for w in weights]:
            self._buffers = [
                [tf.Variable(w, trainable=False, name=f"nan_guard_{i}") for w in weights]
                for i in range(2)
            ]
            self._copies = [_copier(buffer, weights) for buffer in self._buffers]
            self._restore = [_copier(weights, buffer) for buffer in self._buffers]
            self._buffers_for = [id(w) for w in weights]
        self._next, self._good, self._good_step = 0, None, None
        self._step = self._steps_trained()  # counted on the host from here: no read per step

    def _steps_trained(self):
        return steps_trained(self.model)

    def _snapshot(self, started_at):
        self._copies[self._next]()  # the weights this step (or epoch) starts from
        self._started_at = started_at

    def _inspect(self, logs):
        loss = (logs or {}).get("loss")
        if loss is None:
            return
        if math.isfinite(float(loss)):
            self._good, self._good_step = self._next, self._started_at
            self._next = 1 - self._next
            return
        self.stopped_at_step = self._step if self._per_batch else self._steps_trained()
        self.model.stop_training = True
        if self._good is not None:
            self._restore[self._good]()
            self.restored_step = self._good_step
            what = (
                f"the weights that step {self.restored_step} started from (its loss was finite) "
                "restored"
            )
        else:
            what = "no step had a finite loss, so the weights are left as they are"
        chief_print(
            self.model,
            f"tfpar: loss {float(loss)} at step {self.stopped_at_step}: training stopped, {what}",
        )

    def on_train_batch_begin(self, batch, logs=None):
        if self._per_batch:
            self._first_batch = batch
            self._snapshot(self._step + 1)

    def on_train_batch_end(self, batch, logs=None):
        if self._per_batch:
            # steps_per_execution > 1: several steps a call
            self._step += batch - self._first_batch + 1
            self._inspect(logs)

    def on_epoch_begin(self, epoch, logs=None):
        if not self._per_batch:
            self._snapshot(self._steps_trained() + 1)

    def on_epoch_end(self, epoch, logs=None):
        if not self._per_batch:
            self._inspect(logs)


def _copier(destination, source):
    """A compiled ``destination[i].assign(source[i])`` for every i: on the devices, replica by
    replica for mirrored variables (each replica copies its own component)."""

    @tf.function(autograph=False)
    def copy():
        for d, s in zip(destination, source):
            d.assign(s)

    return copy
