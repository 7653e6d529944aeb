"""``tfpar launch --min-workers/--max-workers/--host-discovery-*``: an elastic local job."""

from tfpar._checks import check_number
from tfpar.launch.backends.base import Backend
from tfpar.launch.config import LaunchConfig

__all__ = ["Elastic"]


class Elastic(Backend):
    """``--min-workers``/``--max-workers``/``--host-discovery-script``/``--host-discovery-file``: a
    local job whose workers may change (`tfpar.launch.elastic`)."""

    name = "elastic"

    def chosen(self, config: LaunchConfig) -> bool:
        return config.elastic

    def check(self, config: LaunchConfig) -> None:
        given = config.given(
            "task_index", "hosts", "cluster", "nnodes", "slurm", "horovod", "ps", "nproc_per_node"
        )
        if given:
            flag = given[0]
            raise ValueError(
                "An elastic job (--min-workers, --max-workers, --host-discovery-*) is a local "
                f"job that tfpar launch supervises and restarts. Received: {flag} with it, a "
                "job it does not supervise that way. Drop the elastic options; for an elastic "
                "job across hosts run tfpar launch --nnodes MIN:MAX --master-addr HOST on "
                "each, or Horovod's elastic mode (horovodrun --min-np/--max-np "
                "--host-discovery-script)."
            )
        if config.workers is not None and config.max_workers is not None:
            raise ValueError(
                f"Give -n or --max-workers, not both. Received: -n {config.workers} --max-workers "
                f"{config.max_workers}. In an elastic job -n is the most workers it trains with."
            )
        if (
            _most_workers(config) is None
            and config.host_discovery_script is None
            and config.host_discovery_file is None
        ):
            raise ValueError(
                "An elastic job needs its most workers or a host discovery. Received: neither -n, "
                "--max-workers nor --host-discovery-script/--host-discovery-file. Write e.g. "
                "`tfpar launch --min-workers 2 --max-workers 4 -- python train.py`."
            )
        _membership(config)  # its options checked
        _discovery(config).hosts()  # its output checked now, before any worker starts
        check_number(
            "elastic_timeout",
            config.elastic_timeout,
            above=0,
            hint=" (seconds to wait for --min-workers)",
        )

    def start(self, config: LaunchConfig) -> int:
        from tfpar.launch.elastic.local import run_elastic

        return run_elastic(
            list(config.command),
            config.options(),
            _discovery(config),
            _membership(config),
            config.elastic_timeout,
            config.elastic_batch,
        )


def _most_workers(config):
    return config.max_workers if config.max_workers is not None else config.workers


def _membership(config):
    from tfpar.launch.elastic.membership import Membership

    return Membership(config.min_workers or 1, _most_workers(config), config.max_restarts)


def _discovery(config):
    from tfpar.launch.elastic.discovery import Discovery

    return Discovery(
        config.host_discovery_script, config.host_discovery_file, _most_workers(config) or 1
    )
