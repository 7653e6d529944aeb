"""tfpar's strategies: real `tf.distribute.Strategy` objects.

`HorovodStrategy` lives in `tfpar.strategies.horovod` (imported on use, as it
needs Horovod); `auto()` picks it under horovodrun.
"""

from tfpar.strategies.auto import auto
from tfpar.strategies.data_parallel import (
    DataParallel,
    DataParallelConfig,
    MirroredDataParallel,
    MultiWorkerDataParallel,
)
from tfpar.strategies.parameter_server import ParameterServer, ParameterServerConfig

__all__ = [
    "auto",
    "DataParallel",
    "DataParallelConfig",
    "MirroredDataParallel",
    "MultiWorkerDataParallel",
    "ParameterServer",
    "ParameterServerConfig",
]
