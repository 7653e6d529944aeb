"""``tfpar.launch.launch``: a job from counts or a cluster, every task here or this machine's, a
local job restarted on fresh ports when a task fails; and the cluster file it may read. Pure
Python."""

import dataclasses
import json
import time
from collections.abc import Sequence
from typing import Any

from tfpar._checks import check_int
from tfpar._local.processes import DEFAULT_GRACE_SECONDS, LaunchError, check_command
from tfpar._tasks.env import RESTART_VARIABLE, STATE_VARIABLE
from tfpar.cluster import ClusterInfo, validate_cluster
from tfpar.launch.job import Task, local_tasks
from tfpar.launch.runner import LaunchOptions, run_job, warn_without_backup

__all__ = ["PORT_RETRIES", "launch", "load_cluster_file", "local_job", "task_env_pairs"]

PORT_RETRIES = 3
"""How many times a local job starts again on fresh ports when a task's port was taken before its
server bound it (`tfpar.launch.job.PORT_TAKEN`); these starts count against no ``max_restarts``."""


def launch(
    command: Sequence[str],
    *,
    num_workers: int | None = None,
    num_ps: int = 0,
    cluster: dict | None = None,
    task: Task | None = None,
    tasks: Sequence[Task] | None = None,
    nproc_per_node: int | None = None,
    env: dict | None = None,
    out: Any = None,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    max_restarts: int = 0,
    heartbeat_timeout: float | None = None,
) -> int:
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
        >>> from tfpar.launch import launch
        >>> launch(["python", "train.py"], num_workers=2)  # doctest: +SKIP
    """
    options = LaunchOptions(
        env=env,
        out=out,
        grace_seconds=grace_seconds,
        max_restarts=max_restarts,
        heartbeat_timeout=heartbeat_timeout,
    )
    if cluster is not None:
        if max_restarts:
            raise ValueError(
                "max_restarts restarts a local job (-n), whose tasks one launcher starts. "
                f"Received: max_restarts={max_restarts} with a cluster of several hosts. There, "
                "restart through the scheduler (SLURM --requeue, a TFJob's restartPolicy), with "
                "FaultTolerance in the script."
            )
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
            num_workers, worker_envs = _per_node_workers(
                num_workers, num_ps, nproc_per_node, options
            )
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(
                "tfpar launch needs at least one worker. Received: "
                f"-n {num_workers}. Use e.g. -n 2."
            )
        if isinstance(num_ps, bool) or not isinstance(num_ps, int) or num_ps < 0:
            raise ValueError(f"--ps must be an int >= 0. Received: --ps {num_ps!r}.")
        check_command(command, grace_seconds, num_workers + num_ps + (1 if num_ps else 0))
        roles = (
            {"chief": 1, "worker": num_workers, "ps": num_ps} if num_ps else {"worker": num_workers}
        )
        return _run_restarting(command, roles, options, worker_envs)
    return run_job(command, cluster, tasks, options)


def _per_node_workers(num_workers, num_ps, nproc_per_node, options):
    """(the number of workers, each one's device environment) for ``nproc_per_node``."""
    from tfpar.launch.node import worker_envs

    check_int("nproc_per_node", nproc_per_node, 1, " (workers on this host, one per GPU)")
    if num_workers is not None:
        raise ValueError(
            f"Give -n or --nproc-per-node, not both. Received: -n {num_workers} --nproc-per-node "
            f"{nproc_per_node}. --nproc-per-node N starts N workers with a GPU (or a virtual CPU "
            "device) each; -n N starts N that share every device."
        )
    if num_ps:
        raise ValueError(
            f"--nproc-per-node starts the workers of a data-parallel job. Received: --ps {num_ps} "
            "with it. A parameter-server job is -n N --ps M."
        )
    envs, warning = worker_envs(nproc_per_node, options.env)
    if warning:
        options.say(warning)
    return nproc_per_node, envs


def task_env_pairs(env: dict) -> tuple:
    """A `Task.env` from a dict."""
    return tuple(sorted(env.items()))


def local_job(roles: dict, worker_envs: list | None = None) -> tuple[dict, list]:
    cluster, tasks = local_tasks(roles)
    if "ps" in roles:  # ps and workers serve; the chief runs the command
        tasks = [dataclasses.replace(t, serves=t.task_type != "chief") for t in tasks]
    if worker_envs:
        tasks = [
            dataclasses.replace(t, env=task_env_pairs(worker_envs[t.task_index]))
            if t.task_type == "worker"
            else t
            for t in tasks
        ]
    return cluster, tasks


def _run_restarting(command, roles, options, worker_envs=None):
    """Runs a local job, and up to ``options.max_restarts`` times again, on fresh ports, when a task
    fails."""
    import tempfile

    restarts, start = options.max_restarts, time.monotonic()
    taken = 0
    with tempfile.TemporaryDirectory(prefix="tfpar-launch-") as state:
        attempt = 0
        while True:
            cluster, tasks = local_job(roles, worker_envs)
            run = dataclasses.replace(
                options, env={**options.env, RESTART_VARIABLE: str(attempt), STATE_VARIABLE: state}
            )
            try:
                return run_job(command, cluster, tasks, run)
            except LaunchError as error:
                # not the job's fault: no restart counted
                if error.port_taken and taken < PORT_RETRIES:
                    taken += 1
                    options.say(
                        f"{error.port_taken}'s port was taken by another process after tfpar chose "
                        "it; starting the job again on fresh ports"
                    )
                    continue
                if error.task is None or attempt == restarts:  # interrupted, or out of restarts
                    if attempt and error.task is not None:
                        options.say(
                            f"giving up after {restarts} restart(s); the last failure: {error}"
                        )
                    raise
                options.say(
                    f"restart {attempt + 1} of {restarts} at {time.monotonic() - start:.1f} s: "
                    f"{error}; starting the {len(tasks)} task(s) again on fresh ports"
                )
                if attempt == 0:
                    warn_without_backup(state, options)
                attempt += 1


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
