"""The communication of tensor parallelism: Megatron-LM's conjugate operators, in one process.

- `copy_to` (Megatron's *f*): the forward pass hands the same activation to every device; the
  backward pass sums the devices' gradients (an all-reduce).
- `reduce_from` (Megatron's *g*): the forward pass sums the devices' partial outputs (an
  all-reduce); the backward pass hands the gradient to every device unchanged.
- `gather_from`: the devices' column blocks side by side (an all-gather), for a column layer no row
  layer follows; its backward pass hands each device its block.

In one process the devices' tensors meet on the home device (the first one), where the replicated
layers (normalisation, residuals, biases of row layers) run. Each reduction is one op named after
what it is (`FORWARD_REDUCTION`, `BACKWARD_REDUCTION`, `GATHER`), so a traced training step can be
counted (`count_communication`) and the Timeline can name it.
"""

import contextlib
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from tfpar._keras import tf
from tfpar._timing import Recorder

__all__ = [
    "BACKWARD_REDUCTION",
    "FORWARD_REDUCTION",
    "GATHER",
    "Sharded",
    "computing_devices",
    "copy_to",
    "count_communication",
    "gather_from",
    "placed_on",
    "recording",
    "recording_events",
    "reduce_from",
    "timed",
]

FORWARD_REDUCTION = "tp_allreduce_forward"
BACKWARD_REDUCTION = "tp_allreduce_backward"
GATHER = "tp_allgather"


_PLACEMENT = threading.local()


_RECORDER = Recorder()


def recording(events: list) -> Any:
    """Inside it, each split layer's part on a device and each all-reduce or all-gather appends
    ``(device index, label, start, end)`` to ``events``: timestamps taken when its inputs are ready
    and when its result is (the Timeline's tracks)."""
    return _RECORDER.recording(events)


def recording_events() -> list | None:
    """The list `recording` appends to, or None outside it."""
    return _RECORDER.events()


def timed(device_index: int, label: str, inputs: Any, compute: Callable[[], Any]) -> Any:
    """``compute()``, with its start and end recorded while `recording`."""
    return _RECORDER.timed((device_index, label), inputs, compute)


@contextlib.contextmanager
def placed_on(devices: Sequence[str]) -> Iterator[None]:
    """Split layers called inside compute on ``devices`` rather than where their variables live: a
    pipeline replica's own devices (its variables are replica 0's, read where they are needed)."""
    previous = getattr(_PLACEMENT, "devices", None)
    _PLACEMENT.devices = list(devices)
    try:
        yield
    finally:
        _PLACEMENT.devices = previous


def computing_devices(own: list[str]) -> list[str]:
    """The devices a split layer whose variables live on ``own`` computes on now (`placed_on`)."""
    placed = getattr(_PLACEMENT, "devices", None)
    return own if placed is None else placed


class Sharded:
    """An activation split over the tensor-parallel devices: ``parts[i]`` on ``devices[i]``, the
    blocks of its ``axis`` (counted from the end; the last by default) in order. It flows from a
    column layer to the row layer that sums it."""

    def __init__(self, parts: Sequence, devices: Sequence[str], axis: int = -1) -> None:
        self.parts = list(parts)
        self.devices = list(devices)
        self.axis = axis

    def map(self, fn: Callable[[Any], Any]) -> "Sharded":
        """``fn`` applied to each part on its device (an element-wise layer)."""
        parts = []
        for part, device in zip(self.parts, self.devices):
            with tf.device(device):
                parts.append(fn(part))
        return Sharded(parts, self.devices, self.axis)


def copy_to(x: Any, devices: Sequence[str], label: str = "all-reduce") -> list:
    """``x`` on each device (forward); the sum of the devices' gradients (backward, recorded as
    ``label`` + " (backward)")."""
    home = devices[0]

    @tf.custom_gradient
    def f(value):
        copies = []
        for device in devices:
            with tf.device(device):
                copies.append(tf.identity(value))

        def grad(*upstream):
            given = [g for g in upstream if g is not None]
            if not given:
                return tf.zeros_like(value)
            with tf.device(home):
                return timed(
                    0,
                    f"{label} (backward)",
                    given,
                    lambda: tf.add_n(given, name=BACKWARD_REDUCTION),
                )

        return copies, grad

    return list(f(x))


def reduce_from(parts: Sequence, devices: Sequence[str], label: str = "all-reduce") -> Any:
    """The sum of the devices' partial outputs, on the home device (forward); the gradient handed to
    each device (backward)."""

    @tf.custom_gradient
    def g(*values):
        with tf.device(devices[0]):
            total = timed(0, label, values, lambda: tf.add_n(list(values), name=FORWARD_REDUCTION))

        def grad(upstream):
            copies = []
            for device in devices:
                with tf.device(device):
                    copies.append(tf.identity(upstream))
            return copies

        return total, grad

    return g(*parts)


def gather_from(sharded: Sharded) -> Any:
    """The parts side by side along their axis, on the home device (an all-gather)."""
    with tf.device(sharded.devices[0]):
        return timed(
            0,
            "all-gather",
            sharded.parts,
            lambda: tf.concat(sharded.parts, axis=sharded.axis, name=GATHER),
        )


def count_communication(graph_def: Any) -> dict[str, int]:
    """``{name: count}`` of the communication ops in a traced step's GraphDef, its functions
    included."""
    names = [node.name for node in graph_def.node]
    for function in graph_def.library.function:
        names.extend(node.name for node in function.node_def)
    counts = {}
    for marker in (FORWARD_REDUCTION, BACKWARD_REDUCTION, GATHER):
        # TensorFlow names an op "<scopes>/<marker>", with "_<n>" after the first of a scope.
        pattern = re.compile(rf"{marker}(_\d+)?")
        counts[marker] = sum(1 for name in names if pattern.fullmatch(name.rsplit("/", 1)[-1]))
    return counts
