"""tf.data input sharding for tfpar strategies."""

from tfpar.data.batching import per_replica_batch_size
from tfpar.data.plan import REMAINDERS, SHARD_POLICIES, ShardPlan, plan_shard
from tfpar.data.sharding import (
    CoverageReport,
    DistributedInput,
    InputConfig,
    check_coverage,
    distribute,
    worker_dataset,
)

__all__ = [
    "REMAINDERS",
    "SHARD_POLICIES",
    "CoverageReport",
    "DistributedInput",
    "InputConfig",
    "ShardPlan",
    "check_coverage",
    "distribute",
    "per_replica_batch_size",
    "plan_shard",
    "worker_dataset",
]
