"""tfpar's strategies: real `tf.distribute.Strategy` objects."""

from tfpar.strategies.data_parallel import (
    DataParallel,
    DataParallelConfig,
    MirroredDataParallel,
    MultiWorkerDataParallel,
)

__all__ = [
    "DataParallel",
    "DataParallelConfig",
    "MirroredDataParallel",
    "MultiWorkerDataParallel",
]
