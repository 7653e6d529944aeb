"""Parameter-server training: `tf.distribute.experimental.ParameterServerStrategy` + coordinator.

Variables live on the ps tasks (sharded by a partitioner when large), workers
compute, and this process, the coordinator (the chief), schedules steps on the
workers with `tf.distribute.experimental.coordinator.ClusterCoordinator`. Keras
``fit`` supports it on tf_keras, with ``steps_per_epoch``.

``ParameterServer()`` reads the cluster from ``TF_CONFIG`` (``tfpar launch --ps
1 --workers 2 -- python train.py`` writes it); ``ParameterServer.local(2, 1)``
starts its own ps and worker servers on 127.0.0.1 and stops them on
``shutdown()`` or at exit.
"""

import atexit
import contextlib
import dataclasses
import os
from typing import Any

from tfpar import _compat
from tfpar._checks import check_int, check_number, config_from
from tfpar._keras import tf
from tfpar._local import loopback
from tfpar._parallelism import Parallelism
from tfpar.cluster import ClusterInfo, local_cluster, refuse_evaluator
from tfpar.strategies._describe import batch_and_model_lines
from tfpar.strategies._local_servers import (
    RESTART_NOTICE,
    refuse_open_ports,
    start_server,
    stop_servers,
    warn_if_the_chief_listens_on_all_interfaces,
)
from tfpar.strategies._ps_cluster import cluster_from, partitioner_of
from tfpar.strategies._ps_failures import (
    ClusterUnreachableError,
    ParameterServerLostError,
    lost_ps_error,
    wait_for_addresses,
)
from tfpar.strategies._ps_model import refuse_synchronized_batchnorm, variable_placement

__all__ = [
    "ClusterUnreachableError",
    "ParameterServer",
    "ParameterServerLostError",
    "ParameterServerConfig",
    "variable_placement",
    "wait_for_addresses",
]

DEFAULT_MIN_SHARD_BYTES = 256 << 10


@dataclasses.dataclass(frozen=True, kw_only=True)
class ParameterServerConfig:
    """Configuration of `ParameterServer`, validated when built."""

    UNSUPPORTED = {
        "zero_stage": "each variable and its optimizer slots already live in one place, on the "
        "parameter servers (the partitioner shards the large ones); to shard a replicated "
        "optimizer state, use tfpar.DataParallel(zero_stage=1)"
    }

    variable_partitioner: object = "auto"
    """"auto" (min-size sharding over the ps tasks: variables above
    ``min_shard_bytes`` are split, up to one shard per ps), None (no sharding),
    or a `tf.distribute.experimental.partitioners.Partitioner`."""
    min_shard_bytes: int = DEFAULT_MIN_SHARD_BYTES
    """With "auto": the smallest shard worth placing on its own."""
    connect_timeout_seconds: float = 60.0
    """How long to wait for every ps and worker to accept connections."""
    cluster: ClusterInfo | None = None
    """The cluster (default: ``TF_CONFIG``); this process is its chief."""
    gradient_accumulation_steps: int = 1
    """Only 1: see `refuse_accumulation`."""

    def __post_init__(self):
        check_int(
            "gradient_accumulation_steps",
            self.gradient_accumulation_steps,
            1,
            " (1: no accumulation.)",
        )
        refuse_accumulation(self.gradient_accumulation_steps)
        partitioner = self.variable_partitioner
        if not (
            partitioner is None
            or partitioner == "auto"
            or isinstance(partitioner, tf.distribute.experimental.partitioners.Partitioner)
        ):
            raise TypeError(
                "variable_partitioner must be 'auto', None or a "
                "tf.distribute.experimental.partitioners.Partitioner (MinSizePartitioner, "
                f"FixedShardsPartitioner, MaxSizePartitioner). Received: {partitioner!r}."
            )
        check_int("min_shard_bytes", self.min_shard_bytes, 1)
        check_number("connect_timeout_seconds", self.connect_timeout_seconds, above=0)


def refuse_accumulation(steps):
    """Gradient accumulation has no place under parameter servers: TensorFlow's coordinator runs
    each step as a closure on whichever worker is free, with no state of its own kept between
    closures, and every worker applies its gradients to the ps variables on its own."""
    if steps != 1:
        raise ValueError(
            "ParameterServer cannot accumulate gradients: each step runs as a closure on whichever "
            "worker is free, and TensorFlow keeps no worker state between closures to sum them in; "
            "each worker applies its own gradients to the parameter servers, asynchronously. "
            f"Received: gradient_accumulation_steps={steps}. Use a global batch {steps} times "
            "larger (with steps_per_execution to keep the coordinator's cost per step low), or "
            f"DataParallel(gradient_accumulation_steps={steps}) for synchronous training."
        )


class ParameterServer(Parallelism, tf.distribute.experimental.ParameterServerStrategy):
    """Parameter-server training as a `tf.distribute.Strategy`; this process coordinates.

    Made in the chief task, it returns the strategy. Made in a ps or worker task (every pod of a
    TFJob runs the same script), it serves that task instead and never returns: the process
    ends when the job stops it.

    Args:
        config: a `ParameterServerConfig`, or its fields as keyword arguments.

    Raises:
        ValueError: no cluster, one without ps or worker tasks, or an evaluator task.
        TypeError: a partitioner that is not a partitioner.
        ClusterUnreachableError: a task that does not answer within the wait.

    Examples:
        >>> strategy = tfpar.strategies.ParameterServer.local(  # doctest: +SKIP
        ...     num_workers=2, num_ps=1)
        >>> with strategy.scope():  # doctest: +SKIP
        ...     model = build_model(); model.compile("adam", "mse")
        >>> train = tfpar.data.distribute(dataset, strategy, 64)  # doctest: +SKIP
        >>> model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch)  # doctest: +SKIP
    """

    CONFIG = ParameterServerConfig

    def __init__(self, config: ParameterServerConfig | None = None, **kwargs: Any) -> None:
        config = config_from(ParameterServerConfig, config, kwargs)
        cluster = cluster_from(config)
        refuse_evaluator(cluster, "ParameterServer")
        if cluster.task_type in ("ps", "worker"):
            # One script for every task, as a TFJob runs it: a ps or worker task serves here until
            # the job ends (it never returns); the chief goes on and trains.
            from tfpar._local.server import serve

            serve(cluster)
            raise SystemExit(0)
        self.config = dataclasses.replace(config, cluster=cluster)
        self._servers = getattr(self, "_servers", {})
        remote = cluster.cluster["ps"] + cluster.cluster["worker"]
        wait_for_addresses(remote, config.connect_timeout_seconds)
        # a dead worker fails fast, then reschedules
        os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
        spec = cluster.training_cluster
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(spec),
            task_type=cluster.task_type,
            task_id=cluster.task_index,
            rpc_layer="grpc",
        )
        super().__init__(resolver, variable_partitioner=partitioner_of(config, len(spec["ps"])))
        self._resolver = resolver
        self.coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(self)
        # the servers go first: no remote removal can work
        atexit.register(_compat.stop_removing_functions)

    @classmethod
    def local(
        cls,
        num_workers: int = 2,
        num_ps: int = 1,
        listen_on_all_interfaces: bool = False,
        **kwargs: Any,
    ) -> "ParameterServer":
        """Starts ps and worker servers as child processes on 127.0.0.1 and returns the strategy.

        Every server listens on 127.0.0.1 only, this process' own (the chief's) included: TensorFlow
        starts that one inside this process and binds it to every interface, so in a plain
        ``python`` script `local()` first starts the script again with tfpar's loopback library (one
        line on stderr says so; what the script did before `local()` runs again). Under
        ``tfpar launch`` or ``tfpar demo`` the library is already there and nothing restarts.

        The servers are stopped by `shutdown()`, on leaving a ``with`` block, or at exit.

        Args:
            num_workers: worker servers to start.
            num_ps: ps servers to start.
            listen_on_all_interfaces: where the script cannot be started again (a notebook, no C
                compiler), True accepts servers open to the network, without authentication.
            **kwargs: the fields of `ParameterServerConfig`.

        Raises:
            ValueError: ``num_workers`` or ``num_ps`` below 1; or servers that would listen on every
                interface, without ``listen_on_all_interfaces=True``.
        """
        for name, value in (("num_workers", num_workers), ("num_ps", num_ps)):
            check_int(
                name, value, 1, " A parameter-server cluster has at least one ps and one worker."
            )
        if not isinstance(listen_on_all_interfaces, bool):
            raise TypeError(
                "listen_on_all_interfaces must be True or False. Received: "
                f"listen_on_all_interfaces={listen_on_all_interfaces!r}."
            )
        ParameterServerConfig(**kwargs)  # every option checked before a server starts
        if not loopback.active() and not listen_on_all_interfaces:
            refuse_open_ports(loopback.start_again_with_library(say=RESTART_NOTICE))
        cluster = local_cluster({"chief": 1, "worker": num_workers, "ps": num_ps})
        servers = []
        try:
            for role in ("ps", "worker"):
                for index in range(len(cluster[role])):
                    servers.append((f"{role} {index}", start_server(cluster, role, index)))
            warn_if_the_chief_listens_on_all_interfaces(cluster)
            strategy = cls.__new__(cls)
            strategy._servers = dict(servers)  # they also exit by themselves when this process ends
            cls.__init__(
                strategy,
                cluster=ClusterInfo(cluster=cluster, task_type="chief", task_index=0),
                **kwargs,
            )
            return strategy
        except BaseException:
            stop_servers(dict(servers))
            raise

    def shutdown(self) -> None:
        """Stops the servers that `local()` started (no-op for an external cluster).

        The strategy cannot run anything afterwards. Without it the servers
        stop by themselves when this process exits.
        """
        if self._servers:
            stop_servers(self._servers)
            _compat.stop_removing_functions()
        self._servers = {}

    def restart_local_server(self, name: str, **popen_kwargs: Any) -> Any:
        """Starts again a server of `local()` that died (``"worker 1"``), at the same address.

        A restarted worker rejoins: the coordinator rebuilds its datasets and
        schedules steps on it again. (A restarted ps does not bring back the
        variables it held; see `ParameterServerLostError`.)

        Args:
            name: ``"worker N"`` or ``"ps N"``, a key of `local_servers`.
            **popen_kwargs: passed to `subprocess.Popen` (e.g. ``stdout=`` to see its log).

        Raises:
            ValueError: a name `local()` did not start, or a server that still runs.
        """
        proc = self._servers.get(name)
        if proc is None:
            raise ValueError(
                f"No local server named {name!r}. Received: {name!r}; the servers "
                f"of this strategy are {sorted(self._servers)}."
            )
        if proc.poll() is None:
            raise ValueError(
                f"{name} still runs (pid {proc.pid}); only a server that died can be restarted."
            )
        role, index = name.split()
        self._servers[name] = start_server(self._addresses, role, int(index), **popen_kwargs)
        return self._servers[name]

    @contextlib.contextmanager
    def _translating_ps_loss(self, scope):
        try:
            with scope:
                yield self
        except Exception as error:  # noqa: BLE001 (re-raised unless a ps is gone)
            lost = lost_ps_error(error, self._addresses["ps"])
            if lost is None:
                raise
            raise lost from error

    def scope(self) -> contextlib.AbstractContextManager:
        """The strategy's scope; a ps lost inside it raises `ParameterServerLostError`.

        Keras runs ``fit``, ``evaluate`` and ``predict`` inside this scope.
        """
        return self._translating_ps_loss(super().scope())

    def model_checks(self) -> tuple:
        """`Parallelism.model_checks`, and no synchronized BatchNormalization."""
        return (*super().model_checks(), ("compile", "before", refuse_synchronized_batchnorm))

    @property
    def cluster_resolver(self):
        """The cluster's `tf.distribute.cluster_resolver.ClusterResolver` (TensorFlow's own
        ParameterServerStrategy returns None here; its other strategies return theirs)."""
        return self._resolver

    @property
    def local_servers(self):
        """The processes `local()` started: ``{"ps 0": Popen, "worker 1": Popen, ...}``."""
        return dict(self._servers)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()

    @property
    def _addresses(self) -> dict:
        """The cluster's addresses by role (``__init__`` always sets the config's cluster)."""
        assert self.config.cluster is not None
        return self.config.cluster.cluster

    def describe(self, global_batch_size: int | None = None, model: Any = None) -> str:
        """Returns a readable summary: tasks, partitioner, batch, and the variables' placement."""
        spec = self._addresses
        partitioner = self.config.variable_partitioner
        if partitioner == "auto":
            partitioner = (
                f"auto (MinSizePartitioner, {self.config.min_shard_bytes} bytes, "
                f"up to {len(spec['ps'])} shards)"
            )
        lines = [
            "ParameterServer (ParameterServerStrategy + ClusterCoordinator)",
            f"  workers:    {len(spec['worker'])} ({', '.join(spec['worker'])})",
            f"  ps:         {len(spec['ps'])} ({', '.join(spec['ps'])})",
            f"  replicas:   {self.num_replicas_in_sync} per step (steps run on any free worker)",
            f"  partitioner: {partitioner}",
        ]
        lines += batch_and_model_lines(self.num_replicas_in_sync, global_batch_size, model)
        if model is not None:
            for name, devices in sorted(variable_placement(model).items()):
                tasks = sorted({d.split("/device")[0].replace("/replica:0", "") for d in devices})
                lines.append(f"    {name}: {len(devices)} shard(s) on {', '.join(tasks)}")
        return "\n".join(lines)
