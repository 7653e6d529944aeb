"""Horovod in this process: imported (an install hint where it is missing) and initialised as the
job's rank under ``horovodrun`` or ``mpirun``, under ``srun`` only through SLURM's MPI plugin and
an MPI-built Horovod, and alone as one rank whose MPI stays off the network."""

import os
from typing import Any

from tfpar._local import loopback
from tfpar.strategies._started_by import SLURM_MPI_MARKERS, started_by_horovod

__all__ = ["INSTALL_HINT", "import_horovod"]

INSTALL_HINT = (
    "Install it with `pip install '.[horovod]' && tfpar install-horovod` in the tfpar checkout (it "
    "builds Horovod with Gloo, and MPI where it can, against this TensorFlow)."
)


def import_horovod() -> Any:
    """Returns ``horovod.tensorflow``, initialised.

    Raises:
        ImportError: if Horovod is not installed, saying how to install it.
    """
    try:
        import horovod.tensorflow as hvd
    except ImportError as e:
        raise ImportError(
            f"HorovodStrategy needs Horovod, which is not importable ({e}). {INSTALL_HINT}"
        ) from None
    if not hvd.is_initialized():
        _check_srun_step(hvd, os.environ)
        if started_by_horovod():
            hvd.init()
        else:
            _init_one_rank(hvd)
    return hvd


def _check_srun_step(hvd, env):
    """Under ``srun``, Horovod's ranks come from SLURM's MPI plugin (``srun --mpi=pmix``), which
    only an MPI-built Horovod can use: without either, each task would train alone as rank 0."""
    from tfpar.cluster import started_by_srun

    if not started_by_srun(env) or env.get("SLURM_NTASKS", "1") == "1" or "HOROVOD_RANK" in env:
        return
    mpi_plugin = any(name in env for name in SLURM_MPI_MARKERS)
    if not mpi_plugin:
        raise ValueError(
            "HorovodStrategy under srun needs SLURM's MPI plugin to join the "
            f"{env['SLURM_NTASKS']} tasks into one Horovod job. Received: an srun step without "
            "--mpi (no PMIX_RANK or PMI_RANK set). Start it with `srun --mpi=pmix ...` (see "
            "examples/slurm/horovod.sbatch), or use tfpar.strategies.auto() / DataParallel, which "
            "join srun's tasks without MPI."
        )
    if not hvd.mpi_built():
        raise ValueError(
            "HorovodStrategy under `srun --mpi=...` needs a Horovod built with MPI; this one has "
            "Gloo only, so each task would train alone. Received: PMIX_RANK/PMI_RANK from srun, "
            "Horovod without MPI. Rebuild it with `tfpar install-horovod --mpi yes` (OpenMPI with "
            "PMIx), or use tfpar.strategies.auto() / DataParallel under plain srun."
        )


def _init_one_rank(hvd):
    """``hvd.init()`` for a rank not started by horovodrun or mpirun: MPI's singleton would open
    its TCP transport in this process, and its helper daemon (orted) its ports, on every
    interface, with no peer to talk to. Shared memory serves one rank, and the daemon starts
    with tfpar's loopback library."""
    os.environ.setdefault("OMPI_MCA_btl", "self,vader")
    saved = os.environ.get("LD_PRELOAD")
    os.environ.update(loopback.child_env(dict(os.environ)))
    try:
        hvd.init()
    finally:
        if saved is None:
            os.environ.pop("LD_PRELOAD", None)
        else:
            os.environ["LD_PRELOAD"] = saved
