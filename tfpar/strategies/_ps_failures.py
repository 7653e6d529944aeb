"""What goes wrong between a parameter-server coordinator and its cluster: a task that does not
answer at the start (`wait_for_addresses`, from `tfpar.cluster.addresses`), and a ps lost during
training (`lost_ps_error`)."""

import re

from tfpar._keras import tf
from tfpar.cluster.addresses import ClusterUnreachableError, accepts, wait_for_addresses

__all__ = [
    "ClusterUnreachableError",
    "ParameterServerLostError",
    "lost_ps_error",
    "wait_for_addresses",
]


class ParameterServerLostError(tf.errors.UnavailableError):
    """A ps task went away during training; ``tasks`` names it (``["ps 0"]``).

    Raised from ``fit``/``evaluate``/``predict`` (anything run in the strategy's
    scope) in place of TensorFlow's UnavailableError, which it still is.
    """

    def __init__(self, tasks: list[str], message: str, cause: BaseException) -> None:
        super().__init__(getattr(cause, "node_def", None), getattr(cause, "op", None), message)
        self.tasks = tasks


_PS_TASK = re.compile(r"/job:ps/replica:\d+/task:(\d+)")
# What a lost ps surfaces as, depending on which task noticed first and how: the coordinator's
# workers see UnavailableError/AbortedError; a worker that reconnects to a restarted address sees
# InvalidArgumentError (unknown device, lost remote handle); the chief's own reads of ps
# variables (logs, checkpoints) fail in its executor; the coordinator may wrap any of them.
_PS_LOSS_TYPES = (
    tf.errors.UnavailableError,
    tf.errors.AbortedError,
    tf.errors.CancelledError,
    tf.errors.InvalidArgumentError,
    tf.errors.UnknownError,
    tf.errors.InternalError,
)


def lost_ps_error(error, ps_addresses):
    """A `ParameterServerLostError` for ``error`` if a ps was lost, else None.

    A ps is lost when it no longer accepts connections (whatever the error says: which task
    noticed first, and how, varies), or when a connection error names it (a ps that failed
    and came back at once).
    """
    original = getattr(error, "original_exception", error)  # the coordinator's Closure*Error
    if isinstance(error, ParameterServerLostError) or not isinstance(original, _PS_LOSS_TYPES):
        return None
    closed = [i for i in range(len(ps_addresses)) if not accepts(ps_addresses[i], timeout=0.5)]
    text = str(original)
    named = {int(i) for i in _PS_TASK.findall(text)}
    named |= {i for i, address in enumerate(ps_addresses) if address in text}
    connection_error = isinstance(original, (tf.errors.UnavailableError, tf.errors.AbortedError))
    lost = closed or (sorted(named) if connection_error else [])
    if not lost:
        return None
    tasks = [f"ps {i}" for i in lost]
    where = ", ".join(f"ps {i} ({ps_addresses[i]})" for i in lost)
    first = text.strip().splitlines()[0] if text.strip() else type(original).__name__
    message = (
        f"Lost the parameter server {where} during training. A ps holds part of the model's "
        "variables, so training cannot go on without it (a lost worker only has its steps "
        "rescheduled). Restart that task and relaunch the job: with "
        "keras.callbacks.BackupAndRestore training resumes from the last completed epoch. "
        f"TensorFlow reported: {first}"
    )
    return ParameterServerLostError(tasks, message, original)
