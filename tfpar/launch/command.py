"""``tfpar launch``'s options and run, for ``tfpar.cli``: the options in one group per back-end, the
parsed command line turned once into a `LaunchConfig` (torchrun's ``config_from_args``), and the
back-end that config chooses run. Nothing below this module sees the command line."""

import argparse
import dataclasses
import os

from tfpar._checks import whole_number as _int
from tfpar._tasks.elastic_batch import ELASTIC_BATCHES
from tfpar.cluster import ROLES
from tfpar.launch.backends import backend_for
from tfpar.launch.config import LaunchConfig

__all__ = ["add_arguments", "config_from_args", "run"]

_FIELDS = [
    field for field in dataclasses.fields(LaunchConfig) if field.init and field.name != "command"
]
_DEFAULTS = {field.name: field.default for field in _FIELDS}
"""The options' defaults: `LaunchConfig`'s, defined once."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``tfpar launch``'s options, grouped by the back-end that reads them."""
    _local_options(parser.add_argument_group("a local job (every task on 127.0.0.1)"))
    _host_options(parser.add_argument_group("several hosts, each named (--hosts, --cluster)"))
    _node_options(parser.add_argument_group("several identical hosts (--nnodes, as torchrun)"))
    _elastic_options(
        parser.add_argument_group("an elastic job (--min-workers, --max-workers, --nnodes MIN:MAX)")
    )
    _other_options(parser.add_argument_group("SLURM and Horovod"))
    _supervision_options(parser.add_argument_group("supervision (every back-end)"))
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- program and arguments")
    parser.set_defaults(**_DEFAULTS)


def _local_options(group):
    group.add_argument(
        "-n",
        "--workers",
        type=_int,
        help="number of local workers on 127.0.0.1, sharing this host's devices",
    )
    group.add_argument(
        "--nproc-per-node",
        type=_int,
        metavar="N",
        help="N workers on this host, each with its own GPUs (CUDA_VISIBLE_DEVICES) or, without a "
        "GPU, its own virtual CPU device; with --hosts or --nnodes, N on every host",
    )
    group.add_argument(
        "--ps",
        type=_int,
        help="parameter-server job: this many ps tasks, -n worker servers, and a chief "
        "that runs the command",
    )


def _host_options(group):
    group.add_argument(
        "--hosts",
        help="comma-separated host[:port] list (port 2222 when left out), one worker "
        "each, or --nproc-per-node each on consecutive ports",
    )
    group.add_argument("--cluster", help='JSON file with the cluster ({"worker": [...], ...})')
    group.add_argument("--task-type", choices=ROLES, help="this machine's role (multi-host)")
    group.add_argument(
        "--task-index",
        type=_int,
        help="this machine's index in its role (multi-host)",
    )


def _node_options(group):
    group.add_argument(
        "--nnodes",
        metavar="K|MIN:MAX",
        help="K identical hosts: run the same line on each with its --node-rank; node 0 (at "
        "--master-addr) tells every node the others' addresses. MIN:MAX: an elastic job, the "
        "same line on every host (no --node-rank); it goes on with at least MIN when hosts are "
        "lost and grows back to MAX as they join, restarting every worker from "
        "FaultTolerance's backup",
    )
    group.add_argument(
        "--node-rank",
        type=_int,
        metavar="R",
        help="with --nnodes K: this host, 0 to K-1",
    )
    group.add_argument(
        "--master-addr",
        metavar="HOST",
        help="with --nnodes: node 0's address, reachable from every node",
    )
    group.add_argument("--master-port", type=_int, help="with --nnodes: node 0's port")
    group.add_argument(
        "--rendezvous-timeout",
        type=float,
        help="with --nnodes: seconds to wait for every node to join (MIN:MAX: for MIN)",
    )


def _elastic_options(group):
    group.add_argument(
        "--min-workers",
        type=_int,
        metavar="N",
        help="an elastic local job: it trains on with at least N workers when it loses some "
        "(default 1)",
    )
    group.add_argument(
        "--max-workers",
        type=_int,
        metavar="N",
        help="an elastic local job: at most N workers; it grows back to them when capacity returns",
    )
    group.add_argument(
        "--host-discovery-script",
        metavar="PATH",
        help="an elastic local job: an executable printing host:slots lines (Horovod's), run "
        "again every second; a worker a slot",
    )
    group.add_argument(
        "--host-discovery-file",
        metavar="PATH",
        help="an elastic local job: a file of host:slots lines, read again every second",
    )
    group.add_argument(
        "--elastic-timeout",
        type=float,
        help="an elastic job: seconds to wait for --min-workers slots (--nnodes MIN:MAX: MIN "
        "nodes) before failing",
    )
    group.add_argument(
        "--elastic-batch",
        choices=ELASTIC_BATCHES,
        help="an elastic job on fewer workers than --max-workers (else the most it has had; "
        "--nnodes MIN:MAX: MAX nodes'): keep the global batch by computing each replica's "
        "batch in micro-batches of the full job's size and accumulating their gradients "
        "(DataParallel), or by larger per-replica batches (grow); or keep each replica's "
        "batch, the global batch following the workers, and scale the learning rate with it "
        "by the linear rule (scale-lr) or the square root (scale-lr-sqrt)",
    )


def _other_options(group):
    group.add_argument(
        "--slurm",
        action="store_true",
        help="join the SLURM job this srun task belongs to (one worker per task; the "
        "cluster comes from SLURM_JOB_NODELIST, SLURM_NTASKS, SLURM_PROCID)",
    )
    group.add_argument(
        "--horovod",
        action="store_true",
        help="start a Horovod job instead (horovodrun --gloo, -n local ranks)",
    )


def _supervision_options(group):
    group.add_argument(
        "--grace",
        type=float,
        help="seconds a stopped task gets before SIGKILL",
    )
    group.add_argument(
        "--max-restarts",
        type=_int,
        help="local jobs: when a task fails, stop the others and start the job again on "
        "fresh ports, up to this many times (training resumes from FaultTolerance's backup); "
        "elastic jobs: the failures of one worker's slot (--nnodes MIN:MAX: of one node's "
        "workers) before it is dropped",
    )
    group.add_argument(
        "--heartbeat-timeout",
        type=float,
        help="seconds a task may make no training step before it is named hung, its stacks are "
        "dumped and the job is stopped (or restarted under --max-restarts)",
    )
    group.add_argument(
        "--timeline",
        metavar="DIR",
        help="every fit of the job writes DIR/timeline.json: a Chrome trace of all workers' steps "
        "(tfpar.callbacks.Timeline); with --horovod, Horovod's own "
        "DIR/horovod_timeline.json too",
    )


def config_from_args(args: argparse.Namespace) -> LaunchConfig:
    """The job the parsed command line ``args`` describes, checked."""
    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    return LaunchConfig(command=tuple(command), **{name: getattr(args, name) for name in _DEFAULTS})


def run(args: argparse.Namespace) -> int:
    """``tfpar launch``: the job ``args`` describes, run by the back-end it chooses."""
    config = config_from_args(args)
    if config.timeline is not None:
        _timeline_folder(config.timeline, horovod=config.horovod)
    return backend_for(config).run(config)


def _timeline_folder(folder, horovod):
    """--timeline DIR: made if missing and checked writable now; the tasks inherit
    $TFPAR_TIMELINE."""
    from tfpar._tasks.timeline_files import TIMELINE_VARIABLE, timeline_in

    folder = os.path.dirname(timeline_in(folder, "--timeline"))
    os.environ[TIMELINE_VARIABLE] = folder
    if horovod:
        os.environ.setdefault("HOROVOD_TIMELINE", os.path.join(folder, "horovod_timeline.json"))
