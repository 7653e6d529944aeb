"""The cluster a `ParameterServer` coordinates: read from ``TF_CONFIG`` (or given), checked for ps
and worker tasks, and the partitioner that shards its variables over the ps tasks."""

from tfpar._keras import tf
from tfpar.cluster import ClusterInfo

__all__ = ["cluster_from", "partitioner_of"]


def cluster_from(config):
    """``config``'s cluster, else ``TF_CONFIG``'s, with at least one ps and one worker task."""
    cluster = config.cluster or ClusterInfo.from_tf_config()
    if cluster is None:
        raise ValueError(
            "ParameterServer needs a cluster with ps and worker tasks. Received: no TF_CONFIG "
            "and no cluster=. Use ParameterServer.local(num_workers=2, num_ps=1), or start the "
            "job with `tfpar launch --ps 1 --workers 2 -- python train.py`."
        )
    for role in ("ps", "worker"):
        if not cluster.cluster.get(role):
            raise ValueError(
                f"A parameter-server cluster needs at least one {role!r} task. Received: "
                f"{ {r: len(a) for r, a in cluster.cluster.items()} }. Add {role} tasks "
                f"(tfpar launch --ps 1 --workers 2)."
            )
    return cluster


def partitioner_of(config, num_ps):
    """``config``'s variable partitioner; "auto" is min-size sharding over the ``num_ps`` tasks."""
    if config.variable_partitioner == "auto":
        return tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=config.min_shard_bytes, max_shards=num_ps
        )
    return config.variable_partitioner
