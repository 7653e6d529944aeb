"""The processes a launcher starts: checked before they start, signalled as groups, never left
behind.

`ProcessGroups` keeps the process group of every child and a watchdog process that stops
them if the launcher dies, however it dies (SIGKILL included):

    python -m tfpar._local.processes GRACE_SECONDS   (lines on stdin: "+PGID", "-PGID", "exit")

`ProcessGroups` starts one, in a session of its own, and writes to it the process group of
every child it starts. The pipe's write end lives only in the launcher (children are started
with ``close_fds``), so end-of-file means the launcher is gone: without a last "exit" line the
watchdog sends SIGTERM to every group still listed, waits ``GRACE_SECONDS`` and sends SIGKILL.
A group outlives its leader (``bash -c 'sleep 60 & exit'``), so groups are signalled, not pids.
Pure Python; no TensorFlow.
"""

import contextlib
import gc
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tfpar._checks import check_number
from tfpar._local import loopback

__all__ = [
    "DEFAULT_GRACE_SECONDS",
    "FORWARDED_SIGNALS",
    "LaunchError",
    "ProcessGroups",
    "check_command",
    "forwarding_signals",
    "group_alive",
    "run_command",
    "signal_group",
    "skip_exit_collections",
    "stop_groups",
    "tree_groups",
]

DEFAULT_GRACE_SECONDS = 10.0
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def skip_exit_collections():
    """Freezes the objects of a tfpar process that has finished its work (the ``tfpar`` command, a
    trial of ``tfpar tune``): the interpreter's exit would walk them in its full collections, which
    on TensorFlow's and Keras' 400,000 objects took 0.9 CPU-s of the 4.2 that a process that only
    imports them takes (measured 2026-12-07), to free memory the process gives back anyway. The
    atexit functions still run and objects freed by reference counting are finalized as before;
    those that cycles keep alive, whose finalizers Python does not promise to run at exit, are
    not collected."""
    gc.freeze()


def signal_group(pgid, sig):
    """Sends ``sig`` to the group; False when no process of it is left."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # the pgid was reused by someone else's group: not ours any more
        return False


def group_alive(pgid):
    """Whether a process of the group still runs. One that has exited and waits for its parent to
    read its status (a zombie) has let go of everything and counts as gone: the launcher reads the
    exit codes of its own children only after they are all stopped."""
    if not signal_group(pgid, 0):
        return False
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = stat_fields(name)
            if fields is not None and int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def stat_fields(pid):
    """The fields of ``/proc/<pid>/stat`` after the command name (state, parent pid, process
    group, ...), or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _process_table():
    """pid -> (parent pid, process group) of every process, from /proc."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = stat_fields(name)
            if fields is not None:  # else gone meanwhile
                table[int(name)] = (int(fields[1]), int(fields[2]))
    return table


def tree_groups(pgids):
    """``pgids`` and the groups of every descendant of their members.

    A child may start its own children in new sessions (horovodrun starts each rank so): they
    are still its descendants, and ending the job ends them too.
    """
    table = _process_table()
    children = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    members = [pid for pid, (_, group) in table.items() if group in pgids]
    seen = set(members)
    while members:
        for child in children.get(members.pop(), ()):
            if child not in seen:
                seen.add(child)
                members.append(child)
    own = os.getpgrp()
    return (set(pgids) | {table[pid][1] for pid in seen}) - {own}


def stop_groups(pgids, grace_seconds, first=signal.SIGTERM, poll_seconds=0.05):
    """``first`` to every group and its descendants' groups, SIGKILL to what is left after
    ``grace_seconds`` (descendants started meanwhile included)."""
    groups = tree_groups(set(pgids))
    live = [g for g in groups if signal_group(g, first)]
    deadline = time.monotonic() + grace_seconds
    while live and time.monotonic() < deadline:
        time.sleep(poll_seconds)
        live = [g for g in live if group_alive(g)]
    for g in tree_groups(set(live)) if live else ():
        signal_group(g, signal.SIGKILL)


class ProcessGroups:
    """The process groups a launcher started, with a watchdog that ends them if it dies.

    Start each child with ``start_new_session=True`` and `add` its pid (its group's id).
    """

    def __init__(self, grace_seconds):
        self.grace_seconds = grace_seconds
        self.pgids = []
        self._seen = set()
        self._lock = threading.RLock()  # a signal handler may send while the main thread holds it
        self._watchdog = subprocess.Popen(
            [sys.executable, "-m", "tfpar._local.processes", repr(float(grace_seconds))],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
            text=True,
        )

    def _tell(self, line):
        try:
            self._watchdog.stdin.write(line + "\n")
            self._watchdog.stdin.flush()
        except (BrokenPipeError, ValueError):  # the watchdog is gone: nothing more to tell it
            pass

    def add(self, pgid):
        with self._lock:
            self.pgids.append(pgid)
            self._tell(f"+{pgid}")

    def _groups(self):
        """The registered groups and every group of their descendants seen so far: a child's own
        children in other sessions (horovodrun's ranks) are remembered while they are still
        its descendants, so that they are reached after it exits too."""
        with self._lock:
            self._seen |= tree_groups(set(self.pgids) | self._seen)
            return set(self.pgids) | self._seen

    def send(self, sig):
        """Sends ``sig`` to every group and its descendants' groups, leaders that exited
        included."""
        for pgid in self._groups():
            signal_group(pgid, sig)

    def stop(self, first=signal.SIGTERM):
        """``first``, then SIGKILL after the grace period, to every group: nothing of them is
        left."""
        stop_groups(self._groups(), self.grace_seconds, first)

    def close(self):
        """Ends every group that is left (SIGTERM, grace, SIGKILL) and lets the watchdog go."""
        self.stop()
        with self._lock:
            self._tell("exit")
            try:
                self._watchdog.stdin.close()
            except BrokenPipeError:
                pass
        try:
            self._watchdog.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._watchdog.kill()
            self._watchdog.wait()


class LaunchError(RuntimeError):
    """A task of the job failed; ``task`` and ``returncode`` say which and how; ``port_taken``: the
    task whose server could not bind its port, another process holding it (None: no such task)."""

    def __init__(self, message: str, task: Any = None, returncode: int = 1) -> None:
        super().__init__(message)
        self.task = task
        self.returncode = returncode
        self.port_taken: str | None = None


def check_command(command: Sequence[str], grace_seconds: float, num_tasks: int = 1) -> None:
    """Refuses, before anything starts, what would fail later: a missing program, a bad grace
    period, more tasks than this process may open files for.

    Raises:
        ValueError / TypeError: naming the value received and the fix.
    """
    if not command:
        raise ValueError(
            "Nothing to launch. Received: an empty command. Write e.g. "
            "`tfpar launch -n 2 -- python train.py`."
        )
    check_number(
        "grace_seconds",
        grace_seconds,
        minimum=0,
        hint=" It is how long a stopped task may take to exit before SIGKILL, e.g. --grace 10.",
    )
    program = str(command[0])
    if shutil.which(program) is None:
        where = "is not an executable file" if os.sep in program else "is not on PATH"
        raise ValueError(
            f"The command {program!r} {where}. Received: {' '.join(map(str, command))!r}. "
            "Check its spelling, or give its full path."
        )
    # Per task the launcher holds an output pipe (two ends while it starts) and, while it picks
    # free ports, a socket; plus what Python itself holds.
    needed = 3 * num_tasks + 32
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and needed > soft:
        raise ValueError(
            f"{num_tasks} tasks need about {needed} open files in the launcher, and this shell "
            f"allows {soft} (ulimit -n). Received: {num_tasks} tasks. Raise the limit (ulimit -n "
            "4096) or start fewer tasks."
        )


@contextlib.contextmanager
def forwarding_signals(forward):
    """SIGINT, SIGTERM and SIGHUP call ``forward(signum)`` and are listed in the yielded list."""
    received, previous = [], {}

    def handler(signum, _frame):
        received.append(signum)
        forward(signum)

    if threading.current_thread() is threading.main_thread():
        for sig in FORWARDED_SIGNALS:
            previous[sig] = signal.signal(sig, handler)
    try:
        yield received
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def run_command(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    poll_seconds: float = 0.05,
    check: Callable[[], None] | None = None,
) -> int:
    """Runs one local command that starts a job itself (``horovodrun``) and returns its exit status.

    As with `run_tasks`: it runs in a process group of its own with loopback-only
    servers, SIGINT/SIGTERM/SIGHUP are passed on with ``grace_seconds`` to exit,
    and nothing it started is left when it ends or when the launcher is killed.
    ``check()``, if given, runs at every poll; what it raises stops the command (and everything
    it started) and is raised.

    Raises:
        LaunchError: it could not start (or from ``check``).
    """
    check_command(argv, grace_seconds)
    groups = ProcessGroups(grace_seconds)
    try:
        with forwarding_signals(groups.send) as received:
            try:
                proc = subprocess.Popen(
                    argv,
                    env=loopback.child_env(dict(os.environ if env is None else env)),
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            except OSError as e:
                raise LaunchError(f"could not start {argv[0]}: {e}") from None
            groups.add(proc.pid)
            while proc.poll() is None:
                if check is not None:
                    check()
                if received:
                    groups.stop(first=0)  # the signal was passed on; SIGKILL after the grace period
                    proc.wait()
                    return 128 + received[0]
                time.sleep(poll_seconds)
            return proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    finally:
        groups.close()


def main():
    grace = float(sys.argv[1])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the launcher's to handle
    pgids = []
    for line in sys.stdin:
        line = line.strip()
        if line == "exit":
            return
        if line.startswith("+"):
            pgids.append(int(line[1:]))
        elif line.startswith("-") and int(line[1:]) in pgids:
            pgids.remove(int(line[1:]))
    stop_groups(pgids, grace)  # end of input without "exit": the launcher died


if __name__ == "__main__":
    main()
