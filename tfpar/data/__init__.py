"""tf.data input sharding for tfpar strategies.

Names load on first use, so that the pure modules (`tfpar.data.plan`, the sharding
arithmetic, and `tfpar.data.batching`) import without TensorFlow.
"""

from tfpar._lazy import exports

__getattr__, __dir__, __all__ = exports(
    __name__,
    {
        "REMAINDERS": "tfpar.data.plan",
        "SHARD_POLICIES": "tfpar.data.plan",
        "ShardPlan": "tfpar.data.plan",
        "plan_shard": "tfpar.data.plan",
        "per_replica_batch_size": "tfpar.data.batching",
        "CoverageReport": "tfpar.data.coverage",
        "DistributedInput": "tfpar.data.sharding",
        "InputConfig": "tfpar.data.worker_input",
        "check_coverage": "tfpar.data.coverage",
        "distribute": "tfpar.data.sharding",
        "worker_dataset": "tfpar.data.worker_input",
        "worker_stream": "tfpar.data.worker_input",
    },
)
