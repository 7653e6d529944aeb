"""Where this process stands in its job, one answer for every strategy (torchtitan's
``ParallelDims`` is the shape): how many workers train, which one this is, how many replicas each
runs, and whether a coordinator drives them.

Every tfpar parallelism has it as ``.topology``; `topology_of` answers for TensorFlow's own
strategies too (and for none: the current one), so a callback or an input asks here instead of
testing classes.
"""

import dataclasses

__all__ = ["Topology", "topology_of"]


@dataclasses.dataclass(frozen=True)
class Topology:
    """This process in its job.

    Attributes:
        num_workers: the processes that train (under parameter servers: the workers, not the
            coordinator, which trains no replica itself).
        worker_index: this process among them (0 to num_workers - 1; the chief is 0; a coordinator
            is 0 too).
        replicas_per_worker: the replicas each worker runs (its devices under a Mirrored worker, 1
            for a Horovod rank, the pipeline's copies in its one process).
        coordinator: a coordinator drives the workers (parameter servers): ``fit`` runs there, the
            steps on the workers, and Keras calls no batch hooks.
    """

    num_workers: int = 1
    worker_index: int = 0
    replicas_per_worker: int = 1
    coordinator: bool = False

    @property
    def is_chief(self):
        """Whether this process is the one that saves and prints for the job."""
        return self.worker_index == 0

    @property
    def num_replicas(self):
        """The replicas the global batch is split over."""
        return self.num_workers * self.replicas_per_worker


def topology_of(strategy=None):
    """The `Topology` of ``strategy`` (default: the current strategy), tfpar's or TensorFlow's."""
    import tensorflow as tf

    strategy = tf.distribute.get_strategy() if strategy is None else strategy
    if isinstance(getattr(type(strategy), "topology", None), property):  # a tfpar parallelism
        return strategy.topology
    return derived_topology(strategy)


def derived_topology(strategy):
    """The `Topology` a ``tf.distribute.Strategy`` tells: its replicas and devices, and its
    cluster."""
    import tensorflow as tf

    from tfpar import _compat

    if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        return Topology(num_workers=_compat.ps_num_workers(strategy), coordinator=True)
    try:
        local = len(strategy.extended.worker_devices) or 1
    except RuntimeError:  # the default strategy outside a scope: one process, one device
        return Topology()
    workers = max(1, strategy.num_replicas_in_sync // local)
    resolver = getattr(strategy, "cluster_resolver", None)
    if workers == 1 or resolver is None or not resolver.task_type:
        return Topology(replicas_per_worker=local)
    from tfpar.cluster import ClusterInfo

    info = ClusterInfo(
        cluster=resolver.cluster_spec().as_dict(),
        task_type=resolver.task_type,
        task_index=resolver.task_id,
    )
    return Topology(
        num_workers=info.num_workers, worker_index=info.worker_index, replicas_per_worker=local
    )
