"""How a job runs: its options (`LaunchOptions`), its tasks started and supervised, restarted on
fresh ports when one fails, and the per-node and elastic jobs built on that. The public names
are `tfpar.launch`'s. Pure Python: the launcher never imports TensorFlow."""

import dataclasses
import json
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
    run_command,
)
from tfpar._tasks.env import FAULT_TOLERANCE_MARK, RESTART_VARIABLE, STATE_VARIABLE
from tfpar.cluster import ClusterInfo, is_loopback_cluster, validate_cluster
from tfpar.launch.job import SERVER_COMMAND, Job, Task, describe_exit, local_tasks
from tfpar.launch.supervisor import Supervisor

PORT_RETRIES = 3
"""How many times a local job starts again on fresh ports when a task's port was taken before its
server bound it (`tfpar.launch.job.PORT_TAKEN`); these starts count against no ``max_restarts``."""

__all__ = ["FAULT_TOLERANCE_MARK", "LaunchError", "LaunchOptions", "RESTART_VARIABLE", "SERVER_COMMAND",
           "STATE_VARIABLE", "Task", "check_command", "launch", "load_cluster_file", "local_tasks", "run_command",
           "run_tasks"]


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
        check_int("max_restarts", self.max_restarts, 0, " (how many times a failed job is started again)")
        check_number("heartbeat_timeout", self.heartbeat_timeout, above=0, allow_none=True,
                     hint=" (seconds a task may make no step)")
        object.__setattr__(self, "env", dict(os.environ if self.env is None else self.env))
        object.__setattr__(self, "out", self.out or sys.stdout)

    def say(self, message: str) -> None:
        """Prints a launcher line."""
        self.out.write(f"tfpar launch: {message}\n")
        self.out.flush()


def run_tasks(command: Sequence[str], cluster: dict, tasks: Sequence[Task], *, env: dict | None = None,
              out: Any = None, grace_seconds: float = DEFAULT_GRACE_SECONDS, poll_seconds: float = 0.05,
              heartbeat_timeout: float | None = None) -> int:
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
    prints each task's mean step time against the median (stragglers); see `tfpar.launch.supervisor`.

    Raises:
        LaunchError: a task failed, hung or could not start, or the launcher was interrupted.
    """
    options = LaunchOptions(env=env, out=out, grace_seconds=grace_seconds, poll_seconds=poll_seconds,
                            heartbeat_timeout=heartbeat_timeout)
    return run_job(command, cluster, tasks, options)


def run_job(command, cluster, tasks, options):
    check_command(command, options.grace_seconds, len(tasks))
    env = options.env
    local = is_loopback_cluster(cluster)
    if local:
        env = loopback.child_env(env)
    job = Job(options.out, options.grace_seconds)
    if not (local and loopback.library()):
        reason = loopback.build_error() if local else "a multi-host job is reached from the other hosts"
        for task in tasks:
            address = ClusterInfo(cluster=cluster, task_type=task.task_type, task_index=task.task_index).address
            job.say(loopback.open_ports_warning(task.name, [address.rsplit(":", 1)[1]], reason))
    # Installed before any task starts: a Ctrl-C during start-up stops those already started.
    with Supervisor(options.heartbeat_timeout, job.say, env) as supervisor, \
            forwarding_signals(job.signal_all) as received:
        try:
            job.start(list(command), cluster, tasks, env, received, supervisor.task_env)
            code = _supervise(job, supervisor, received, options)
        except LaunchError as error:
            job.close()
            error.port_taken = error.task in job.port_taken
            raise
        finally:
            job.close()  # whatever the way out: no task, and nothing a task started, is left
        supervisor.finish()
        return code


def _supervise(job, supervisor, received, options):
    """Watches the started tasks until the job ends: 0, or LaunchError."""
    reported = set()
    while True:
        if supervisor.watching:
            try:
                supervisor.check({t.name: p.pid for t, p in job.procs.items() if p.poll() is None},
                                 lambda name: next((t for t in job.procs if t.name == name), None))
            except LaunchError:  # a stalled task, named and its stacks dumped
                job.stop()
                raise
        if received:
            name = signal.Signals(received[0]).name
            job.say(f"{name} received and passed on; every task has {options.grace_seconds:g} s to exit")
            job.stop(first=None)
            raise LaunchError(f"interrupted by {name}", returncode=128 + received[0])
        if options.watch is not None:
            try:
                options.watch()
            except Exception:  # a membership change (or discovery failing): the job is stopped first
                job.stop()
                raise
        codes = {task: proc.poll() for task, proc in job.procs.items()}
        for task, code in codes.items():
            if task.serves and code is not None and task not in reported:
                reported.add(task)
                job.say(f"{task.name} {describe_exit(code)}; the job carries on (parameter-server "
                        "training reschedules a lost worker's steps; a lost ps fails the chief)")
        failed = [(t, c) for t, c in codes.items() if c not in (None, 0) and not t.serves]
        if failed:
            task, code = failed[0]
            job.say(f"{task.name} {describe_exit(code)}; stopping the other tasks")
            job.stop()
            raise LaunchError(f"{task.name} {describe_exit(code)}", task=task,
                              returncode=code if code > 0 else 128 - code)
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


def launch(command: Sequence[str], *, num_workers: int | None = None, num_ps: int = 0, cluster: dict | None = None,
           task: Task | None = None, tasks: Sequence[Task] | None = None, nproc_per_node: int | None = None,
           env: dict | None = None, out: Any = None, grace_seconds: float = DEFAULT_GRACE_SECONDS,
           max_restarts: int = 0, heartbeat_timeout: float | None = None) -> int:
    """Launches a job: every task locally, or this machine's task of a cluster.

    Args:
        command: the program and its arguments, e.g. ``["python", "train.py"]``.
        num_workers: start this many workers on 127.0.0.1 (local mode).
        num_ps: with > 0, a parameter-server job: ``num_ps`` ps and
            ``num_workers`` worker servers, and one chief that runs ``command``;
            the servers are stopped when the chief finishes.
        nproc_per_node: local mode, instead of ``num_workers``: this many workers, each with its own
            GPUs (``CUDA_VISIBLE_DEVICES``) or, without a GPU, its own virtual CPU device
            (`tfpar.launch.node.worker_envs`), as torchrun's and horovodrun's users expect.
        cluster: a cluster dict for a multi-host job (with ``task`` or ``tasks``).
        task: this machine's `Task` in ``cluster``.
        tasks: this machine's tasks in ``cluster``, when it runs several (``--nproc-per-node``).
        env: environment for the tasks (default: this process's).
        out: where prefixed output goes (default: stdout).
        grace_seconds: how long a stopped task may take to exit before SIGKILL.
        max_restarts: a local job only: when a task fails, stop the others and start the whole
            job again on fresh ports, up to this many times (as torchrun does); training resumes
            from `tfpar.callbacks.FaultTolerance`'s backup. Every task gets
            ``TFPAR_RESTART_COUNT``.
        heartbeat_timeout: seconds a task may make no step before it is named hung, its stacks
            dumped and the job stopped (or restarted); see `run_tasks`.

    Returns:
        0 when every task succeeded.

    Raises:
        ValueError: on a bad count, cluster or command.
        LaunchError: when a task fails (after ``max_restarts`` restarts: the last failure).

    Examples:
        >>> from tfpar.launch.runner import launch
        >>> launch(["python", "train.py"], num_workers=2)  # doctest: +SKIP
    """
    options = LaunchOptions(env=env, out=out, grace_seconds=grace_seconds, max_restarts=max_restarts,
                            heartbeat_timeout=heartbeat_timeout)
    if cluster is not None:
        if max_restarts:
            raise ValueError(
                "max_restarts restarts a local job (-n), whose tasks one launcher starts. Received: "
                f"max_restarts={max_restarts} with a cluster of several hosts. There, restart through "
                "the scheduler (SLURM --requeue, a TFJob's restartPolicy), with FaultTolerance in the script.")
        if num_workers is not None:
            raise ValueError(
                "Give either a number of local workers or a cluster, not both. "
                f"Received: num_workers={num_workers} and a cluster."
            )
        if (task is None) == (tasks is None):
            raise ValueError(
                "A multi-host job needs this machine's task: --task-index K "
                "(and --task-type if not a worker)."
            )
        tasks = [task] if task is not None else list(tasks or ())
        for one in tasks:
            ClusterInfo(cluster=cluster, task_type=one.task_type, task_index=one.task_index)
        check_command(command, grace_seconds, len(tasks))
    else:
        worker_envs = None
        if nproc_per_node is not None:
            num_workers, worker_envs = _per_node_workers(num_workers, num_ps, nproc_per_node, options)
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(
                "tfpar launch needs at least one worker. Received: "
                f"-n {num_workers}. Use e.g. -n 2."
            )
        if isinstance(num_ps, bool) or not isinstance(num_ps, int) or num_ps < 0:
            raise ValueError(f"--ps must be an int >= 0. Received: --ps {num_ps!r}.")
        check_command(command, grace_seconds, num_workers + num_ps + (1 if num_ps else 0))
        roles = {"chief": 1, "worker": num_workers, "ps": num_ps} if num_ps else {"worker": num_workers}
        return _run_restarting(command, roles, options, worker_envs)
    return run_job(command, cluster, tasks, options)


def _per_node_workers(num_workers, num_ps, nproc_per_node, options):
    """(the number of workers, each one's device environment) for ``nproc_per_node``."""
    from tfpar.launch.node import worker_envs

    check_int("nproc_per_node", nproc_per_node, 1, " (workers on this host, one per GPU)")
    if num_workers is not None:
        raise ValueError(
            f"Give -n or --nproc-per-node, not both. Received: -n {num_workers} --nproc-per-node {nproc_per_node}. "
            "--nproc-per-node N starts N workers with a GPU (or a virtual CPU device) each; -n N starts N that "
            "share every device.")
    if num_ps:
        raise ValueError(
            f"--nproc-per-node starts the workers of a data-parallel job. Received: --ps {num_ps} with it. "
            "A parameter-server job is -n N --ps M.")
    envs, warning = worker_envs(nproc_per_node, options.env)
    if warning:
        options.say(warning)
    return nproc_per_node, envs


def task_env_pairs(env):
    """A `Task.env` from a dict."""
    return tuple(sorted(env.items()))


def local_job(roles, worker_envs=None):
    cluster, tasks = local_tasks(roles)
    if "ps" in roles:  # ps and workers serve; the chief runs the command
        tasks = [dataclasses.replace(t, serves=t.task_type != "chief") for t in tasks]
    if worker_envs:
        tasks = [dataclasses.replace(t, env=task_env_pairs(worker_envs[t.task_index])) if t.task_type == "worker"
                 else t for t in tasks]
    return cluster, tasks


def _run_restarting(command, roles, options, worker_envs=None):
    """Runs a local job, and up to ``options.max_restarts`` times again, on fresh ports, when a task fails."""
    import tempfile

    restarts, start = options.max_restarts, time.monotonic()
    taken = 0
    with tempfile.TemporaryDirectory(prefix="tfpar-launch-") as state:
        attempt = 0
        while True:
            cluster, tasks = local_job(roles, worker_envs)
            run = dataclasses.replace(options, env={**options.env, RESTART_VARIABLE: str(attempt), STATE_VARIABLE: state})
            try:
                return run_job(command, cluster, tasks, run)
            except LaunchError as error:
                if error.port_taken and taken < PORT_RETRIES:  # not the job's fault: no restart counted
                    taken += 1
                    options.say(f"{error.task.name}'s port was taken by another process after tfpar chose it; "
                                "starting the job again on fresh ports")
                    continue
                if error.task is None or attempt == restarts:  # interrupted, or out of restarts
                    if attempt and error.task is not None:
                        options.say(f"giving up after {restarts} restart(s); the last failure: {error}")
                    raise
                options.say(f"restart {attempt + 1} of {restarts} at {time.monotonic() - start:.1f} s: {error}; "
                            f"starting the {len(tasks)} task(s) again on fresh ports")
                if attempt == 0:
                    warn_without_backup(state, options)
                attempt += 1


def warn_without_backup(state: str, options: LaunchOptions) -> bool:
    """After a failure: says, if the job's tasks made no FaultTolerance backup (its mark in ``state``), that
    the restart trains from the first epoch; returns whether it said so."""
    if os.path.exists(os.path.join(state, FAULT_TOLERANCE_MARK)):
        return False
    options.say("warning: the command made no tfpar.callbacks.FaultTolerance backup, so training starts over "
                "from the first epoch; add FaultTolerance(backup_dir) to fit's callbacks to resume instead")
    return True


def load_cluster_file(path: str) -> dict:
    """Reads a cluster from a JSON file: ``{"worker": [...]}`` or ``{"cluster": {...}}``."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"Cannot read the cluster file {path!r}: {e}.") from None
    if isinstance(data, dict) and "cluster" in data:
        data = data["cluster"]
    try:
        validate_cluster(data)
    except ValueError as e:
        raise ValueError(f"The cluster file {path!r} is not a valid cluster: {e}") from None
    return data
