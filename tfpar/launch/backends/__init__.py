"""The back-ends of ``tfpar launch``: how a job's tasks are started, one small class each, all
watched by one `tfpar.launch.supervisor.Supervisor` (heartbeats, step times, the timeline merge).

- `Elastic` (``--min-workers``, ``--max-workers``, ``--host-discovery-*``): workers on 127.0.0.1, as
  many as discovery lists.
- `Horovod` (``--horovod``): ``horovodrun --gloo`` with N local ranks.
- `Slurm` (``--slurm``): this srun task's worker, the cluster from SLURM.
- `Nodes` (``--nnodes K`` or ``MIN:MAX``): this host's workers, the cluster from a rendezvous
  (elastic: each round's).
- `Hosts` (``--hosts``, ``--cluster``): this machine's task(s) of a multi-host cluster.
- `Local` (``-n N [--ps M]``, ``--nproc-per-node N``): every task on 127.0.0.1, restarted on
  failure.

``tfpar launch`` asks them in this order (`BACKENDS`).

A back-end (Ray Train's ``Backend.on_start`` is the shape) says whether the command line is its
(`chosen`), refuses the options it cannot take (`check`), and runs the job (`start`). `BACKENDS`
is the table ``tfpar launch`` walks: the first chosen one runs. Pure Python, no TensorFlow.
"""

from tfpar.launch.backends.base import Backend
from tfpar.launch.backends.elastic import Elastic
from tfpar.launch.backends.horovod import Horovod
from tfpar.launch.backends.hosts import Hosts
from tfpar.launch.backends.local import Local
from tfpar.launch.backends.nodes import Nodes
from tfpar.launch.backends.slurm import Slurm
from tfpar.launch.config import LaunchConfig

__all__ = [
    "BACKENDS",
    "Backend",
    "Elastic",
    "Horovod",
    "Hosts",
    "Local",
    "Nodes",
    "Slurm",
    "backend_for",
]

BACKENDS = (Elastic(), Horovod(), Slurm(), Nodes(), Hosts(), Local())
"""The back-ends, in the order ``tfpar launch`` asks them: the first `chosen` runs the job."""


def backend_for(config: LaunchConfig) -> Backend:
    """The back-end ``config`` chose."""
    return next(backend for backend in BACKENDS if backend.chosen(config))
