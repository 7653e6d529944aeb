"""How one job's tasks run: their options (`LaunchOptions`), started and supervised until they
end (`run_job`); `tfpar.launch.api` builds the jobs on it. Pure Python: the launcher never
imports TensorFlow."""

import dataclasses
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

from tfpar._checks import check_int, check_number
from tfpar._local import loopback
from tfpar._local.processes import (
    DEFAULT_GRACE_SECONDS,
    LaunchError,
    check_command,
    forwarding_signals,
)
from tfpar._tasks.env import FAULT_TOLERANCE_MARK
from tfpar.cluster import ClusterInfo, is_loopback_cluster
from tfpar.cluster.addresses import port_in_use
from tfpar.launch.job import Job, Task, describe_exit
from tfpar.launch.supervisor import Supervisor

__all__ = ["LaunchOptions", "run_job", "run_tasks", "warn_without_backup"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class LaunchOptions:
    """How a job's tasks run, whatever started them (the options `launch` and `run_tasks` take).

    Raises:
        ValueError: a negative ``max_restarts``, or a ``heartbeat_timeout`` that is not positive.
    """

    env: dict | None = None
    """The tasks' environment (default: this process's)."""
    out: Any = None
    """Where their prefixed output goes (default: stdout)."""
    grace_seconds: float = DEFAULT_GRACE_SECONDS
    """How long a stopped task may take to exit before SIGKILL."""
    heartbeat_timeout: float | None = None
    """Seconds a task may make no step before it is named hung (None: not watched)."""
    max_restarts: int = 0
    """A local job: how many times it starts again after a task failed."""
    poll_seconds: float = 0.05
    """How often the launcher looks at its tasks."""
    watch: Any = None
    """An elastic job's membership watch (`tfpar.launch.elastic`): called at each look, it raises
    `tfpar.launch.elastic.membership.MembershipChange` to have the running job stopped."""

    def __post_init__(self):
        check_int(
            "max_restarts", self.max_restarts, 0, " (how many times a failed job is started again)"
        )
        check_number(
            "heartbeat_timeout",
            self.heartbeat_timeout,
            above=0,
            allow_none=True,
            hint=" (seconds a task may make no step)",
        )
        object.__setattr__(self, "env", dict(os.environ if self.env is None else self.env))
        object.__setattr__(self, "out", self.out or sys.stdout)

    def say(self, message: str) -> None:
        """Prints a launcher line."""
        self.out.write(f"tfpar launch: {message}\n")
        self.out.flush()


def run_tasks(
    command: Sequence[str],
    cluster: dict,
    tasks: Sequence[Task],
    *,
    env: dict | None = None,
    out: Any = None,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    poll_seconds: float = 0.05,
    heartbeat_timeout: float | None = None,
) -> int:
    """Runs ``command`` once per task and supervises the processes.

    Returns 0 when every task exits 0. When a task fails (non-zero exit or a
    signal) the others get SIGTERM, then SIGKILL after ``grace_seconds``, and
    `LaunchError` names the task. Serving tasks (`Task.serves`) run a server,
    are stopped once the other tasks succeed, and may die without ending the job.
    SIGINT, SIGTERM and SIGHUP sent to the launcher are forwarded to every task,
    which then has ``grace_seconds`` to exit before SIGKILL.

    Every task runs in a process group of its own; when the job ends, whatever
    is left in those groups (a worker's background children too) is stopped,
    and a watchdog process stops them if the launcher itself is killed. When
    every address of ``cluster`` is on this machine, the tasks' servers listen
    on loopback only (`tfpar._local.loopback`); otherwise the launcher names the ports
    its tasks open on all interfaces.

    With ``heartbeat_timeout`` (seconds), each task's ``fit``/``evaluate``/``predict`` reports its
    steps (`tfpar.callbacks.Heartbeat`); a task that makes no step for that long is named, its
    stacks are dumped, and the job is stopped (`LaunchError`, code 124). At the end the launcher
    prints each task's mean step time against the median (stragglers); see
    `tfpar.launch.supervisor`.

    Raises:
        LaunchError: a task failed, hung or could not start, or the launcher was interrupted.
    """
    options = LaunchOptions(
        env=env,
        out=out,
        grace_seconds=grace_seconds,
        poll_seconds=poll_seconds,
        heartbeat_timeout=heartbeat_timeout,
    )
    return run_job(command, cluster, tasks, options)


def run_job(
    command: Sequence[str], cluster: dict, tasks: Sequence[Task], options: LaunchOptions
) -> int:
    check_command(command, options.grace_seconds, len(tasks))
    env = options.env or {}  # (always a dict once LaunchOptions is made)
    local = is_loopback_cluster(cluster)
    if local:
        env = loopback.child_env(env)
    job = Job(options.out, options.grace_seconds)
    if not (local and loopback.library()):
        reason = (
            loopback.build_error() if local else "a multi-host job is reached from the other hosts"
        )
        for task in tasks:
            address = ClusterInfo(
                cluster=cluster, task_type=task.task_type, task_index=task.task_index
            ).address
            job.say(loopback.open_ports_warning(task.name, [address.rsplit(":", 1)[1]], reason))
    # Installed before any task starts: a Ctrl-C during start-up stops those already started.
    try:
        with (
            Supervisor(options.heartbeat_timeout, job.say, env) as supervisor,
            forwarding_signals(job.signal_all) as received,
        ):
            try:
                job.start(list(command), cluster, tasks, env, received, supervisor.task_env)
                code = _supervise(job, supervisor, received, options)
            finally:
                job.close()  # whatever the way out: no task, and nothing a task started, is left
            supervisor.finish()
            return code
    except LaunchError as error:
        error.port_taken = _port_was_taken(job, cluster)  # the tasks' output read to its end
        raise


def _port_was_taken(job, cluster):
    """The task that said its server could not bind its port while another process holds that port
    now (the task itself is gone): a port lost between its choice and its bind, not the job's
    fault. None if there is none."""
    for task in sorted(job.port_taken, key=lambda t: t.name):
        info = ClusterInfo(cluster=cluster, task_type=task.task_type, task_index=task.task_index)
        if port_in_use(info.address):
            return task.name
    return None


def _supervise(job, supervisor, received, options):
    """Watches the started tasks until the job ends: 0, or LaunchError."""
    reported = set()
    while True:
        if supervisor.watching:
            try:
                supervisor.check(
                    {t.name: p.pid for t, p in job.procs.items() if p.poll() is None},
                    lambda name: next((t for t in job.procs if t.name == name), None),
                )
            except LaunchError:  # a stalled task, named and its stacks dumped
                job.stop()
                raise
        if received:
            name = signal.Signals(received[0]).name
            job.say(
                f"{name} received and passed on; every task has {options.grace_seconds:g} s to exit"
            )
            job.stop(first=None)
            raise LaunchError(f"interrupted by {name}", returncode=128 + received[0])
        if options.watch is not None:
            try:
                options.watch()
            except Exception:
                # a membership change (or discovery failing): the job is stopped first
                job.stop()
                raise
        codes = {task: proc.poll() for task, proc in job.procs.items()}
        for task, code in codes.items():
            if task.serves and code is not None and task not in reported:
                reported.add(task)
                job.say(
                    f"{task.name} {describe_exit(code)}; the job carries on (parameter-server "
                    "training reschedules a lost worker's steps; a lost ps fails the chief)"
                )
        failed = [(t, c) for t, c in codes.items() if c not in (None, 0) and not t.serves]
        if failed:
            task, code = failed[0]
            job.say(f"{task.name} {describe_exit(code)}; stopping the other tasks")
            job.stop()
            raise LaunchError(
                f"{task.name} {describe_exit(code)}",
                task=task,
                returncode=code if code > 0 else 128 - code,
            )
        mains = [c for t, c in codes.items() if not t.serves]
        if not mains and all(c is not None for c in codes.values()):
            return 0  # a serving-only launch (one host of a PS cluster) whose server ended
        if mains and all(c == 0 for c in mains):
            if any(t.serves for t in codes):
                job.say("the chief finished; stopping the servers")
                job.stop()
            else:
                job.drain()
            return 0
        time.sleep(options.poll_seconds)


def warn_without_backup(state: str, options: LaunchOptions) -> bool:
    """After a failure: says, if the job's tasks made no FaultTolerance backup (its mark in
    ``state``), that the restart trains from the first epoch; returns whether it said so."""
    if os.path.exists(os.path.join(state, FAULT_TOLERANCE_MARK)):
        return False
    options.say(
        "warning: the command made no tfpar.callbacks.FaultTolerance backup, so training starts "
        "over from the first epoch; add FaultTolerance(backup_dir) to fit's callbacks to resume "
        "instead"
    )
    return True
