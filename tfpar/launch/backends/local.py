"""``tfpar launch -n N``: every task of the job on 127.0.0.1."""

from tfpar.launch.api import launch
from tfpar.launch.backends.base import Backend
from tfpar.launch.config import LaunchConfig

__all__ = ["Local"]


class Local(Backend):
    """Every task of the job on 127.0.0.1: ``-n`` workers (and ``--ps`` servers with a chief)."""

    name = "local"

    def chosen(self, config: LaunchConfig) -> bool:
        return True

    def check(self, config: LaunchConfig) -> None:
        if config.workers is None and config.nproc_per_node is None:
            raise ValueError(
                "Say how many local workers to start, or which cluster to join. "
                "Received: neither -n nor --hosts/--cluster. Write e.g. "
                "`tfpar launch -n 2 -- python train.py`."
            )

    def start(self, config: LaunchConfig) -> int:
        return launch(
            list(config.command),
            num_workers=config.workers,
            num_ps=config.ps,
            nproc_per_node=config.nproc_per_node,
            grace_seconds=config.grace,
            max_restarts=config.max_restarts,
            heartbeat_timeout=config.heartbeat_timeout,
        )
