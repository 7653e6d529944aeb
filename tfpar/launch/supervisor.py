"""What ``tfpar launch`` watches over a job, whichever back-end started its tasks
(`tfpar.launch.backends`): their heartbeats, their step times and the timeline. Pure Python, no
TensorFlow.

- With ``heartbeat_timeout``, each task gets a heartbeat file (``TFPAR_HEARTBEAT_FILE``, from
  `task_env`); `check` raises, once the job is to be stopped, a `LaunchError` (code 124) naming a
  task that made no step for that long, after its stacks were dumped.
- After a job that succeeded, `finish` prints each task's mean step time against the median
  (stragglers); after any job, leaving the supervisor merges Horovod's own timeline into
  ``tfpar launch --timeline``'s.
"""

import os
import tempfile
from collections.abc import Callable
from typing import Any

from tfpar._checks import check_number
from tfpar._tasks.env import TIMELINE_VARIABLE
from tfpar._tasks.heartbeat import HEARTBEAT_VARIABLE, Watch, hang_error
from tfpar._tasks.timeline_files import merge_horovod_timeline

__all__ = ["Supervisor"]


class Supervisor:
    """The watch over one run of a job's tasks; a context manager (its heartbeat folder lives in
    it).

    Args:
        heartbeat_timeout: seconds a busy task may make no step (None: no heartbeats).
        say: prints a launcher line (``tfpar launch: ...``).
        env: the tasks' environment, where ``TFPAR_TIMELINE`` says whether to merge Horovod's
            timeline.

    Raises:
        ValueError: a heartbeat timeout that is not a positive number.
    """

    def __init__(self, heartbeat_timeout, say, env=None):
        check_number(
            "heartbeat_timeout",
            heartbeat_timeout,
            above=0,
            allow_none=True,
            hint=" (seconds a task may make no step)",
        )
        self.heartbeat_timeout, self.say = heartbeat_timeout, say
        self._timeline = (os.environ if env is None else env).get(TIMELINE_VARIABLE)
        self._folder = self._watch = None

    def __enter__(self):
        if self.heartbeat_timeout is not None:
            self._folder = tempfile.TemporaryDirectory(prefix="tfpar-heartbeat-")
            self._watch = Watch(self._folder.name, self.heartbeat_timeout)
        return self

    def __exit__(self, *exc):
        if self._folder is not None:
            self._folder.cleanup()
        if self._timeline:
            merge_horovod_timeline(self._timeline)
        return False

    @property
    def watching(self):
        """Whether the tasks' heartbeats are watched."""
        return self._watch is not None

    def task_env(self, name: str) -> dict[str, str]:
        """``{TFPAR_HEARTBEAT_FILE: ...}`` for the task called ``name`` (``"{rank}"`` in it: Horovod
        fills in each rank), or ``{}`` without heartbeats."""
        if self._watch is None:
            return {}
        return {HEARTBEAT_VARIABLE: os.path.join(self._folder.name, name.replace(" ", "-"))}

    def check(
        self,
        others: dict[str, int] | None = None,
        task_of: Callable[[str], Any] = lambda name: None,
    ) -> None:
        """Raises the `LaunchError` (code 124) of a stalled task, once it named it and dumped its
        stacks; ``others``: name -> pid of the running tasks without a heartbeat (a ps server)."""
        if self._watch is None:
            return
        hang = self._watch.check(others)
        if hang is not None:
            raise hang_error(hang, self.say, task=task_of(hang.name))

    def finish(self, what: str = "task") -> None:
        """After a job that succeeded: each task's mean step time against the median."""
        steps = self._watch.step_times() if self._watch is not None else None
        if steps:
            self.say(f"mean step time per {what} (÷ the median): {steps}")
