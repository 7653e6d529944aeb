"""The heartbeat between a job's tasks (`tfpar.callbacks.Heartbeat`) and ``tfpar launch``.

Each task writes ``"<steps> <step seconds> <time> <busy|idle> <pid>"`` to its own file in one
folder (``$TFPAR_HEARTBEAT_FILE``; a ``{rank}`` in it becomes the task's Horovod rank, for the
ranks horovodrun starts with one environment). `Watch` reads the folder: a busy task whose last
step is older than the timeout stalls the job; it names the task to blame. Pure Python: the
launcher reads the files without TensorFlow.
"""

import dataclasses
import os
import signal
import statistics
import time

from tfpar._local.processes import LaunchError, stat_fields
from tfpar._tasks.env import HEARTBEAT_VARIABLE

__all__ = [
    "HEARTBEAT_VARIABLE",
    "STACK_SIGNAL",
    "Beat",
    "Hang",
    "Watch",
    "dump_stacks",
    "hang_error",
    "heartbeat_path",
    "process_state",
    "read_heartbeat",
]

STACK_SIGNAL = signal.SIGUSR1
"""On this signal a task with a heartbeat writes every thread's stack to its stderr."""


@dataclasses.dataclass(frozen=True)
class Beat:
    """A task's last heartbeat."""

    steps: int
    step_seconds: float
    time: float
    busy: bool
    pid: int


@dataclasses.dataclass(frozen=True)
class Hang:
    """A stalled job: the task to blame, and what to say."""

    name: str
    pid: int
    why: str
    message: str


def heartbeat_path(template, environ=None):
    """The task's file: ``template`` with ``{rank}`` replaced by its Horovod rank (0 without)."""
    env = os.environ if environ is None else environ
    return template.replace("{rank}", env.get("HOROVOD_RANK", "0"))


def read_heartbeat(path):
    """The `Beat` in ``path``, or None before its first write."""
    try:
        with open(path) as f:
            steps, seconds, when, state, pid = f.read().split()
        return Beat(int(steps), float(seconds), float(when), state == "busy", int(pid))
    except (OSError, ValueError):
        return None


def process_state(pid):
    """The state letter of a process in /proc (``"T"``: stopped), or None."""
    fields = stat_fields(pid)
    return fields[0] if fields else None


class Watch:
    """The heartbeat files of one job in ``folder``, named after their tasks."""

    def __init__(self, folder, timeout):
        self.folder, self.timeout = folder, timeout

    def beats(self):
        found = {}
        for name in sorted(os.listdir(self.folder)):
            if not name.endswith(".tmp"):
                beat = read_heartbeat(os.path.join(self.folder, name))
                if beat is not None:
                    found[name.replace("-", " ")] = beat
        return found

    def check(self, others=None, now=None):
        """A `Hang` when a busy task has made no step for longer than the timeout, else None.

        The task to blame is one that is stopped (state T: SIGSTOP, a debugger), among the tasks
        with a heartbeat and ``others`` (name -> pid: those without one, e.g. a parameter
        server's), if any; else the task whose last step is the oldest (its peers then wait for it
        in a collective).
        """
        now = time.time() if now is None else now
        beats = {
            name: beat
            for name, beat in self.beats().items()
            if process_state(beat.pid) not in (None, "Z")
        }
        stalled = {
            name: beat
            for name, beat in beats.items()
            if beat.busy and now - beat.time > self.timeout
        }
        if not stalled:
            return None
        pids = {**{name: beat.pid for name, beat in beats.items()}, **(others or {})}
        stopped = [name for name, pid in pids.items() if process_state(pid) == "T"]
        if stopped:
            name, why = stopped[0], "is stopped (state T: SIGSTOP or a debugger)"
        else:
            name = min(stalled, key=lambda n: stalled[n].time)
            why = f"made no step since step {stalled[name].steps}"
        own = f"its last step {now - beats[name].time:.1f} s ago, " if name in beats else ""
        since = now - max(beat.time for beat in stalled.values())
        message = (
            f"{name} {why}: {own}the job's last step {since:.1f} s ago (--heartbeat-timeout "
            f"{self.timeout:g}); stalled: {', '.join(stalled)}. Its stacks follow; then the job is "
            "stopped"
        )
        return Hang(name, pids[name], why, message)

    def step_times(self):
        """``"<task> <ms> (<ratio to the median>x), ..."``: each task's mean step time, or None."""
        times = {
            name: beat.step_seconds / beat.steps
            for name, beat in self.beats().items()
            if beat.steps
        }
        if not times:
            return None
        median = statistics.median(times.values())
        return ", ".join(
            f"{name} {1000 * t:.1f} ms ({t / median:.2f}x)" for name, t in times.items()
        )


def dump_stacks(pid):
    """Asks ``pid`` for its stacks (a stopped process is let run again to write them).

    The signal goes to the main thread (``tgkill``), not to the process: a process-directed signal
    reaches any thread, and faulthandler then walks the main thread's frames while it runs on (a
    task let run again after SIGSTOP left them under the dump and crashed, once, with SIGSEGV)."""
    try:
        _to_main_thread(pid, STACK_SIGNAL)
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        return


def _to_main_thread(pid, sig):
    """Signals the main thread of ``pid`` (its thread id is the pid); ``os.kill`` without glibc's
    tgkill."""
    import ctypes

    tgkill = getattr(ctypes.CDLL(None, use_errno=True), "tgkill", None)
    if tgkill is None:
        os.kill(pid, sig)
    elif tgkill(pid, pid, int(sig)) != 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))  # ESRCH makes it a ProcessLookupError


def hang_error(hang, say, task=None):
    """Says ``hang``, has its task dump its stacks (and waits 2 s for them to reach the output);
    returns the `LaunchError` (code 124) to raise once the job is stopped."""
    say(hang.message)
    dump_stacks(hang.pid)
    time.sleep(2)
    return LaunchError(f"{hang.name} hung: it {hang.why}", task=task, returncode=124)
