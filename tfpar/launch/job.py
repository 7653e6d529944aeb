"""The processes of a job: its tasks, started with their TF_CONFIG, their output prefixed and
pumped, their process groups stopped together. Pure Python: `tfpar.launch` supervises them.
"""

import dataclasses
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence

from tfpar._checks import check_choice, check_int
from tfpar._local.processes import LaunchError, ProcessGroups
from tfpar.cluster import ROLES, ClusterInfo, local_cluster

__all__ = ["PORT_TAKEN", "SERVER_COMMAND", "Job", "Task", "describe_exit", "local_tasks"]

SERVER_COMMAND = (sys.executable, "-m", "tfpar._local.server")
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
    env: tuple = ()
    """(name, value) pairs of its own environment, on top of the job's (its GPUs with
    ``--nproc-per-node``: `tfpar.launch.node.worker_envs`)."""

    @property
    def name(self):
        """``"worker 1"``: how output and errors name it."""
        return f"{self.task_type} {self.task_index}"


def local_tasks(roles: Mapping[str, int]) -> tuple[dict[str, list[str]], list[Task]]:
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


PORT_TAKEN = re.compile(r"Address already in use|Could not start gRPC server|Failed to add port")
"""What a task prints when its server cannot bind its port (TensorFlow's gRPC server, a socket)."""


class Job:
    """The running processes of a job, their output pumps and their process groups."""

    def __init__(self, out, grace_seconds):
        self.out = out
        self.port_taken: set = set()
        """The tasks whose output said their port was taken."""
        self.out_closed = False
        self.lock = threading.Lock()
        self.procs = {}
        self.pumps = []
        self.groups = ProcessGroups(grace_seconds)

    def start(
        self,
        command: list[str],
        cluster: dict,
        tasks: Sequence["Task"],
        env: Mapping[str, str],
        received: Sequence[int] = (),
        task_env: Callable[[str], dict] = lambda name: {},
    ) -> None:
        """Starts every task (its environment: ``env``, its TF_CONFIG and ``task_env(its name)``);
        on a failure to start, stops those started and raises LaunchError.

        Once a signal is in ``received``, no further task starts.
        """
        for task in tasks:
            if received:
                return
            info = ClusterInfo(
                cluster=cluster, task_type=task.task_type, task_index=task.task_index
            )
            child_env = {**env, **dict(task.env)}
            child_env.update(
                TF_CONFIG=info.to_tf_config(), PYTHONUNBUFFERED="1", **task_env(task.name)
            )
            argv = list(SERVER_COMMAND) if task.serves else command
            try:
                proc = subprocess.Popen(
                    argv,
                    env=child_env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    # Its own group: our signals reach it only when we forward them.
                    start_new_session=True,
                )
            except OSError as e:
                self.close()
                raise LaunchError(
                    f"could not start {task.name} ({argv[0]}): {e}. The "
                    f"{len(self.procs)} task(s) already started were stopped.",
                    task=task,
                ) from None
            self.procs[task] = proc
            self.groups.add(proc.pid)
            pump = threading.Thread(target=self._pump, args=(task, proc), daemon=True)
            pump.start()
            self.pumps.append(pump)

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
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if PORT_TAKEN.search(line):
                self.port_taken.add(task)
            self._write(prefix + line + "\n")
        proc.stdout.close()

    def say(self, message: str) -> None:
        self._write(f"tfpar launch: {message}\n")

    def signal_all(self, sig: int) -> None:
        self.groups.send(sig)

    def stop(self, first: int | None = signal.SIGTERM) -> None:
        """``first`` to every task's group (None: already sent), SIGKILL after the grace period."""
        self.groups.stop(first if first is not None else 0)
        for proc in self.procs.values():
            proc.wait()
        self.drain()

    def drain(self) -> None:
        for pump in self.pumps:
            pump.join(timeout=5)

    def close(self) -> None:
        """Nothing of the job is left: every group (grandchildren too) ended, the watchdog
        released."""
        self.groups.close()
        for proc in self.procs.values():
            proc.wait()
        self.drain()


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"
