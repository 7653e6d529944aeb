"""Data parallelism: MirroredStrategy on one host, MultiWorkerMirrored on many.

``DataParallel(...)`` reads the cluster (an explicit `ClusterInfo`, else
``TF_CONFIG``) and returns a real `tf.distribute.Strategy`: a
`MirroredDataParallel` when one worker trains, a `MultiWorkerDataParallel`
when several do. Both are instances of `DataParallel`.
"""

import dataclasses
import logging
from typing import Any

from tfpar import _compat
from tfpar._checks import check_choice, check_int, check_number, config_from
from tfpar._keras import tf
from tfpar._parallelism import Parallelism
from tfpar.cluster import ClusterInfo, refuse_evaluator
from tfpar.devices import (
    DevicesAlreadyInitializedError,
    check_devices,
    configure_devices,
    local_devices,
)
from tfpar.remat import check_remat
from tfpar.strategies._all_reduce import (
    ALL_REDUCES,
    has_gpus,
    refuse_multi_worker_only,
    refuse_num_packs,
    refuse_one_host_only,
    refuse_without_gpus,
)
from tfpar.strategies._describe import batch_and_model_lines
from tfpar.strategies._extendeds import KEY_BASES, MultiWorkerExtended, OneHostExtended
from tfpar.strategies._gradients import check_compression
from tfpar.strategies._memory import memory_checks, memory_lines
from tfpar.strategies._zero import check_zero_stage

__all__ = [
    "ALL_REDUCE",
    "DataParallel",
    "DataParallelConfig",
    "MirroredDataParallel",
    "MultiWorkerDataParallel",
]

_log = logging.getLogger(__name__)

ALL_REDUCE = tuple(ALL_REDUCES)
"""Accepted ``all_reduce`` names (`tfpar.strategies._all_reduce.ALL_REDUCES` says where each
runs)."""
DEFAULT_TIMEOUT_SECONDS = 300.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataParallelConfig:
    """Configuration of `DataParallel`, validated when built."""

    devices: tuple | None = None
    """One host only: device names to replicate over (default: all GPUs, else
    the virtual CPU devices from `tfpar.configure_devices`)."""
    all_reduce: str = "auto"
    """Gradient reduction: one of `ALL_REDUCE`; "auto" is TensorFlow's choice on one host, and NCCL
    on GPUs, else a ring, across hosts."""
    num_packs: int = 1
    """One host, nccl/hierarchical: number of packs gradients are batched into."""
    bytes_per_pack: int = 0
    """Several hosts: split all-reduces into packs of this many bytes (0: auto)."""
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    """Several hosts: a collective waiting longer than this for a peer raises
    instead of hanging (None: wait forever)."""
    cluster: ClusterInfo | None = None
    """The cluster and this task (default: parsed from ``TF_CONFIG``)."""
    compression: str = "none"
    """The optimizer's gradients on the wire: "none" (float32), "bf16" or "fp16" (half the bytes;
    cast before the all-reduce, back after it). Other reductions keep their precision."""
    gradient_accumulation_steps: int = 1
    """Sum each replica's gradients locally over this many steps, then all-reduce their average
    and apply it once: N steps of global batch G train like one step of N·G, with one all-reduce."""

    zero_stage: int = 0
    """ZeRO (DeepSpeed's stages; PyTorch's ZeroRedundancyOptimizer): 1 shards the optimizer state
    over the replicas (each keeps and updates 1/N of it; the gradients reduce-scattered, the weights
    all-gathered: the bytes of one all-reduce), 2 also the reduced gradients, 3 also the parameters
    (PyTorch's FSDP: each gathered where a layer reads it; both Kerases,
    `tfpar.strategies._zero3`); 0 (default) none. One host or several workers, SGD/Adam/AdamW
    (`tfpar.strategies._zero`)."""
    remat: Any = "none"
    """Activation checkpointing (`tfpar.remat`): "blocks" (each layer with sublayers, a KerasHub
    transformer layer's kind) or a list of layer names or patterns keep only their inputs in the
    forward pass and run it again in the backward pass; "none" (default) keeps every activation."""

    def __post_init__(self):
        check_choice("all_reduce", self.all_reduce, tuple(ALL_REDUCES))
        check_compression(self.compression)
        check_int(
            "gradient_accumulation_steps",
            self.gradient_accumulation_steps,
            1,
            " (1: no accumulation.)",
        )
        check_zero_stage(self.zero_stage)
        object.__setattr__(self, "remat", check_remat(self.remat))
        check_int("num_packs", self.num_packs, 0)
        check_int("bytes_per_pack", self.bytes_per_pack, 0)
        refuse_num_packs(self.all_reduce, self.num_packs)
        check_number("timeout_seconds", self.timeout_seconds, above=0, allow_none=True)
        if self.cluster is not None and not isinstance(self.cluster, ClusterInfo):
            raise TypeError(
                "cluster must be a tfpar.cluster.ClusterInfo (or None to read "
                f"TF_CONFIG). Received: {type(self.cluster).__name__}."
            )
        if self.devices is not None:
            object.__setattr__(self, "devices", check_devices("devices", self.devices))

    @property
    def multi_worker(self):
        """Whether several workers train (so MultiWorkerMirroredStrategy is used)."""
        return self.cluster is not None and self.cluster.num_workers > 1


def _build_config(config, kwargs):
    config = config_from(DataParallelConfig, config, kwargs)
    if config.cluster is None:
        cluster = ClusterInfo.from_tf_config()
        if cluster is not None:
            config = dataclasses.replace(config, cluster=cluster)
    if config.cluster is not None:
        refuse_evaluator(config.cluster, "DataParallel")
    if config.multi_worker:
        refuse_one_host_only(config.all_reduce, config.cluster.num_workers)
        if config.devices is not None:
            raise ValueError(
                "devices applies to one host only: with several workers each "
                "worker uses its GPUs (else its CPU). Received: "
                f"devices={list(config.devices)} with "
                f"{config.cluster.num_workers} workers. Remove devices=."
            )
    else:
        refuse_multi_worker_only(config.all_reduce)
    return config


class DataParallel(Parallelism):
    """Synchronous data parallelism as a `tf.distribute.Strategy`.

    ``DataParallel(**options)`` returns a `MirroredDataParallel` (one worker)
    or a `MultiWorkerDataParallel` (``TF_CONFIG`` or ``cluster`` naming
    several workers); options are the fields of `DataParallelConfig`.

    Examples:
        >>> import tfpar
        >>> strategy = tfpar.strategies.DataParallel()  # doctest: +SKIP
        >>> with strategy.scope():  # doctest: +SKIP
        ...     model = build_model(); model.compile("adam", "mse")
        >>> print(strategy.describe(global_batch_size=64))  # doctest: +SKIP
    """

    CONFIG = DataParallelConfig

    def __new__(cls, config=None, **kwargs):
        # DataParallel(...) stays the one call for one host and many, and isinstance(s,
        # DataParallel) holds for both; the config is built here once and handed to __init__
        # (`_config_for`).
        built = _build_config(config, kwargs)
        if cls is DataParallel:
            cls = MultiWorkerDataParallel if built.multi_worker else MirroredDataParallel
        strategy = object.__new__(cls)
        strategy._built_config = built
        return strategy

    def _config_for(self, config, kwargs):
        built = self.__dict__.pop("_built_config", None)
        return built if built is not None else _build_config(config, kwargs)

    config: DataParallelConfig
    num_replicas_in_sync: int  # tf.distribute.Strategy's, on the concrete classes
    experimental_local_results: Any
    extended: Any
    _TF_BASE = ""

    def _all_reduce_text(self):
        raise NotImplementedError

    def _workers_text(self):
        return "1"

    def _gradients_text(self):
        cfg = self.config
        micro = self.extended._microbatches
        return (
            f", compression={cfg.compression}, "
            f"gradient_accumulation_steps={cfg.gradient_accumulation_steps}"
            + (f", elastic micro-batches per step={micro}" if micro > 1 else "")
        )

    def model_checks(self) -> tuple:
        """`Parallelism.model_checks`, and the gradient checks (`tfpar.strategies._gradients`)."""
        return (
            *super().model_checks(),
            *memory_checks(self.config),
        )

    def reduce(self, reduce_op: Any, value: Any, axis: Any) -> Any:
        """`tf.distribute.Strategy.reduce`, also for a nest, for scalars with an axis, and for
        values that cannot be summed.

        Keras 3's ``fit`` reduces the first batch, a nest, with MEAN to build the model, and each
        step's scalar metrics with ``axis=0`` (TensorFlow issue 72388). TensorFlow's multi-worker
        reduce takes one tensor and refuses ``axis=0`` on a scalar; no strategy can add booleans (a
        KerasHub model's ``padding_mask``). So a nest is reduced leaf by leaf, a scalar, which has
        no axis to reduce along, across the replicas alone, and a boolean or string leaf is the
        first local replica's (Keras only reads its shape).
        """
        if tf.nest.is_nested(value):
            return tf.nest.map_structure(lambda leaf: self.reduce(reduce_op, leaf, axis), value)
        local = self.experimental_local_results(value)[0]
        if tf.as_dtype(getattr(local, "dtype", tf.float32)) in (tf.bool, tf.string):
            return local
        if axis is not None and tf.TensorShape(getattr(local, "shape", ())).rank == 0:
            axis = None
        return super().reduce(reduce_op, value, axis)  # type: ignore[misc]  # the concrete classes' strategy

    def describe(self, global_batch_size: int | None = None, model: Any = None) -> str:
        """Returns a readable summary of the strategy.

        Args:
            global_batch_size: if given, the per-replica and global batch are
                shown (and checked to divide evenly).
            model: if given, a tf_keras model whose parameters are counted.

        Raises:
            ValueError: if ``global_batch_size`` does not divide by the
                number of replicas.
            TypeError: if ``model`` is not a tf_keras model.
        """
        replicas = self.num_replicas_in_sync
        devices = list(self.extended.worker_devices)
        lines = [
            f"{type(self).__name__} ({self._TF_BASE})",
            f"  workers:    {self._workers_text()}",
            f"  replicas:   {replicas} ({len(devices)} on this worker)",
            f"  devices:    {', '.join(devices)}",
            f"  all-reduce: {self._all_reduce_text()}{self._gradients_text()}",
        ]
        model_lines = batch_and_model_lines(replicas, global_batch_size, model)  # checks model
        lines += memory_lines(self.config, replicas, model)
        return "\n".join(lines + model_lines)


class MirroredDataParallel(DataParallel, tf.distribute.MirroredStrategy):
    """`DataParallel` on one host: a `tf.distribute.MirroredStrategy`."""

    _TF_BASE = "MirroredStrategy"

    def __init__(self, config: DataParallelConfig | None = None, **kwargs: Any) -> None:
        self.config = self._config_for(config, kwargs)
        refuse_without_gpus(self.config.all_reduce)
        _compat.set_collective_key_base(self, next(KEY_BASES))
        devices = self.config.devices or _default_devices()
        # MirroredStrategy's own __init__ would build a plain MirroredExtended.
        tf.distribute.Strategy.__init__(
            self,
            OneHostExtended(
                self, self.config, devices=list(devices), cross_device_ops=self._cross_device_ops()
            ),
        )

    def _cross_device_ops(self):
        return ALL_REDUCES[self.config.all_reduce].one_host(self.config.num_packs)

    def _all_reduce_text(self):
        ops = _compat.cross_device_ops_of(self)
        text = type(ops).__name__ if ops is not None else "TensorFlow's default"
        if ALL_REDUCES[self.config.all_reduce].packs:
            text += f", num_packs={self.config.num_packs}"
        return f"{text} (all_reduce={self.config.all_reduce!r})"


def _default_devices():
    try:
        return configure_devices()
    except DevicesAlreadyInitializedError as e:
        devices = local_devices()
        _log.warning("%s Using the %d existing device(s).", e, len(devices))
        return devices


class MultiWorkerDataParallel(DataParallel, tf.distribute.MultiWorkerMirroredStrategy):
    """`DataParallel` over several workers: a `tf.distribute.MultiWorkerMirroredStrategy`."""

    _TF_BASE = "MultiWorkerMirroredStrategy"

    def __init__(self, config: DataParallelConfig | None = None, **kwargs: Any) -> None:
        self.config = self._config_for(config, kwargs)
        refuse_without_gpus(self.config.all_reduce)
        cluster = self.config.cluster
        assert cluster is not None  # a multi-worker config always has its cluster (_build_config)
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(cluster.training_cluster),
            task_type=cluster.task_type,
            task_id=cluster.task_index,
            rpc_layer="grpc",
        )
        _compat.set_collective_key_base(self, next(KEY_BASES))
        options = tf.distribute.experimental.CommunicationOptions(
            bytes_per_pack=self.config.bytes_per_pack,
            timeout_seconds=self.config.timeout_seconds,
            implementation=self._implementation(),
        )
        try:
            # MultiWorkerMirroredStrategy's own __init__ would build a plain
            # CollectiveAllReduceExtended.
            tf.distribute.Strategy.__init__(
                self,
                MultiWorkerExtended(
                    self, self.config, cluster_resolver=resolver, communication_options=options
                ),
            )
        except RuntimeError as e:
            if "program startup" not in str(e):
                raise
            raise RuntimeError(
                "A multi-worker DataParallel must be created before TensorFlow "
                "runs anything (a tensor, a model, another strategy), because "
                "it starts this worker's server. Create the strategy first, at "
                f"the top of the script. (TensorFlow said: {e})"
            ) from None

    def _implementation(self):
        return ALL_REDUCES[self.config.all_reduce].multi_worker(has_gpus())

    def _workers_text(self):
        cluster = self.config.cluster
        role = "chief" if cluster.is_chief else "not chief"
        return f"{cluster.num_workers} (this is {cluster.task_type} {cluster.task_index}, {role})"

    def _all_reduce_text(self):
        cfg = self.config
        timeout = "none" if cfg.timeout_seconds is None else f"{cfg.timeout_seconds:g} s"
        return (
            f"{self._implementation().name} collectives, bytes_per_pack="
            f"{cfg.bytes_per_pack or 'auto'}, timeout={timeout} "
            f"(all_reduce={cfg.all_reduce!r})"
        )
