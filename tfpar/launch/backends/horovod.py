"""``tfpar launch --horovod``: horovodrun on this machine."""

import os
import shutil

from tfpar._checks import check_number
from tfpar._local.processes import run_command
from tfpar.launch.backends.base import Backend
from tfpar.launch.config import LaunchConfig
from tfpar.launch.supervisor import Supervisor

__all__ = ["Horovod"]


class Horovod(Backend):
    """``horovodrun --gloo`` on this machine, which supervises the ranks; tfpar watches their
    heartbeats and merges Horovod's timeline into the job's."""

    name = "horovod"

    def chosen(self, config: LaunchConfig) -> bool:
        return config.horovod

    def check(self, config: LaunchConfig) -> None:
        if config.hosts or config.cluster:
            raise ValueError(
                "tfpar launch --horovod starts local ranks only. Received: --hosts/--cluster. "
                "On several machines run horovodrun -H host1:N,host2:N --gloo directly."
            )
        if config.ranks is None or config.ranks < 1:
            raise ValueError(
                f"tfpar launch --horovod needs -n N >= 1. Received: -n {config.ranks}."
            )
        if not config.command:
            raise ValueError("Nothing to launch. Received: an empty command.")
        check_number(
            "heartbeat_timeout",
            config.heartbeat_timeout,
            above=0,
            allow_none=True,
            hint=" (seconds a rank may make no step)",
        )
        if shutil.which("horovodrun") is None:
            from tfpar.strategies._horovod_init import INSTALL_HINT

            raise ValueError(
                f"tfpar launch --horovod needs horovodrun, which is not on PATH. {INSTALL_HINT}"
            )

    def start(self, config: LaunchConfig) -> int:
        n = str(config.ranks)
        horovodrun = shutil.which("horovodrun") or "horovodrun"
        argv = [horovodrun, "-np", n, "-H", f"localhost:{n}", "--gloo", *config.command]

        def say(message):
            print(f"tfpar launch: {message}", flush=True)

        with Supervisor(config.heartbeat_timeout, say) as supervisor:
            code = run_command(
                argv,
                env={**os.environ, **supervisor.task_env("rank-{rank}")},
                grace_seconds=config.grace,
                check=supervisor.check,
            )
            if code == 0:
                supervisor.finish("rank")
            return code
