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

from tfpar._checks import check_choice, check_int, check_number
from tfpar.cluster import ROLES, ClusterInfo, local_cluster

__all__ = ["LaunchError", "SERVER_COMMAND", "Task", "launch", "load_cluster_file", "local_tasks", "run_tasks"]

DEFAULT_GRACE_SECONDS = 10.0
SERVER_COMMAND = (sys.executable, "-m", "tfpar._server")
"""What a serving task runs: a TensorFlow server for its TF_CONFIG task."""


class LaunchError(RuntimeError):
    """A task of the job failed; ``task`` and ``returncode`` say which and how."""

    def __init__(self, message, task=None, returncode=1):
        super().__init__(message)
        self.task = task
        self.returncode = returncode


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
    """The running processes of a job and their output pumps."""

    def __init__(self, command, cluster, tasks, env, out):
        self.out = out
        self.lock = threading.Lock()
        self.procs = {}
        self.pumps = []
        for task in tasks:
            info = ClusterInfo(cluster=cluster, task_type=task.task_type, task_index=task.task_index)
            child_env = dict(env)
            child_env.update(TF_CONFIG=info.to_tf_config(), PYTHONUNBUFFERED="1")
            proc = subprocess.Popen(
                list(SERVER_COMMAND) if task.serves else command,
                env=child_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # our own signals reach it only when we forward them
            )
            self.procs[task] = proc
            pump = threading.Thread(target=self._pump, args=(task, proc), daemon=True)
            pump.start()
            self.pumps.append(pump)

    def _pump(self, task, proc):
        prefix = f"[{task.name}] "
        for raw in iter(proc.stdout.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with self.lock:
                self.out.write(prefix + line + "\n")
                self.out.flush()
        proc.stdout.close()

    def say(self, message):
        with self.lock:
            self.out.write(f"tfpar launch: {message}\n")
            self.out.flush()

    def signal_all(self, sig):
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass

    def stop(self, grace_seconds, sig=signal.SIGTERM):
        """Signals every live task, then kills what outlives the grace period."""
        self.signal_all(sig)
        deadline = time.monotonic() + grace_seconds
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs.values()):
            time.sleep(0.05)
        self.signal_all(signal.SIGKILL)
        for proc in self.procs.values():
            proc.wait()
        self.drain()

    def drain(self):
        for pump in self.pumps:
            pump.join(timeout=5)


def _describe_exit(code):
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def run_tasks(command, cluster, tasks, *, env=None, out=None, grace_seconds=DEFAULT_GRACE_SECONDS,
              poll_seconds=0.05):
    """Runs ``command`` once per task and supervises the processes.

    Returns 0 when every task exits 0. When a task fails (non-zero exit or a
    signal) the others get SIGTERM, then SIGKILL after ``grace_seconds``, and
    `LaunchError` names the task. Serving tasks (`Task.serves`) run a server,
    are stopped once the other tasks succeed, and may die without ending the job. SIGINT/SIGTERM sent to the launcher are
    forwarded to every task.

    Raises:
        LaunchError: a task failed, or the launcher was interrupted.
    """
    out = out or sys.stdout
    env = dict(os.environ if env is None else env)
    job = _Job(list(command), cluster, tasks, env, out)
    received, reported = [], set()

    def forward(signum, _frame):
        received.append(signum)
        job.signal_all(signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, forward)
    try:
        while True:
            if received:
                job.say(f"{signal.Signals(received[0]).name} received; stopping every task")
                job.stop(grace_seconds)
                raise LaunchError(
                    f"interrupted by {signal.Signals(received[0]).name}",
                    returncode=128 + received[0],
                )
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
                job.stop(grace_seconds)
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
                    job.stop(grace_seconds)
                else:
                    job.drain()
                return 0
            time.sleep(poll_seconds)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def launch(command, *, num_workers=None, num_ps=0, cluster=None, task=None, env=None, out=None,
           grace_seconds=DEFAULT_GRACE_SECONDS):
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

    Returns:
        0 when every task succeeded.

    Raises:
        ValueError: on a bad count, cluster or command.
        LaunchError: when a task fails.

    Example:
        >>> from tfpar.launch import launch
        >>> launch(["python", "train.py"], num_workers=2)  # doctest: +SKIP
    """
    if not command:
        raise ValueError(
            "Nothing to launch. Received: an empty command. Write e.g. "
            "`tfpar launch -n 2 -- python train.py`."
        )
    check_number("grace_seconds", grace_seconds, minimum=0)
    if cluster is not None:
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
        tasks = [task]
    else:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(
                "tfpar launch needs at least one worker. Received: "
                f"-n {num_workers}. Use e.g. -n 2."
            )
        if isinstance(num_ps, bool) or not isinstance(num_ps, int) or num_ps < 0:
            raise ValueError(f"--ps must be an int >= 0. Received: --ps {num_ps!r}.")
        if num_ps:
            cluster, tasks = local_tasks({"chief": 1, "worker": num_workers, "ps": num_ps})
            tasks = [dataclasses.replace(t, serves=t.task_type != "chief") for t in tasks]
        else:
            cluster, tasks = local_tasks({"worker": num_workers})
    return run_tasks(command, cluster, tasks, env=env, out=out, grace_seconds=grace_seconds)


def load_cluster_file(path):
    """Reads a cluster from a JSON file: ``{"worker": [...]}`` or ``{"cluster": {...}}``."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"Cannot read the cluster file {path!r}: {e}.") from None
    if isinstance(data, dict) and "cluster" in data:
        data = data["cluster"]
    return data
