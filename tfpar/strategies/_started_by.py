"""How this process was started: by Horovod (horovodrun, mpirun, srun with MPI), by SLURM, or
otherwise; `tfpar.strategies.auto` picks the strategy from it (the table there).

SLURM is recognized before the MPI launchers' variables: srun's PMI plugins set ``PMI_RANK``
and ``PMIX_RANK`` for its tasks, so under srun they mean "srun was asked for MPI" (Horovod),
not "mpirun started this".
"""

import os

__all__ = ["SLURM_MPI_MARKERS", "choose", "refuse_elastic_horovodrun", "started_by_horovod"]

# horovodrun sets HOROVOD_RANK for Gloo jobs; under --mpi, Open MPI's and MPICH's
# launchers set their own rank variables.
_HOROVOD_MARKERS = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
SLURM_MPI_MARKERS = ("PMIX_RANK", "PMI_RANK")  # srun --mpi=pmix / --mpi=pmi2


def started_by_horovod(environ=None):
    """Whether this process was started as a rank of a Horovod job (see `choose`)."""
    return choose(environ) == "horovod"


def choose(environ=None):
    """What `auto` picks here: ``"horovod"``, ``"slurm"`` (DataParallel over the SLURM tasks),
    or ``"data_parallel"`` (TF_CONFIG's cluster, or this host)."""
    from tfpar.cluster import started_by_srun

    env = os.environ if environ is None else environ
    if "HOROVOD_RANK" in env:
        return "horovod"
    if started_by_srun(env):
        if any(name in env for name in SLURM_MPI_MARKERS):
            return "horovod"
        return "data_parallel" if env.get("TF_CONFIG", "").strip() else "slurm"
    return "horovod" if any(name in env for name in _HOROVOD_MARKERS) else "data_parallel"


def refuse_elastic_horovodrun(environ=None):
    """HorovodStrategy's replicas are fixed when it is built, and its step function with them: under
    Horovod's elastic mode (``horovodrun --min-np/--max-np``, which sets HOROVOD_ELASTIC=1) the ring
    re-forms in memory with other ranks, which that function cannot follow. Refused at once, with
    the ways that do follow a membership change."""
    env = os.environ if environ is None else environ
    if env.get("HOROVOD_ELASTIC") == "1":
        raise ValueError(
            "HorovodStrategy cannot follow a change of Horovod's ranks: its replicas and its "
            "compiled step are fixed when it is built. Received: an elastic horovodrun "
            "(HOROVOD_ELASTIC=1, from --min-np/--max-np or --host-discovery-script). Use Horovod's "
            "elastic API for this script (hvd.elastic.run, hvd.elastic.KerasState, "
            "horovod.tensorflow.keras.DistributedOptimizer, state.commit()), or an elastic "
            "`tfpar launch --min-workers N` with tfpar.DataParallel."
        )
