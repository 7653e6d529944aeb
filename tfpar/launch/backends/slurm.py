"""``tfpar launch --slurm``: this srun task's worker."""

import os

from tfpar.launch.api import launch
from tfpar.launch.backends.base import Backend
from tfpar.launch.config import LaunchConfig
from tfpar.launch.job import Task

__all__ = ["Slurm"]


class Slurm(Backend):
    """This srun task's worker: the cluster from SLURM's variables, run as `Hosts` runs one task."""

    name = "slurm"

    def chosen(self, config: LaunchConfig) -> bool:
        # that mistake is Hosts' to name
        return config.slurm and not (config.hosts and config.cluster)

    def check(self, config: LaunchConfig) -> None:
        given = config.given(
            "workers",
            "hosts",
            "cluster",
            "task_index",
            "ps",
            "max_restarts",
            "nproc_per_node",
            "nnodes",
        )
        if given:
            raise ValueError(
                f"--slurm takes the cluster from SLURM. Received: --slurm with {', '.join(given)}. "
                "Leave those out (srun starts one task per worker)."
            )

    def start(self, config: LaunchConfig) -> int:
        from tfpar.cluster import ClusterInfo, slurm_gpu_env

        info = ClusterInfo.from_slurm()
        task = Task(task_type=info.task_type, task_index=info.task_index)
        return launch(
            list(config.command),
            cluster=info.cluster,
            task=task,
            env={**os.environ, **slurm_gpu_env()},
            grace_seconds=config.grace,
            heartbeat_timeout=config.heartbeat_timeout,
        )
