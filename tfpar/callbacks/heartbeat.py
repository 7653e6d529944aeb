"""`Heartbeat`: tells ``tfpar launch --heartbeat-timeout`` that a task makes progress.

The launcher gives each task a file (``TFPAR_HEARTBEAT_FILE``); tfpar adds this callback to every
``fit``, ``evaluate`` and ``predict`` of a model tfpar owns in such a task (no change to the
script; `tfpar.callbacks._launched`), and it writes the
task's step count, its summed step time and the time of its last step there, at most every
``interval`` seconds, atomically. A task that stops stepping for longer than the timeout is
named by the launcher, which dumps its stacks (``faulthandler``, registered here on SIGUSR1)
and stops or restarts the job. At the end of training the task is marked idle, so that what the
script does after ``fit`` is not taken for a hang.
"""

import faulthandler
import os
import time

from tfpar import _compat
from tfpar._checks import check_number
from tfpar._keras import keras
from tfpar._tasks.heartbeat import HEARTBEAT_VARIABLE, STACK_SIGNAL, heartbeat_path

__all__ = ["Heartbeat"]


class Heartbeat(keras.callbacks.Callback):
    """Writes ``"<steps> <step seconds> <time> <busy|idle> <pid>"`` to ``path`` as steps end.

    Args:
        path: the file (default: ``$TFPAR_HEARTBEAT_FILE``).
        interval: the most often it writes, in seconds.

    Raises:
        ValueError: no path, or an interval that is not a positive number.
    """

    def __init__(self, path: str | None = None, interval: float = 0.5) -> None:
        super().__init__()
        # It reads no logs, so Keras may call its batch hooks under a ParameterServer too (there
        # they run as the coordinator schedules steps, which stops when the workers stop taking
        # them).
        _compat.take_logs_as_they_are(self)
        path = path or (
            heartbeat_path(os.environ[HEARTBEAT_VARIABLE])
            if os.environ.get(HEARTBEAT_VARIABLE)
            else None
        )
        if not path:
            raise ValueError(
                "Heartbeat needs a file. Received: path=None and no $TFPAR_HEARTBEAT_FILE. Start "
                "the job with `tfpar launch --heartbeat-timeout S`, which sets it (and adds this "
                "callback itself)."
            )
        check_number("interval", interval, above=0)
        self.path, self.interval = path, interval
        self._steps, self._seconds, self._written, self._start = 0, 0.0, 0.0, None
        faulthandler.register(STACK_SIGNAL, all_threads=True)

    def _write(self, state):
        now = time.time()
        temporary = f"{self.path}.{os.getpid()}.tmp"
        with open(temporary, "w") as f:
            f.write(f"{self._steps} {self._seconds:.6f} {now:.3f} {state} {os.getpid()}\n")
        os.replace(temporary, self.path)
        self._written = now

    def _step_begin(self, *args):
        self._start = time.perf_counter()

    def _step_end(self, *args):
        if self._start is not None:
            self._seconds += time.perf_counter() - self._start
            self._start = None
        self._steps += 1
        if time.time() - self._written >= self.interval:
            self._write("busy")

    def _busy(self, *args):
        self._write("busy")

    def on_train_begin(self, logs=None):
        self._training = True
        self._write("busy")

    def on_train_end(self, logs=None):
        self._training = False
        self._write("idle")

    def _end(self, *args):  # an evaluation inside fit (validation) keeps the task watched
        self._write("busy" if getattr(self, "_training", False) else "idle")

    on_test_begin = on_predict_begin = on_epoch_begin = on_epoch_end = _busy
    on_train_batch_begin = on_test_batch_begin = on_predict_batch_begin = _step_begin
    on_train_batch_end = on_test_batch_end = on_predict_batch_end = _step_end
    on_test_end = on_predict_end = _end
