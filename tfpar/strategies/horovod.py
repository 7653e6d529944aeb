"""Horovod ring all-reduce as a `tf.distribute.Strategy`.

Horovod is an optimizer wrapper plus callbacks, not a strategy. `HorovodStrategy`
makes it one, the way TensorFlow's MultiWorkerMirroredStrategy is built: a
MirroredStrategy over this process's one device (the GPU of its local rank, else
the CPU) whose cross-replica reductions go through Horovod (``hvd.allreduce``,
ring all-reduce over Gloo, MPI or NCCL) across ``hvd.size()`` processes. So in
``with strategy.scope(): model.compile(...); model.fit(...)``:

- gradients are summed by Horovod (``op`` Average, Sum or Adasum; optional fp16
  compression) and applied identically on every rank;
- every variable starts from rank 0's value (broadcast when it is created,
  optimizer state included);
- metrics are Keras' SyncOnRead variables, reduced through Horovod when read,
  so the numbers every rank prints are the global ones (in a step, in the
  gradients' Horovod cycle);
- input given to ``fit`` (or `tfpar.data.distribute`) is sharded by rank;
- only rank 0 writes checkpoints (``should_checkpoint``) and prints Keras'
  progress bars.

It sits on ``horovod.tensorflow`` only, so it needs no Keras choice from Horovod
(Horovod's own Keras API, ``horovod.tensorflow.keras``, runs on tf_keras in the
build `tfpar install-horovod` makes). Without ``horovodrun`` it runs as one rank.
"""

import dataclasses
from typing import Any

from tfpar import _compat
from tfpar._checks import check_choice, check_int, config_from
from tfpar._keras import keras, tf
from tfpar._parallelism import Parallelism
from tfpar._topology import Topology
from tfpar.remat import check_remat
from tfpar.strategies._accumulation import AccumulatedUpdates, GradientAccumulator
from tfpar.strategies._describe import batch_and_model_lines
from tfpar.strategies._gradients import (
    COMPRESSIONS,
    check_compression,
    gradient_variables,
    marked_variables,
)
from tfpar.strategies._horovod_init import import_horovod
from tfpar.strategies._horovod_ops import XLA_OPS_BUILT, HorovodAllReduce
from tfpar.strategies._memory import memory_checks, memory_lines
from tfpar.strategies._started_by import refuse_elastic_horovodrun
from tfpar.strategies._zero import check_zero_stage

__all__ = [
    "HOROVOD_OPS",
    "COMPRESSIONS",
    "XLA_OPS_BUILT",
    "HorovodConfig",
    "HorovodStrategy",
    "import_horovod",
]

HOROVOD_OPS = ("average", "sum", "adasum")
"""Gradient reductions: Horovod's Average (the default), Sum and Adasum."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class HorovodConfig:
    """Configuration of `HorovodStrategy`, validated when built."""

    op: str = "average"
    """Gradient reduction across ranks: one of `HOROVOD_OPS`."""
    quiet_non_chief: bool = True
    """Keras prints progress bars and epoch lines on rank 0 only (the others log
    them at INFO level instead: ``tf_keras.utils.disable_interactive_logging``)."""
    compression: str = "none"
    """The gradients on the wire: one of `COMPRESSIONS`. "fp16" halves the bytes of Horovod's
    all-reduce; "bf16", which Horovod's all-reduce does not take, is sent by one allgather of every
    rank's bf16 gradients, summed in float32 on each rank: fewer bytes than a float32 ring for up to
    3 ranks, the same at 4, more beyond (use "fp16" there)."""
    backward_passes_per_step: int = 1
    """Accumulate gradients over this many steps (averaged), then all-reduce and
    apply them once: N steps of global batch G train like one step of N·G."""
    zero_stage: int = 0
    """ZeRO over the ranks (as `DataParallel`'s): 1 shards the optimizer state (each rank keeps and
    updates 1/N of it; hvd.reducescatter of the gradients, hvd.allgather of the weights), 2 also the
    reduced gradients, 3 also the parameters (both Kerases); 0 (default) none. Every rank writes
    the checkpoints (each holds a part)."""
    remat: Any = "none"
    """Activation checkpointing (`tfpar.remat`): "blocks" (each layer with sublayers, a KerasHub
    transformer layer's kind) or a list of layer names or patterns keep only their inputs in the
    forward pass and run it again in the backward pass; "none" (default) keeps every activation."""

    def __post_init__(self):
        check_int(
            "backward_passes_per_step", self.backward_passes_per_step, 1, " (1: no accumulation.)"
        )
        check_choice("op", self.op, HOROVOD_OPS)
        check_compression(self.compression, self.op)
        check_zero_stage(self.zero_stage)
        object.__setattr__(self, "remat", check_remat(self.remat))
        if self.zero_stage and self.op == "adasum":
            raise ValueError(
                f"zero_stage={self.zero_stage} reduce-scatters a sum of the gradients; Adasum "
                "combines them otherwise. Received: op='adasum'. Use op='average' with it, or "
                "zero_stage=0."
            )


class _HorovodExtended(AccumulatedUpdates, _compat.MirroredExtended):
    """MirroredExtended over one local device, Horovod across processes."""

    def __init__(self, container_strategy, hvd, config, device):
        self._hvd = hvd
        self._rank, self._size = hvd.rank(), hvd.size()
        self._horovod_ops = HorovodAllReduce(hvd, config)
        steps = config.backward_passes_per_step
        self._accumulator = GradientAccumulator(steps) if steps > 1 else None
        super().__init__(container_strategy, devices=[device], cross_device_ops=self._horovod_ops)

    # Reductions: always through Horovod (MirroredExtended would shortcut
    # CPU destinations and one-device values to a local identity).
    def _get_cross_device_ops(self, value):
        return self._horovod_ops

    def _reduce_to(self, reduce_op, value, destinations, options):
        if isinstance(value, _compat.Mirrored) and reduce_op == tf.distribute.ReduceOp.MEAN:
            return value
        return tf.nest.map_structure(
            lambda v: self._horovod_ops.reduce_implementation(reduce_op, v, destinations, options),
            value,
        )

    def _reduce_gradients(self, reduce_op, tensors, variables):
        """The optimizer's gradients (local tensors): accumulated, compressed, all-reduced."""
        ops = self._horovod_ops
        if variables is None:
            return ops.allreduce(reduce_op, tensors)
        if self._accumulator is None:
            return ops.allreduce(reduce_op, tensors, gradients=True)
        return self._accumulator.reduce(
            [tensors],
            variables,
            self.worker_devices,
            lambda per_device: ops.allreduce(reduce_op, per_device[0], gradients=True),
        )

    def _batch_reduce_to(self, reduce_op, value_destination_pairs, options):
        # Keras' optimizers aggregate their gradients here (tf_keras; Keras 3 on a merge_call);
        # other sums (a metric's, synchronized BatchNorm's) are never accumulated nor compressed.
        variables = gradient_variables(reduce_op, value_destination_pairs)
        local = [self._horovod_ops._local(v) for v, _ in value_destination_pairs]
        return self._reduce_gradients(reduce_op, local, variables)

    def _replica_ctx_all_reduce(self, reduce_op, value, options=None):
        # One replica per process: reduce right here, no merge_call needed (Keras 3's optimizer
        # reduces its gradients this way).
        flat = tf.nest.flatten(value)
        variables = marked_variables(flat) if reduce_op == tf.distribute.ReduceOp.SUM else None
        return tf.nest.pack_sequence_as(value, self._reduce_gradients(reduce_op, flat, variables))

    # Variables start from rank 0's values, optimizer state included.
    def _get_variable_creator_initial_value(self, replica_id, device, primary_var, **kwargs):
        if replica_id != 0 or self._size == 1:
            return super()._get_variable_creator_initial_value(
                replica_id, device, primary_var, **kwargs
            )
        hvd = self._hvd

        def initial_value_fn():
            with tf.device(device):
                initial = kwargs["initial_value"]
                if callable(initial):
                    initial = initial()
                initial = _compat.unwrap_initial_value(initial)
                initial = tf.convert_to_tensor(initial, dtype=kwargs.get("dtype", None))
                name = kwargs.get("name") or "variable"
                return hvd.broadcast(
                    initial, root_rank=0, name=f"tfpar_init_{name}".replace(":", "_")
                )

        return initial_value_fn

    # Input: each rank reads its own shard.
    def _make_input_context(self):
        return tf.distribute.InputContext(
            num_input_pipelines=self._size,
            input_pipeline_id=self._rank,
            num_replicas_in_sync=self._size,
        )

    def _experimental_distribute_dataset(self, dataset, options):
        return _compat.get_distributed_dataset(
            dataset,
            self._input_workers_with_options(options),
            self._container_strategy(),
            num_replicas_in_sync=self._size,
            input_context=self._make_input_context(),
            options=options,
        )

    def _distribute_datasets_from_function(self, dataset_fn, options):
        return _compat.get_distributed_datasets_from_function(
            dataset_fn=dataset_fn,
            input_workers=self._input_workers_with_options(options),
            input_contexts=[self._make_input_context()],
            strategy=self._container_strategy(),
            options=options,
        )

    @property
    def _num_replicas_in_sync(self):
        return self._size

    def _in_multi_worker_mode(self):
        return self._size > 1

    def _get_replica_id_in_sync_group(self, replica_id):
        return self._rank + replica_id

    def _get_local_replica_id(self, replica_id_in_sync_group):
        return replica_id_in_sync_group - self._rank

    @property
    def experimental_between_graph(self):
        return True

    @property
    def _task_id(self):
        # _compat.KERAS_READS_FROM_EXTENDED: tf_keras names non-chief temp folders by it
        return self._rank

    @property
    def should_checkpoint(self):
        return self._rank == 0

    @property
    def should_save_summary(self):
        return self._rank == 0


class HorovodStrategy(Parallelism, tf.distribute.MirroredStrategy):
    """Horovod ring all-reduce as a `tf.distribute.Strategy`: one replica per process.

    Run the same script under ``horovodrun -np 2 -H localhost:2 --gloo python
    train.py`` (or ``tfpar launch --horovod -n 2``), or alone as one rank.

    Args:
        config: a `HorovodConfig`, or its fields as keyword arguments
            (``op``, ``compression``, ``backward_passes_per_step``).

    Raises:
        ImportError: Horovod is not installed (the message says how).
        ValueError: an unknown op or compression; backward_passes_per_step
            below 1; Adasum on a number of
            ranks that is not a power of two, or without MPI (Horovod runs
            Adasum over MPI only).

    Examples:
        >>> strategy = tfpar.strategies.HorovodStrategy(compression="fp16")  # doctest: +SKIP
        >>> with strategy.scope():  # doctest: +SKIP
        ...     model = build_model(); model.compile("adam", "mse")
    """

    CONFIG = HorovodConfig

    def __init__(self, config: HorovodConfig | None = None, **kwargs: Any) -> None:
        config = config_from(HorovodConfig, config, kwargs)
        refuse_elastic_horovodrun()
        hvd = import_horovod()
        size = hvd.size()
        if config.op == "adasum" and size & (size - 1):
            raise ValueError(
                "Adasum needs a number of ranks that is a power of two. Received: op='adasum' with "
                f"{size} ranks. Use 2, 4, 8, ... ranks, or op='average'."
            )
        if config.op == "adasum" and size > 1 and not hvd.mpi_enabled():
            raise ValueError(
                "Adasum needs Horovod's MPI controller (its Adasum kernels run over MPI); this job "
                f"runs on {'Gloo' if hvd.gloo_enabled() else 'no MPI'}. Received: op='adasum'. Use "
                "op='average', or build Horovod with MPI and start the job with horovodrun --mpi."
            )
        self.config = config
        self.hvd = hvd
        if config.quiet_non_chief and hvd.rank() != 0:
            keras.utils.disable_interactive_logging()
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            local = gpus[hvd.local_rank() % len(gpus)]
            tf.config.set_visible_devices(local, "GPU")
            device = "/device:GPU:0"
        else:
            device = "/device:CPU:0"
        extended = _HorovodExtended(self, hvd, config, device)
        # not MirroredStrategy's: it would build its own extended
        tf.distribute.Strategy.__init__(self, extended)

    @property
    def rank(self):
        """This process's Horovod rank."""
        return self.hvd.rank()

    @property
    def size(self):
        """Number of Horovod ranks (= replicas)."""
        return self.hvd.size()

    @property
    def topology(self):
        """One replica a rank: `size` workers, this one `rank`."""
        return Topology(num_workers=self.size, worker_index=self.rank)

    def model_checks(self) -> tuple:
        """`Parallelism.model_checks`, the gradient checks (`tfpar.strategies._gradients`) and
        ZeRO's."""
        return (
            *super().model_checks(),
            *memory_checks(self.config),
        )

    def describe(self, global_batch_size: int | None = None, model: Any = None) -> str:
        """Returns a readable summary (as `DataParallel.describe`)."""
        hvd = self.hvd
        controllers = [
            n for n, built in (("Gloo", hvd.gloo_built()), ("MPI", hvd.mpi_built())) if built
        ]
        lines = [
            "HorovodStrategy (Horovod ring all-reduce)",
            f"  workers:    {hvd.size()} (this is rank {hvd.rank()}, "
            f"local rank {hvd.local_rank()})",
            f"  replicas:   {self.num_replicas_in_sync} (1 on this worker)",
            f"  devices:    {', '.join(self.extended.worker_devices)}",
            f"  all-reduce: Horovod {self.config.op}, compression={self.config.compression}, "
            f"backward_passes_per_step={self.config.backward_passes_per_step}, "
            f"controllers: {', '.join(controllers) or 'none'}",
        ]
        replicas = self.num_replicas_in_sync
        model_lines = batch_and_model_lines(replicas, global_batch_size, model)  # checks model
        lines += memory_lines(self.config, replicas, model)
        return "\n".join(lines + model_lines)
