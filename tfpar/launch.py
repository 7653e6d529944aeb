"""``tfpar launch``: start a job's processes with the right roles and TF_CONFIG.

On one machine, ``launch(cmd, roles={"worker": 2})`` starts every task on
127.0.0.1 with free ports. On several machines each one runs
``tfpar launch --hosts a:2222,b:2222 --task-index K -- cmd``, which starts
just its own task. Every output line is prefixed with its task
(``[worker 1] ...``); Ctrl-C is forwarded to every task; when a task fails
the others are stopped and the launcher exits non-zero naming it.

Pure Python: the launcher never imports TensorFlow, so it starts at once.
"""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time

from tfpar import _loopback as loopback
from tfpar._checks import check_choice, check_int, check_number
from tfpar._processes import (DEFAULT_GRACE_SECONDS, LaunchError, ProcessGroups, check_command,
                              forwarding_signals, run_command)
from tfpar._heartbeat import HEARTBEAT_VARIABLE, Watch, hang_error
from tfpar._task_env import FAULT_TOLERANCE_MARK, RESTART_VARIABLE, STATE_VARIABLE
from tfpar.cluster import ROLES, ClusterInfo, is_loopback_cluster, local_cluster, validate_cluster

__all__ = ["FAULT_TOLERANCE_MARK", "LaunchError", "RESTART_VARIABLE", "SERVER_COMMAND", "STATE_VARIABLE", "Task",
           "check_command", "launch", "load_cluster_file", "local_tasks", "run_command", "run_tasks"]

SERVER_COMMAND = (sys.executable, "-m", "tfpar._server")
"""What a serving task runs: a TensorFlow server for its TF_CONFIG task."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Task:
    """One process of a job."""

    task_type: str
    """Its role: "chief", "worker", "ps" or "evaluator"."""
    task_index: int
    """Its index among the tasks of that role."""
    serves: bool = False
    """Whether it only serves (a ps, or a worker of a parameter-server job):
    it runs a TensorFlow server instead of the command, is stopped when the
    job's command tasks finish, and its death does not end the job."""

    @property
    def name(self):
        """``"worker 1"``: how output and errors name it."""
        return f"{self.task_type} {self.task_index}"


def local_tasks(roles):
    """Returns (cluster on 127.0.0.1 with free ports, all its tasks).

    Args:
        roles: role -> count, e.g. ``{"worker": 2}``.

    Raises:
        ValueError: on an unknown role, a negative count, or no training task.
    """
    for role, count in roles.items():
        check_choice("role", role, ROLES)
        check_int(role, count, 0, f" (the number of {role} tasks)")
    if roles.get("worker", 0) + roles.get("chief", 0) < 1:
        raise ValueError(
            "A job needs at least one worker. Received: "
            f"{', '.join(f'{r}={n}' for r, n in roles.items())}. Use e.g. -n 2."
        )
    cluster = local_cluster(roles)
    tasks = [Task(task_type=r, task_index=i) for r in cluster for i in range(len(cluster[r]))]
    return cluster, tasks


class _Job:
    """The running processes of a job, their output pumps and their process groups."""

    def __init__(self, out, grace_seconds, heartbeats=None):
        self.heartbeats = heartbeats  # the folder of the tasks' heartbeat files, or None
        self.out = out
        self.out_closed = False
        self.lock = threading.Lock()
        self.procs = {}
        self.pumps = []
        self.groups = ProcessGroups(grace_seconds)

    def start(self, command, cluster, tasks, env, received=()):
        """Starts every task; on a failure to start, stops those started and raises LaunchError.

        Once a signal is in ``received``, no further task starts.
        """
        for task in tasks:
            if received:
                return
            info = ClusterInfo(cluster=cluster, task_type=task.task_type, task_index=task.task_index)
            child_env = dict(env)
            child_env.update(TF_CONFIG=info.to_tf_config(), PYTHONUNBUFFERED="1")
            if self.heartbeats is not None:
                child_env[HEARTBEAT_VARIABLE] = self.heartbeat_file(task)
            argv = list(SERVER_COMMAND) if task.serves else command
            try:
                proc = subprocess.Popen(
                    argv, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,  # its own group: our signals reach it only when we forward them
                )
            except OSError as e:
                self.close()
                raise LaunchError(f"could not start {task.name} ({argv[0]}): {e}. The "
                                  f"{len(self.procs)} task(s) already started were stopped.",
                                  task=task) from None
            self.procs[task] = proc
            self.groups.add(proc.pid)
            pump = threading.Thread(target=self._pump, args=(task, proc), daemon=True)
            pump.start()
            self.pumps.append(pump)

    def heartbeat_file(self, task):
        return os.path.join(self.heartbeats, task.name.replace(" ", "-"))

    def _write(self, text):
        with self.lock:
            if self.out_closed:
                return
            try:
                self.out.write(text)
                self.out.flush()
            except (BrokenPipeError, ValueError):  # e.g. `| head -1` exited: drop the rest
                self.out_closed = True

    def _pump(self, task, proc):
        prefix = f"[{task.name}] "
        # Read to the end even when nobody reads our output: a task must never block on a full pipe.
        for raw in iter(proc.stdout.readline, b""):
            self._write(prefix + raw.decode("utf-8", "replace").rstrip("\n") + "\n")
        proc.stdout.close()

    def say(self, message):
        self._write(f"tfpar launch: {message}\n")

    def signal_all(self, sig):
        self.groups.send(sig)

    def stop(self, first=signal.SIGTERM):
        """``first`` to every task's group (None: already sent), SIGKILL after the grace period."""
        self.groups.stop(first if first is not None else 0)
        for proc in self.procs.values():
            proc.wait()
        self.drain()

    def drain(self):
        for pump in self.pumps:
            pump.join(timeout=5)

    def close(self):
        """Nothing of the job is left: every group (grandchildren too) ended, the watchdog released."""
        self.groups.close()
        for proc in self.procs.values():
            proc.wait()
        self.drain()


def _describe_exit(code):
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def run_tasks(command, cluster, tasks, *, env=None, out=None, grace_seconds=DEFAULT_GRACE_SECONDS,
              poll_seconds=0.05, heartbeat_timeout=None):
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
    on loopback only (`tfpar._loopback`); otherwise the launcher names the ports
    its tasks open on all interfaces.

    With ``heartbeat_timeout`` (seconds), each task's ``fit``/``evaluate``/``predict`` reports its
    steps (`tfpar.callbacks.Heartbeat`); a task that makes no step for that long is named, its
    stacks are dumped, and the job is stopped (`LaunchError`, code 124). At the end the launcher
    prints each task's mean step time against the median (stragglers).

    Raises:
        LaunchError: a task failed, hung or could not start, or the launcher was interrupted.
    """
    check_command(command, grace_seconds, len(tasks))
    if heartbeat_timeout is None:
        return _run_tasks(command, cluster, tasks, env, out, grace_seconds, poll_seconds, None, None)
    check_number("heartbeat_timeout", heartbeat_timeout, above=0, hint=" (seconds without a step)")
    import tempfile

    with tempfile.TemporaryDirectory(prefix="tfpar-heartbeat-") as folder:
        return _run_tasks(command, cluster, tasks, env, out, grace_seconds, poll_seconds, heartbeat_timeout, folder)


def _run_tasks(command, cluster, tasks, env, out, grace_seconds, poll_seconds, heartbeat_timeout, heartbeats):
    out = out or sys.stdout
    env = dict(os.environ if env is None else env)
    local = is_loopback_cluster(cluster)
    if local:
        env = loopback.child_env(env)
    job = _Job(out, grace_seconds, heartbeats)
    if not (local and loopback.library()):
        reason = loopback.build_error() if local else "a multi-host job is reached from the other hosts"
        for task in tasks:
            address = ClusterInfo(cluster=cluster, task_type=task.task_type, task_index=task.task_index).address
            job.say(loopback.open_ports_warning(task.name, [address.rsplit(":", 1)[1]], reason))
    reported = set()
    # Installed before any task starts: a Ctrl-C during start-up stops those already started.
    with forwarding_signals(job.signal_all) as received:
        return _supervise(job, command, cluster, tasks, env, received, reported, grace_seconds, poll_seconds,
                          heartbeat_timeout)


def _supervise(job, command, cluster, tasks, env, received, reported, grace_seconds, poll_seconds,
               heartbeat_timeout=None):
    watch = Watch(job.heartbeats, heartbeat_timeout) if heartbeat_timeout is not None else None
    try:
        job.start(list(command), cluster, tasks, env, received)
        while True:
            if watch is not None:
                _check_heartbeats(job, watch)
            if received:
                name = signal.Signals(received[0]).name
                job.say(f"{name} received and passed on; every task has {grace_seconds:g} s to exit")
                job.stop(first=None)
                raise LaunchError(f"interrupted by {name}", returncode=128 + received[0])
            codes = {task: proc.poll() for task, proc in job.procs.items()}
            for task, code in codes.items():
                if task.serves and code is not None and task not in reported:
                    reported.add(task)
                    job.say(f"{task.name} {_describe_exit(code)}; the job carries on (parameter-server "
                            "training reschedules a lost worker's steps; a lost ps fails the chief)")
            failed = [(t, c) for t, c in codes.items() if c not in (None, 0) and not t.serves]
            if failed:
                task, code = failed[0]
                job.say(f"{task.name} {_describe_exit(code)}; stopping the other tasks")
                job.stop()
                raise LaunchError(
                    f"{task.name} {_describe_exit(code)}",
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
                steps = watch.step_times() if watch is not None else None
                if steps:
                    job.say(f"mean step time per task (÷ the median): {steps}")
                return 0
            time.sleep(poll_seconds)
    finally:
        job.close()  # whatever the way out: no task, and nothing a task started, is left


def _check_heartbeats(job, watch):
    """Stops the job (LaunchError, code 124) when its heartbeats say it stalled (`Watch.check`)."""
    others = {task.name: proc.pid for task, proc in job.procs.items() if proc.poll() is None}
    hang = watch.check(others)
    if hang is None:
        return
    error = hang_error(hang, job.say, task=next((t for t in job.procs if t.name == hang.name), None))
    job.stop()
    raise error


def launch(command, *, num_workers=None, num_ps=0, cluster=None, task=None, env=None, out=None,
           grace_seconds=DEFAULT_GRACE_SECONDS, max_restarts=0, heartbeat_timeout=None):
    """Launches a job: every task locally, or this machine's task of a cluster.

    Args:
        command: the program and its arguments, e.g. ``["python", "train.py"]``.
        num_workers: start this many workers on 127.0.0.1 (local mode).
        num_ps: with > 0, a parameter-server job: ``num_ps`` ps and
            ``num_workers`` worker servers, and one chief that runs ``command``;
            the servers are stopped when the chief finishes.
        cluster: a cluster dict for a multi-host job (with ``task``).
        task: this machine's `Task` in ``cluster``.
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

    Example:
        >>> from tfpar.launch import launch
        >>> launch(["python", "train.py"], num_workers=2)  # doctest: +SKIP
    """
    check_int("max_restarts", max_restarts, 0, " (how many times a failed job is started again)")
    check_number("heartbeat_timeout", heartbeat_timeout, above=0, allow_none=True,
                 hint=" (seconds a task may make no step)")
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
        if task is None:
            raise ValueError(
                "A multi-host job needs this machine's task: --task-index K "
                "(and --task-type if not a worker)."
            )
        ClusterInfo(cluster=cluster, task_type=task.task_type, task_index=task.task_index)
        check_command(command, grace_seconds)
        tasks = [task]
    else:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(
                "tfpar launch needs at least one worker. Received: "
                f"-n {num_workers}. Use e.g. -n 2."
            )
        if isinstance(num_ps, bool) or not isinstance(num_ps, int) or num_ps < 0:
            raise ValueError(f"--ps must be an int >= 0. Received: --ps {num_ps!r}.")
        check_command(command, grace_seconds, num_workers + num_ps + (1 if num_ps else 0))
        roles = {"chief": 1, "worker": num_workers, "ps": num_ps} if num_ps else {"worker": num_workers}
        return _run_restarting(command, roles, env, out, grace_seconds, max_restarts, heartbeat_timeout)
    return run_tasks(command, cluster, tasks, env=env, out=out, grace_seconds=grace_seconds,
                     heartbeat_timeout=heartbeat_timeout)


def _local_job(roles):
    cluster, tasks = local_tasks(roles)
    if "ps" in roles:  # ps and workers serve; the chief runs the command
        tasks = [dataclasses.replace(t, serves=t.task_type != "chief") for t in tasks]
    return cluster, tasks


def _run_restarting(command, roles, env, out, grace_seconds, max_restarts, heartbeat_timeout):
    """Runs a local job, and up to ``max_restarts`` times again, on fresh ports, when a task fails."""
    import tempfile

    out = out or sys.stdout
    env = dict(os.environ if env is None else env)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tfpar-launch-") as state:
        for attempt in range(max_restarts + 1):
            cluster, tasks = _local_job(roles)
            run_env = {**env, RESTART_VARIABLE: str(attempt), STATE_VARIABLE: state}
            try:
                return run_tasks(command, cluster, tasks, env=run_env, out=out, grace_seconds=grace_seconds,
                                 heartbeat_timeout=heartbeat_timeout)
            except LaunchError as error:
                if error.task is None or attempt == max_restarts:  # interrupted, or out of restarts
                    if attempt and error.task is not None:
                        _say(out, f"giving up after {max_restarts} restart(s); the last failure: {error}")
                    raise
                _say(out, f"restart {attempt + 1} of {max_restarts} at {time.monotonic() - start:.1f} s: {error}; "
                          f"starting the {len(tasks)} task(s) again on fresh ports")
                if attempt == 0 and not os.path.exists(os.path.join(state, FAULT_TOLERANCE_MARK)):
                    _say(out, "warning: the command made no tfpar.callbacks.FaultTolerance backup, so "
                              "training starts over from the first epoch; add "
                              "FaultTolerance(backup_dir) to fit's callbacks to resume instead")


def _say(out, message):
    out.write(f"tfpar launch: {message}\n")
    out.flush()


def load_cluster_file(path):
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
