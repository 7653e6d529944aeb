"""What the `Timeline` reads of a step beside its own stamps: the trace a model or its sharded
optimizer keeps of its devices' work (`trace_source`), and the ``recomputed forwards`` track: when
each block that `tfpar.remat` (or ZeRO stage 3's units) recomputes ran its forward again in the
backward pass, on the first replica of each worker (the replicas of a worker recompute alike). The
step records them while it is traced (`tfpar.remat._recompute.recomputations_recorded`) and writes
their timestamps into a variable; the Timeline reads it after each step."""

import numpy as np

from tfpar._keras import tf
from tfpar._timing import trace_variable

__all__ = ["TRACK", "RecomputedForwards", "trace_source"]

TRACK = "recomputed forwards"
"""The track's name."""


class RecomputedForwards:
    """The last step's recomputations: a row (start, end) per recomputed forward, in the order
    the backward pass ran them, and the name of each (the block's)."""

    def __init__(self):
        with tf.device("/cpu:0"):
            self.trace = trace_variable("tfpar_timeline_recomputed")
        self.labels = []  # per row of ``trace``, known once the step is traced

    def write(self, events, strategy):
        """The ops that write a traced step's recorded ``events`` (label, start, end) into the
        trace: none where the step recomputes nothing or the replica is not its worker's first."""
        events = [event for event in events if _in_this_graph(event[1])]
        if not events or not _first_of_its_worker(strategy):
            return []
        self.labels[:] = [label for label, _, _ in events]
        rows = [tf.reshape(tf.stack([start, end]), [1, 2]) for _, start, end in events]
        return [self.trace.assign(tf.concat(rows, 0))]

    def reset(self):
        """No step's recomputations known (a new fit)."""
        self.labels = []
        self.trace.assign(tf.zeros([0, 2], tf.float64))

    def events(self, track, label_index):
        """The Timeline's events (start, end, ``track``, the index of the block's name that
        ``label_index`` gives) of the last step's recomputations (none before one is traced); the
        trace is emptied, so that a step that writes none adds none."""
        if not self.labels:
            return []
        rows = self.trace.numpy()
        self.trace.assign(np.full_like(rows, np.nan))
        return [
            (start, end, track, label_index(label))
            for (start, end), label in zip(rows, self.labels)
            if np.isfinite(start)
        ]


def trace_source(model):
    """What traces its devices' work in ``model``'s step: the model (a pipeline, a tensor-parallel
    model), its sharded optimizer (ZeRO's exchange), or None."""
    if getattr(model, "device_trace", None) is not None:
        return model
    sharded = getattr(model, "_tfpar_zero", None)
    return sharded if getattr(sharded, "device_trace", None) is not None else None


def _in_this_graph(tensor):
    """Whether the step's own graph holds ``tensor``: a recomputation traced in a graph of its own
    inside the step (a user's ``tf.cond`` or ``tf.while_loop`` around the backward, a nested
    ``tf.function``) is left out; tfpar's own micro-batches run in the step's graph."""
    return tf.executing_eagerly() or tensor.graph is tf.compat.v1.get_default_graph()


def _first_of_its_worker(strategy):
    """Whether the replica whose step is traced in this thread is the first of its worker's (a
    replica's number among all: its worker's, times the replicas a worker has, plus its own; the
    default strategy's one replica is 0)."""
    context = tf.distribute.get_replica_context()
    replica = None if context is None else tf.get_static_value(context.replica_id_in_sync_group)
    return not replica or int(replica) % len(strategy.extended.worker_devices) == 0
