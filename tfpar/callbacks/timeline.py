"""`Timeline`: one Chrome-trace (Perfetto) JSON for the whole job, every worker on one clock.

Open the file in https://ui.perfetto.dev or chrome://tracing. Each worker (TF_CONFIG task or
Horovod rank) is a process, with these tracks:

- ``step``: each training step as the host saw it (``on_train_batch_begin`` to ``..._end``);
- ``input wait``: from the step's start until its batch reached the step (input pipeline and
  dispatch: a slow input shows here);
- ``compute``: from then until the step's update is done and its metrics exist: forward,
  backward, the gradient exchange (the collective all-reduce, or Horovod's) and the optimizer's
  update. With ``exchange=True`` it is split where the gradients exist (at
  ``optimizer.apply_gradients``): ``forward+backward``, then ``exchange+apply`` (the exchange and
  the update run inside ``apply_gradients`` under every tfpar strategy, so they stay together);
- counters: ``loss scale``, each step's loss scale under a LossScaleOptimizer (it halves on a
  skipped step), and at each epoch's end ``loss`` and, from a `Throughput` callback before it,
  ``examples_per_second_per_worker`` and ``scaling_efficiency``;
- for a `PipelineModel`, one track per stage (and replica) with each microbatch's forward ``F``
  and backward ``B``, from the timestamps the pipeline takes around every instruction;
- with ``zero_stage`` 1 or 2, a ``ZeRO exchange`` track: each bucket's ``reduce-scatter i``, then
  each bucket's ``update i`` and ``all-gather i`` (at stage 3 each parameter's gathers and
  reduce-scatter);
- with ``remat`` (or ZeRO stage 3's large layers), ``recomputed forwards``: each recomputed block's
  forward run again in the backward pass, named by the block (`_device_traces`).

With ``steps_per_execution`` N, a ``step`` is one call of the training function, N steps, and
its ``compute`` spans them all. The in-step times are ``tf.timestamp()`` ops in the training
function (tfpar puts them there when ``fit`` gets a Timeline); steps and workers are matched by
a count of the steps (not the optimizer's ``iterations``, which count updates). All
times are the host's wall clock: workers on one machine share it; across machines they are as
close as the machines' clocks. Under a ParameterServer, Keras calls no batch hooks and the steps
run on the workers: the trace has the chief's epochs only.

At the end of ``fit`` the workers' events are gathered over the strategy (a collective) and the
chief writes the file, atomically.
"""

import json
import os
import threading
import time
from typing import Any

import numpy as np

from tfpar import _compat
from tfpar._files import write_atomically
from tfpar._keras import keras, tf
from tfpar._tasks.timeline_files import (
    TIMELINE_VARIABLE,
    check_writable,
    merge_horovod_timeline,
    timeline_in,
)
from tfpar._timing import now_after
from tfpar._topology import topology_of
from tfpar.callbacks._device_traces import TRACK as RECOMPUTED
from tfpar.callbacks._device_traces import RecomputedForwards, trace_source
from tfpar.callbacks._hooks import EpochLevelUnderCoordinator
from tfpar.callbacks._trace_events import (
    COMPUTE,
    COUNTER,
    EPOCH,
    EXCHANGE,
    FORWARD,
    INPUT,
    STEP,
    TRACKS,
    chrome_trace,
    gather,
)
from tfpar.remat._recompute import recomputations_recorded

__all__ = [
    "TIMELINE_VARIABLE",
    "Timeline",
    "check_writable",
    "merge_horovod_timeline",
    "timeline_in",
]

COUNTED_LOGS = ("examples_per_second_per_worker", "scaling_efficiency", "loss")
"""Epoch logs the trace keeps as counters, when there (the first two from `Throughput`)."""
_CAPACITY = 4096  # steps kept between two reads of the in-step stamps (read every epoch)


class Timeline(EpochLevelUnderCoordinator, keras.callbacks.Callback):
    """Writes the job's timeline to ``path`` when ``fit`` ends (the chief writes it).

    Args:
        path: the JSON file (default: ``$TFPAR_TIMELINE/timeline.json``). Its folder must exist
            and be writable: checked here, not at the end of the run.
        exchange: also split each step where the gradients exist (``forward+backward``, then
            ``exchange+apply``). The timestamp that waits for the gradients costs up to about
            14 % of the demo's step time here (``bench/timeline.py``: 0.96 to 1.14 over runs);
            without it the step after its input is one ``compute`` span (forward, backward,
            exchange and apply), at no measurable cost (0.95 to 0.99).

    Raises:
        ValueError: no path, a path that is a folder, or a folder that is missing or not writable.

    Examples:
        >>> model.fit(data, epochs=3,  # doctest: +SKIP
        ...           callbacks=[tfpar.callbacks.Timeline("run/timeline.json")])
    """

    def __init__(self, path: str | None = None, exchange: bool = False) -> None:
        super().__init__()
        self.exchange = exchange
        _compat.take_logs_as_they_are(self)  # it reads no logs
        if path is None and os.environ.get(TIMELINE_VARIABLE):
            path = os.path.join(os.environ[TIMELINE_VARIABLE], "timeline.json")
        self.path = check_writable(path, "path")
        self._stamps = None
        self._recomputed = None
        self._steps = None
        self._steps_strategy = None

    # --- in the training function (installed when fit begins) ---
    def _make_variables(self, strategy):
        """The variables the timed step writes: the stamps and the recomputations (made once),
        the count of steps (one per strategy)."""
        if self._stamps is None:
            with tf.device("/cpu:0"):
                self._stamps = _compat.ResourceVariable(
                    _empty(), trainable=False, name="tfpar_timeline"
                )
            self._recomputed = RecomputedForwards()
        if self._steps is None or self._steps_strategy is not strategy:
            self._steps = _step_counter(strategy)
            self._steps_strategy = strategy

    def install(self, model: Any) -> None:
        """Puts the in-step timestamps into ``model``'s training function, which it rebuilds."""
        strategy = model.distribute_strategy
        self._make_variables(strategy)
        stamps = self._stamps
        recomputed = self._recomputed
        optimizer = model.optimizer
        steps = self._steps
        # the step a replica's thread traces: its counter, its gradients' time
        traced = threading.local()
        train_step, apply_gradients = model.train_step, optimizer.apply_gradients

        def timed_train_step(data):
            step = tf.cast(steps.assign_add(1), tf.float64)
            traced.grads = tf.constant(-np.inf, tf.float64)
            arrived = now_after(data)
            with tf.control_dependencies([arrived]), recomputations_recorded() as events:
                logs = train_step(data)
            written = recomputed.write(events, strategy)
            # The step ends when its metrics exist and its update is done: reading the weights after
            # the update orders the read after it (tf.function runs a variable's ops in program
            # order).
            done = now_after([logs, [tf.convert_to_tensor(v) for v in model.trainable_variables]])
            row = tf.stack([step, arrived, traced.grads, done, _loss_scale(optimizer)])[None]
            del traced.grads
            index = tf.reshape(tf.cast(step, tf.int64) % _CAPACITY, [1])
            with tf.control_dependencies([stamps.scatter_max(tf.IndexedSlices(row, index))]):
                with tf.control_dependencies(written):
                    return tf.nest.map_structure(tf.identity, logs)

        timed_train_step.timeline = self  # type: ignore[attr-defined]  # how `install` finds it again

        def timed_apply_gradients(grads_and_vars, *args, **kwargs):
            grads_and_vars = list(grads_and_vars)
            if hasattr(traced, "grads") and self.exchange:  # inside a training step
                traced.grads = now_after([g for g, _ in grads_and_vars])
            return apply_gradients(grads_and_vars, *args, **kwargs)

        # what the instances had of their own (an elastic job's micro-batched train_step),
        # put back after
        self._installed = (
            model,
            optimizer,
            model.__dict__.get("train_step"),
            optimizer.__dict__.get("apply_gradients"),
        )
        model.train_step, optimizer.apply_gradients = timed_train_step, timed_apply_gradients
        # fit made it before on_train_begin; it calls the new one
        model.make_train_function(force=True)

    def _uninstall(self):
        model, optimizer, step, apply = self._installed
        for owner, name, own in (
            (model, "train_step", step),
            (optimizer, "apply_gradients", apply),
        ):
            owner.__dict__.pop(name, None)
            if own is not None:
                object.__setattr__(owner, name, own)
        model.train_function = None

    # --- on the host ---
    def on_train_begin(self, logs=None):
        timed = getattr(self.model.__dict__.get("train_step"), "timeline", None)
        if timed is None and not topology_of(self.model.distribute_strategy).coordinator:
            self.install(self.model)  # the first Timeline of this fit; none under a coordinator
        self._events, self._step_begin = [], None
        self._unmatched = []  # host steps whose in-step times are not read yet
        # an event's name: an index into these (the same on every worker)
        self._labels = list(TRACKS)
        self._tracks = dict(enumerate(TRACKS))
        if self._stamps is not None:
            self._stamps.assign(_empty())
            self._recomputed.reset()  # a fit that stopped after a step left its rows
        # A model that traces its devices' work in a step (a pipeline: a track per stage and
        # replica, an event per F, B and W; a tensor-parallel model: a track per device, an event
        # per layer part and per activation all-reduce; a sharded optimizer state: one track, an
        # event per bucket's reduce-scatter, update and all-gather) gives its trace's rows (start,
        # end), their tracks and labels.
        self._source = trace_source(self.model)
        self._device_trace = getattr(self._source, "device_trace", None)
        self._schedule = None
        if self._device_trace is not None:
            s = getattr(self.model, "schedule", None)
            # a pipeline's: for tfpar.report's theory
            if s is not None and hasattr(s, "num_microbatches"):
                self._schedule = {
                    "name": s.name,
                    "num_stages": s.num_stages,
                    "num_microbatches": s.num_microbatches,
                    "virtual_stages": s.virtual_stages,
                }
            self._first_device_track = first = len(self._tracks)
            for track, name in enumerate(self._source.device_track_names(), first):
                self._tracks[track] = name
            self._instructions = self._device_rows()
        # shown where a step recomputes (a track without events is left out of the trace)
        self._recomputed_track = len(self._tracks)
        self._tracks[self._recomputed_track] = RECOMPUTED

    def _device_rows(self):
        """(track, label index) of each row of the model's device trace (a tensor-parallel model
        knows them once its step is traced: read again until then)."""
        return [
            (self._first_device_track + track, self._label(label))
            for track, label in self._source.device_trace_labels()
        ]

    def _label(self, text):
        if text not in self._labels:
            self._labels.append(text)
        return self._labels.index(text)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_begin = time.time()

    def on_train_batch_begin(self, batch, logs=None):
        self._step_begin = time.time()

    def on_train_batch_end(self, batch, logs=None):
        step = (self._step_begin, time.time())
        self._events.append((*step, STEP, STEP))
        self._unmatched.append(step)
        if self._device_trace is not None:  # the step's instructions: [n, 2] (start, end)
            self._instructions = self._instructions or self._device_rows()
            rows = self._device_trace.numpy()
            for (start, stop), (track, label) in zip(rows, self._instructions):
                if np.isfinite(start):  # NaN: a branch the step did not take
                    self._events.append((start, stop, track, label))
            # read once: a step that writes no rows (one a loss scale skips) adds none
            self._device_trace.assign(np.full_like(rows, np.nan))
        if self._stamps is not None:  # installed: the step's recomputed forwards
            self._events += self._recomputed.events(self._recomputed_track, self._label)

    def on_epoch_end(self, epoch, logs=None):
        now = time.time()
        self._events.append((self._epoch_begin, now, EPOCH, self._label(f"epoch {epoch + 1}")))
        for name in COUNTED_LOGS:  # every worker logs the same keys
            if name in (logs or {}):
                self._events.append(
                    (now, float(np.asarray(logs[name])), COUNTER, self._label(name))
                )
        self._read_stamps()

    def _read_stamps(self):
        if self._stamps is None:
            return
        steps, self._unmatched = self._unmatched, []
        rows = self._stamps.numpy()
        rows = rows[np.isfinite(rows[:, 0])]
        rows = rows[np.argsort(rows[:, 0])]
        # With steps_per_execution N, one host step (one call of the training function) runs N
        # steps.
        per = max(1, len(rows) // len(steps)) if steps else 1
        count = min(len(steps), len(rows) // per)
        for k, (begin, end) in enumerate(steps[len(steps) - count :]):
            group = rows[len(rows) - (count - k) * per : len(rows) - (count - k - 1) * per]
            for done, scale in group[:, 3:5]:
                if np.isfinite(scale):  # a counter: (time, value)
                    self._events.append((done, scale, COUNTER, self._label("loss scale")))
            data, grads, done = group[0, 1], group[-1, 2], group[-1, 3]
            spans = [(begin, data, INPUT)] + (
                [(data, grads, FORWARD), (grads, done, EXCHANGE)]
                if per == 1 and np.isfinite(grads)
                else [(data, done, COMPUTE)]
            )
            for a, b, track in spans:
                if np.isfinite(a) and np.isfinite(b):
                    self._events.append((a, max(a, b), track, track))
        self._stamps.assign(_empty())

    def on_train_end(self, logs=None):
        if getattr(self, "_installed", None):
            self._uninstall()
            self._installed = None
        strategy = self.model.distribute_strategy
        workers = gather(strategy, np.array(self._events, np.float64).reshape(-1, 4))
        if strategy.extended.should_checkpoint:
            write_atomically(
                self.path,
                json.dumps(chrome_trace(workers, self._tracks, self._labels, self._schedule)),
            )


def _step_counter(strategy):
    """The training steps traced so far: one variable of ``strategy``'s replicas, which each step's
    first replica counts, so that every replica keys its step's row alike (the optimizer's
    ``iterations`` counts updates: under accumulation several steps share one)."""
    with strategy.scope():
        return tf.Variable(
            0,
            dtype=tf.int64,
            trainable=False,
            name="tfpar_timeline_steps",
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )


def _loss_scale(optimizer):
    """The loss scale of a LossScaleOptimizer (either Keras), as a float64 tensor; else -inf."""
    from tfpar.precision import loss_scale_of

    value = loss_scale_of(optimizer)
    return (
        tf.constant(-np.inf, tf.float64)
        if value is None
        else tf.cast(tf.convert_to_tensor(value), tf.float64)
    )


def _empty():
    return tf.fill([_CAPACITY, 5], tf.constant(-np.inf, tf.float64))
