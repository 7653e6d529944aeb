"""A pipeline's (or a tensor-parallel model's) data-parallel replicas across workers.

Each worker runs its own pipeline over its local devices, and the workers are data-parallel
replicas. `Workers` starts every worker from worker 0's weights and sums each step's gradients
over the workers: the dense gradients packed into one all-reduce, an embedding's IndexedSlices
all-gathered so that they stay sparse. Each engine its own way:

- under ``tfpar launch`` (TF_CONFIG naming several workers), TensorFlow's runtime: a
  `tfpar.DataParallel` (MultiWorkerMirroredStrategy), made first, starts this worker's server and
  its collectives, and the collectives of one step are chained so that every worker runs them in
  the same order;
- under ``horovodrun``, Horovod's all-reduce and all-gather (`HorovodWorkers`), matched by name.
"""

import functools
import itertools
import os
from collections.abc import Sequence
from typing import Any

from tfpar import _compat
from tfpar._keras import tf

__all__ = ["HorovodWorkers", "Workers"]

GROUP_KEY = 0x7F5A
"""tfpar's collective group, apart from the groups TensorFlow's strategies number from 1."""


class Workers:
    """This worker's place among the job's workers, and the collectives between them."""

    def __init__(self, engine: Any, num_workers: int, worker_index: int) -> None:
        self.engine, self.num_workers, self.worker_index = engine, num_workers, worker_index
        self.timeout = engine.config.timeout_seconds or 0
        # the same on every worker: they build the same ops in the same order
        self._keys = itertools.count(1)

    @staticmethod
    def join() -> "Workers | None":
        """The job's workers when TF_CONFIG names several (None: this process trains alone); joined
        once per process (TensorFlow starts one server), shared by every pipeline made in it.

        Raises:
            RuntimeError: TensorFlow already ran something (the server must start first).
            ImportError: started by horovodrun, and Horovod is not importable.
        """
        from tfpar.strategies._started_by import started_by_horovod

        if started_by_horovod():
            return _joined_horovod()
        info = _tf_config_cluster()
        if info is None or info.num_workers < 2:
            return None
        return _joined(info.num_workers, info.worker_index)

    @staticmethod
    def several() -> bool:
        """Whether `join` would join several workers, read from the environment alone (nothing
        started): a Horovod rank of more than one, or a TF_CONFIG that names several workers."""
        from tfpar.strategies._started_by import started_by_horovod

        if started_by_horovod():
            return _launched_size() != 1
        info = _tf_config_cluster()
        return info is not None and info.num_workers > 1

    def _chained(self, previous, op, *args):
        with tf.control_dependencies(previous):
            return op(
                *args,
                group_size=self.num_workers,
                group_key=GROUP_KEY,
                instance_key=next(self._keys),
                timeout=self.timeout,
            )

    def sum(self, gradients: Sequence) -> list:
        """Each gradient summed over the workers (None stays None)."""
        out = list(gradients)
        previous: list = []
        dense: dict = {}
        for i, g in enumerate(gradients):
            if g is not None and not isinstance(g, tf.IndexedSlices):
                dense.setdefault(g.dtype, []).append(i)
        for dtype, indices in dense.items():
            flat = tf.concat([tf.reshape(gradients[i], [-1]) for i in indices], 0)
            summed = self._chained(previous, _compat.collective_all_reduce, flat)
            previous = [summed]
            sizes = [gradients[i].shape.num_elements() for i in indices]
            for i, part in zip(indices, tf.split(summed, sizes)):
                out[i] = tf.reshape(part, tf.shape(gradients[i]))
        for i, g in enumerate(gradients):
            if isinstance(g, tf.IndexedSlices):
                values = self._chained(previous, _compat.collective_all_gather, g.values)
                indices = self._chained([values], _compat.collective_all_gather, g.indices)
                previous = [indices]
                out[i] = tf.IndexedSlices(values, indices, g.dense_shape)
        return out

    def start_alike(self, variables: Sequence) -> None:
        """Sets ``variables`` to worker 0's values on every worker (eagerly, at construction)."""
        by_dtype: dict = {}
        for v in variables:
            by_dtype.setdefault(tf.as_dtype(v.dtype), []).append(v)
        for dtype, group in by_dtype.items():
            flat = tf.concat([tf.reshape(tf.convert_to_tensor(v), [-1]) for v in group], 0)
            mine = flat if self.worker_index == 0 else tf.zeros_like(flat)
            with tf.device("/device:CPU:0"):
                first = self._chained([], _compat.collective_all_reduce, mine)
            for v, part in zip(group, tf.split(first, [int(tf.size(v)) for v in group])):
                # its value's shape (a trace's has a None axis)
                v.assign(tf.reshape(part, tf.shape(v)))


@functools.cache
def _joined(num_workers, worker_index):
    from tfpar.strategies.data_parallel import DataParallel

    return Workers(DataParallel(), num_workers, worker_index)


class HorovodWorkers(Workers):
    """The ranks of a ``horovodrun`` job as the workers: Horovod's collectives, matched by name."""

    def __init__(self, hvd: Any) -> None:
        self.hvd, self.num_workers, self.worker_index = hvd, hvd.size(), hvd.rank()
        self._keys = itertools.count(1)

    def sum(self, gradients: Sequence) -> list:
        hvd, n = self.hvd, next(self._keys)
        out = list(gradients)
        dense = [
            i
            for i, g in enumerate(gradients)
            if g is not None and not isinstance(g, tf.IndexedSlices)
        ]
        if dense:
            flat = tf.concat(
                [tf.reshape(tf.cast(gradients[i], tf.float32), [-1]) for i in dense], 0
            )
            summed = hvd.allreduce(flat, op=hvd.Sum, name=f"tfpar_pipeline_gradients_{n}")
            for i, part in zip(
                dense, tf.split(summed, [gradients[i].shape.num_elements() for i in dense])
            ):
                out[i] = tf.cast(tf.reshape(part, tf.shape(gradients[i])), gradients[i].dtype)
        for i, g in enumerate(gradients):
            if isinstance(g, tf.IndexedSlices):
                out[i] = tf.IndexedSlices(
                    hvd.allgather(g.values, name=f"tfpar_pipeline_values_{n}_{i}"),
                    hvd.allgather(g.indices, name=f"tfpar_pipeline_indices_{n}_{i}"),
                    g.dense_shape,
                )
        return out

    def start_alike(self, variables: Sequence) -> None:
        self.hvd.broadcast_variables(
            [getattr(v, "value", v) if not isinstance(v, tf.Variable) else v for v in variables],
            root_rank=0,
        )


@functools.cache
def _joined_horovod():
    from tfpar.strategies.horovod import import_horovod

    hvd = import_horovod()
    return HorovodWorkers(hvd) if hvd.size() > 1 else None


def _tf_config_cluster():
    """TF_CONFIG's cluster (a `tfpar.cluster.ClusterInfo`), or None where it is not set."""
    from tfpar.cluster import ClusterInfo

    return ClusterInfo.from_tf_config() if os.environ.get("TF_CONFIG", "").strip() else None


SIZE_VARIABLES = ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS")
"""Where horovodrun, mpirun and srun give a Horovod job's number of ranks."""


def _launched_size():
    """The number of ranks the launcher of this Horovod rank gives (`SIZE_VARIABLES`, the first
    set), or None where none is set.

    Raises:
        ValueError: the variable is not a whole number.
    """
    for name in SIZE_VARIABLES:
        value = os.environ.get(name, "").strip()
        if not value:
            continue
        if not value.isdigit():
            raise ValueError(
                f"{name} gives the number of ranks of this job. Received: {name}={value!r}. "
                "Start the job with horovodrun, mpirun or srun, which set it."
            )
        return int(value)
    return None
