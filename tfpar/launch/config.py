"""`LaunchConfig`: one ``tfpar launch`` job as data, made once from the command line
(`tfpar.launch.command.config_from_args`, torchrun's ``config_from_args``) or in Python, and all
that the back-ends below the CLI read. Frozen: a back-end derives what it needs from it and
changes nothing. Pure Python."""

import dataclasses

from tfpar._checks import check_choice
from tfpar._local.processes import DEFAULT_GRACE_SECONDS
from tfpar._tasks.elastic_batch import ELASTIC_BATCHES
from tfpar.cluster import ROLES
from tfpar.launch.rendezvous.elastic import parse_nnodes
from tfpar.launch.rendezvous.static import DEFAULT_MASTER_PORT
from tfpar.launch.runner import LaunchOptions

__all__ = ["LaunchConfig"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class LaunchConfig:
    """A job of ``tfpar launch``: its command and every option, by the command line's names."""

    command: tuple[str, ...]
    """The program and its arguments, run once per task."""
    workers: int | None = None
    """``-n``: local workers (an elastic job: the most it trains with; ``--horovod``: ranks)."""
    nproc_per_node: int | None = None
    """Workers on this host, each with its own GPUs (or virtual CPU devices)."""
    nnodes: str | None = None
    """``K`` identical hosts, or ``MIN:MAX`` for an elastic job across hosts."""
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int = DEFAULT_MASTER_PORT
    rendezvous_timeout: float = 300.0
    ps: int = 0
    """Parameter servers (with ``-n`` worker servers and a chief that runs the command)."""
    hosts: str | None = None
    cluster: str | None = None
    """A JSON file with the cluster."""
    task_type: str = "worker"
    task_index: int | None = None
    grace: float = DEFAULT_GRACE_SECONDS
    max_restarts: int = 0
    min_workers: int | None = None
    max_workers: int | None = None
    host_discovery_script: str | None = None
    host_discovery_file: str | None = None
    elastic_timeout: float = 600.0
    elastic_batch: str = "accumulate"
    heartbeat_timeout: float | None = None
    timeline: str | None = None
    slurm: bool = False
    horovod: bool = False
    node_range: tuple[int, int] | None = dataclasses.field(init=False, default=None)
    """``nnodes`` read: (K, K) or (MIN, MAX)."""

    def __post_init__(self):
        if isinstance(self.command, str) or not all(isinstance(part, str) for part in self.command):
            raise TypeError(
                "command must be a list of strings (the program and its arguments). "
                f"Received: command={self.command!r}."
            )
        object.__setattr__(self, "command", tuple(self.command))
        check_choice("task_type", self.task_type, ROLES)
        check_choice("elastic_batch", self.elastic_batch, ELASTIC_BATCHES)
        if self.nnodes is not None:
            object.__setattr__(self, "node_range", parse_nnodes(self.nnodes))

    @property
    def elastic_nodes(self) -> bool:
        """``--nnodes MIN:MAX``: an elastic job across hosts."""
        return self.nnodes is not None and ":" in str(self.nnodes)

    @property
    def elastic(self) -> bool:
        """An elastic local job: a fewest or most workers, or a host discovery, given."""
        given = (
            self.min_workers,
            self.max_workers,
            self.host_discovery_script,
            self.host_discovery_file,
        )
        return any(value is not None for value in given)

    @property
    def ranks(self) -> int | None:
        """``--horovod``'s local ranks: ``-n``, else ``--nproc-per-node`` (horovodrun pins one GPU
        per local rank itself)."""
        return self.workers if self.workers is not None else self.nproc_per_node

    def given(self, *names: str) -> list[str]:
        """The command-line flags of the options among ``names`` set away from their defaults, in
        the order given (``workers`` is ``-n``)."""
        defaults = {field.name: field.default for field in dataclasses.fields(self)}
        return [_flag(name) for name in names if getattr(self, name) != defaults[name]]

    def options(self) -> LaunchOptions:
        """The supervision options every job run by `tfpar.launch.runner` takes."""
        return LaunchOptions(
            grace_seconds=self.grace,
            max_restarts=self.max_restarts,
            heartbeat_timeout=self.heartbeat_timeout,
        )


def _flag(name):
    return "-n" if name == "workers" else "--" + name.replace("_", "-")
