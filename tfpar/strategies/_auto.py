"""`auto()`: the strategy that fits how the script was started, so one script runs anywhere.

| started by                                           | strategy                                |
|------------------------------------------------------|-----------------------------------------|
| ``horovodrun`` / ``tfpar launch --horovod``          | `HorovodStrategy` (one rank/process)    |
| ``srun --mpi=pmix`` (or pmi2) under SLURM            | `HorovodStrategy` over SLURM's MPI      |
| ``srun`` under SLURM, no TF_CONFIG                   | `DataParallel`: one worker per task     |
| ``mpirun`` (Open MPI, MPICH)                         | `HorovodStrategy`                       |
| ``tfpar launch`` (TF_CONFIG, N workers)              | `DataParallel`: MultiWorkerMirrored     |
| plain ``python``                                     | `DataParallel`: Mirrored, local devices |

How it was started is read by `tfpar.strategies._started_by.choose`.
"""

import os
from typing import Any

from tfpar.strategies._started_by import SLURM_MPI_MARKERS, choose, started_by_horovod

__all__ = ["SLURM_MPI_MARKERS", "auto", "choose", "started_by_horovod"]


def auto(**options: Any) -> Any:
    """Returns the strategy for how this process was started (the table above).

    Args:
        **options: fields of `HorovodConfig` or `DataParallelConfig`, whichever applies.

    Examples:
        >>> strategy = tfpar.strategies.auto()  # doctest: +SKIP
    """
    kind = choose()
    if kind == "horovod":
        from tfpar.strategies.horovod import HorovodStrategy

        return HorovodStrategy(**options)
    from tfpar.strategies.data_parallel import DataParallel

    if kind == "slurm" and "cluster" not in options:
        from tfpar.cluster import ClusterInfo, slurm_gpu_env

        os.environ.update(slurm_gpu_env())  # before TensorFlow finds the GPUs
        options["cluster"] = ClusterInfo.from_slurm()
    return DataParallel(**options)
