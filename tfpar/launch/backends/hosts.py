"""``tfpar launch --hosts`` / ``--cluster``: this machine's task(s) of a named cluster."""

from tfpar._checks import check_int
from tfpar.launch.api import launch, load_cluster_file
from tfpar.launch.backends.base import Backend, worker_envs, worker_tasks
from tfpar.launch.config import LaunchConfig
from tfpar.launch.job import Task

__all__ = ["Hosts"]


class Hosts(Backend):
    """This machine's task of a cluster named by ``--hosts`` (workers) or ``--cluster`` (a file)."""

    name = "hosts"

    def chosen(self, config: LaunchConfig) -> bool:
        return bool(config.hosts or config.cluster)

    def check(self, config: LaunchConfig) -> None:
        if config.hosts and config.cluster:
            raise ValueError("Give --hosts or --cluster, not both.")

    def start(self, config: LaunchConfig) -> int:
        from tfpar.cluster import parse_hosts

        if config.hosts:
            cluster = {"worker": parse_hosts(config.hosts)}
            given = f"--hosts {config.hosts}"
        else:
            cluster = load_cluster_file(str(config.cluster))
            given = f"--cluster {config.cluster}"
        if config.task_index is None:
            raise ValueError(
                f"A multi-host job needs this machine's --task-index. Received: {given} without it."
            )
        if config.nproc_per_node is not None:
            return self._start_per_node(config, cluster["worker"])
        # In a parameter-server cluster, ps and worker tasks serve; the chief runs the command.
        serves = "ps" in cluster and config.task_type in ("ps", "worker")
        task = Task(task_type=config.task_type, task_index=config.task_index, serves=serves)
        return launch(
            list(config.command),
            num_workers=config.workers,
            num_ps=config.ps,
            cluster=cluster,
            task=task,
            grace_seconds=config.grace,
            max_restarts=config.max_restarts,
            heartbeat_timeout=config.heartbeat_timeout,
        )

    def _start_per_node(self, config, hosts):
        """``--hosts a:2222,b:2222 --nproc-per-node N --task-index K``: host K runs workers K·N to
        K·N+N-1 on its ports 2222 to 2222+N-1 (horovodrun's ``-H a:N,b:N``)."""
        if config.cluster or config.ps or config.task_type != "worker":
            raise ValueError(
                "--nproc-per-node with a cluster takes --hosts (workers only). Received: "
                f"--cluster/--ps/--task-type {config.task_type}. Write --hosts a:2222,b:2222 "
                "--nproc-per-node N."
            )
        n = config.nproc_per_node
        check_int("--nproc-per-node", n, 1)
        if not 0 <= config.task_index < len(hosts):
            raise ValueError(
                "--task-index names this host in --hosts. Received: --task-index "
                f"{config.task_index} with {len(hosts)} hosts. Use 0 to {len(hosts) - 1}."
            )
        workers = []
        for address in hosts:
            host, port = address.rsplit(":", 1)
            workers += [f"{host}:{int(port) + i}" for i in range(n)]
        tasks = worker_tasks(config.task_index * n, worker_envs(n))
        return launch(
            list(config.command),
            cluster={"worker": workers},
            tasks=tasks,
            grace_seconds=config.grace,
            max_restarts=config.max_restarts,
            heartbeat_timeout=config.heartbeat_timeout,
        )
