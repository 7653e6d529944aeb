"""`auto()`: the strategy that fits how the script was started, so one script runs anywhere.

| started by                                   | strategy                              |
|----------------------------------------------|---------------------------------------|
| ``horovodrun`` / ``tfpar launch --horovod``  | `HorovodStrategy` (one rank/process)  |
| ``tfpar launch -n N`` (TF_CONFIG, N workers) | `DataParallel`: MultiWorkerMirrored   |
| plain ``python``                             | `DataParallel`: Mirrored, local devices |
"""

import os

__all__ = ["auto", "started_by_horovod"]

# horovodrun sets HOROVOD_RANK for Gloo jobs; under --mpi, Open MPI's and MPICH's
# launchers set their own rank variables.
_HOROVOD_MARKERS = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


def started_by_horovod():
    """Whether this process was started as a rank of a Horovod job."""
    return any(name in os.environ for name in _HOROVOD_MARKERS)


def auto(**options):
    """Returns `HorovodStrategy(**options)` under Horovod, else `DataParallel(**options)`.

    Args:
        **options: fields of `HorovodConfig` or `DataParallelConfig`, whichever applies.

    Example:
        >>> strategy = tfpar.strategies.auto()  # doctest: +SKIP
    """
    if started_by_horovod():
        from tfpar.strategies.horovod import HorovodStrategy

        return HorovodStrategy(**options)
    from tfpar.strategies.data_parallel import DataParallel

    return DataParallel(**options)
