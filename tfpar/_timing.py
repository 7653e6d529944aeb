"""Timestamps of the work a traced training step does, for the `tfpar.callbacks.Timeline`: the time
once some tensors exist, a call timed from its inputs to its result, and a thread's recorder of
such calls while a step is traced in it (tensor parallelism's device parts, the recomputed
forwards; ZeRO's exchange keeps its own lists)."""

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from tfpar import _compat
from tfpar._keras import tf

__all__ = ["Recorder", "now_after", "timed", "trace_variable"]


def trace_variable(name: str) -> Any:
    """A variable a step writes its timed calls into, a row (start, end) each, however many (not
    tracked by Keras: no checkpoint holds it); made where the caller's device scope puts it."""
    return _compat.ResourceVariable(
        tf.zeros([0, 2], tf.float64), trainable=False, name=name, shape=tf.TensorShape([None, 2])
    )


def now_after(dependencies: Any) -> Any:
    """The time (`tf.timestamp`) once ``dependencies`` exist (the tensors and ops among them)."""
    inputs = [t for t in tf.nest.flatten(dependencies) if t is not None and not isinstance(t, int)]
    with tf.control_dependencies(inputs):
        return tf.timestamp()


def timed(events: list, key: tuple, inputs: Any, compute: Callable[[], Any]) -> Any:
    """``compute()``, ``(*key, start, end)`` appended to ``events``: its start once ``inputs``
    exist (it starts after that), its end once its result does."""
    start = now_after(inputs)
    with tf.control_dependencies([start]):
        result = compute()
    events.append((*key, start, now_after(result)))
    return result


class Recorder:
    """The timed calls of the step traced in this thread, while `recording` is open there (a
    replica's step is traced in its own thread)."""

    def __init__(self) -> None:
        self._thread = threading.local()

    @contextlib.contextmanager
    def recording(self, events: list | None = None) -> Iterator[list]:
        """Records into ``events`` (a new list if None), which it yields, while open."""
        previous = self.events()
        self._thread.events = [] if events is None else events
        try:
            yield self._thread.events
        finally:
            self._thread.events = previous

    def events(self) -> list | None:
        """The list `recording` appends to in this thread, or None outside it."""
        return getattr(self._thread, "events", None)

    def timed(self, key: tuple, inputs: Any, compute: Callable[[], Any]) -> Any:
        """``compute()``, timed into this thread's events while `recording` (`timed`)."""
        events = self.events()
        return compute() if events is None else timed(events, key, inputs, compute)
