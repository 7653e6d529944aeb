"""The back-ends of ``tfpar launch``: how a job's tasks are started, one small class each, all
watched by one `tfpar.launch.supervisor.Supervisor` (heartbeats, step times, the timeline merge).

| back-end   | chosen by                  | starts                                              |
|------------|----------------------------|-----------------------------------------------------|
| `Horovod`  | ``--horovod``              | ``horovodrun --gloo`` with N local ranks            |
| `Slurm`    | ``--slurm``                | this srun task's worker, the cluster from SLURM      |
| `Nodes`    | ``--nnodes K`` / ``MIN:MAX``| this host's workers; the cluster from a rendezvous (elastic: each round's) |
| `Hosts`    | ``--hosts`` / ``--cluster``| this machine's task(s) of a multi-host cluster      |
| `Elastic`  | ``--min-workers``, ``--max-workers``, ``--host-discovery-*`` | workers on 127.0.0.1, as many as discovery lists |
| `Local`    | ``-n N [--ps M]``, ``--nproc-per-node N`` | every task on 127.0.0.1, restarted on failure |

A back-end (Ray Train's ``Backend.on_start`` is the shape) says whether the command line is its
(`chosen`), refuses the options it cannot take (`check`), and runs the job (`start`). `BACKENDS`
is the table ``tfpar launch`` walks: the first chosen one runs. Pure Python, no TensorFlow.
"""

import os
import shutil
from argparse import Namespace

from tfpar._checks import check_number
from tfpar._local.processes import DEFAULT_GRACE_SECONDS, run_command
from tfpar.launch.runner import Task, launch, load_cluster_file
from tfpar.launch.supervisor import Supervisor

__all__ = ["BACKENDS", "Backend", "Elastic", "Horovod", "Hosts", "Local", "Nodes", "Slurm", "backend_for"]


class Backend:
    """How ``tfpar launch`` starts a job's tasks. ``args``: the parsed command line."""

    name = ""

    def chosen(self, args: Namespace) -> bool:
        """Whether the command line asks for this back-end."""
        raise NotImplementedError

    def check(self, args: Namespace, command: list[str]) -> None:
        """Raises ValueError, naming the option, for what this back-end cannot take."""

    def start(self, args: Namespace, command: list[str]) -> int:
        """Runs the job; returns its exit code (0) or raises `tfpar.launch.LaunchError`."""
        raise NotImplementedError

    def run(self, args: Namespace, command: list[str]) -> int:
        """`check`, then `start`."""
        self.check(args, command)
        return self.start(args, command)


class Horovod(Backend):
    """``horovodrun --gloo`` on this machine, which supervises the ranks; tfpar watches their
    heartbeats and merges Horovod's timeline into the job's."""

    name = "horovod"

    def chosen(self, args: Namespace) -> bool:
        return args.horovod

    def check(self, args: Namespace, command: list[str]) -> None:
        if getattr(args, "nproc_per_node", None) is not None and args.workers is None:  # (tfpar demo's args have none)
            args.workers = args.nproc_per_node  # horovodrun pins one GPU per local rank itself
        if args.hosts or args.cluster:
            raise ValueError(
                "tfpar launch --horovod starts local ranks only. Received: --hosts/--cluster. "
                "On several machines run horovodrun -H host1:N,host2:N --gloo directly.")
        if args.workers is None or args.workers < 1:
            raise ValueError(f"tfpar launch --horovod needs -n N >= 1. Received: -n {args.workers}.")
        if not command:
            raise ValueError("Nothing to launch. Received: an empty command.")
        if getattr(args, "heartbeat_timeout", None) is not None:
            check_number("heartbeat_timeout", args.heartbeat_timeout, above=0,
                         hint=" (seconds a rank may make no step)")
        if shutil.which("horovodrun") is None:
            from tfpar.strategies.horovod import INSTALL_HINT

            raise ValueError(f"tfpar launch --horovod needs horovodrun, which is not on PATH. {INSTALL_HINT}")

    def start(self, args: Namespace, command: list[str]) -> int:
        n = str(args.workers)
        argv = [shutil.which("horovodrun") or "horovodrun", "-np", n, "-H", f"localhost:{n}", "--gloo", *command]

        def say(message):
            print(f"tfpar launch: {message}", flush=True)

        with Supervisor(getattr(args, "heartbeat_timeout", None), say) as supervisor:
            code = run_command(argv, env={**os.environ, **supervisor.task_env("rank-{rank}")},
                               grace_seconds=getattr(args, "grace", DEFAULT_GRACE_SECONDS), check=supervisor.check)
            if code == 0:
                supervisor.finish("rank")
            return code


class Slurm(Backend):
    """This srun task's worker: the cluster from SLURM's variables, run as `Hosts` runs one task."""

    name = "slurm"

    def chosen(self, args: Namespace) -> bool:
        return args.slurm and not (args.hosts and args.cluster)  # that mistake is Hosts' to name

    def check(self, args: Namespace, command: list[str]) -> None:
        given = [flag for flag, value in (("-n", args.workers), ("--hosts", args.hosts), ("--cluster", args.cluster),
                                          ("--task-index", args.task_index), ("--ps", args.ps or None),
                                          ("--max-restarts", args.max_restarts or None),
                                          ("--nproc-per-node", args.nproc_per_node), ("--nnodes", args.nnodes))
                 if value is not None]
        if given:
            raise ValueError(f"--slurm takes the cluster from SLURM. Received: --slurm with {', '.join(given)}. "
                             "Leave those out (srun starts one task per worker).")

    def start(self, args: Namespace, command: list[str]) -> int:
        from tfpar.cluster import ClusterInfo, slurm_gpu_env

        info = ClusterInfo.from_slurm()
        task = Task(task_type=info.task_type, task_index=info.task_index)
        return launch(command, cluster=info.cluster, task=task, env={**os.environ, **slurm_gpu_env()},
                      grace_seconds=args.grace, heartbeat_timeout=args.heartbeat_timeout)


class Nodes(Backend):
    """``--nnodes K --node-rank R --master-addr A``: K identical hosts, ``--nproc-per-node`` workers
    each, their addresses agreed through node 0 (`tfpar.launch.rendezvous.static`), as torchrun's users start a job.
    ``--nnodes MIN:MAX``: an elastic job on MIN to MAX hosts, the same line on each, no ``--node-rank``
    (`tfpar.launch.rendezvous.elastic`)."""

    name = "nodes"

    def chosen(self, args: Namespace) -> bool:
        return args.nnodes is not None

    def check(self, args: Namespace, command: list[str]) -> None:
        from tfpar._checks import check_int
        from tfpar.launch.rendezvous.elastic import parse_nnodes

        self.elastic = ":" in str(args.nnodes)
        given = [flag for flag, value in (("-n", args.workers), ("--hosts", args.hosts), ("--cluster", args.cluster),
                                          ("--task-index", args.task_index), ("--ps", args.ps or None),
                                          ("--max-restarts", None if self.elastic else args.max_restarts or None),
                                          ("--slurm", args.slurm or None))
                 if value is not None]
        if given:
            raise ValueError(f"--nnodes finds the cluster through node 0. Received: --nnodes with {', '.join(given)}. "
                             "Leave those out; each node runs --nproc-per-node workers.")
        self.nnodes = parse_nnodes(args.nnodes)
        if self.elastic:
            return self._check_elastic(args)
        args.nnodes = self.nnodes[0]
        if args.node_rank is None or args.master_addr is None:
            raise ValueError(
                f"--nnodes {args.nnodes} needs this node's --node-rank (0 to {args.nnodes - 1}) and node 0's "
                f"--master-addr. Received: --node-rank {args.node_rank} --master-addr {args.master_addr}. Write "
                "e.g. tfpar launch --nnodes 2 --node-rank 0 --master-addr host0 --nproc-per-node 4 -- python train.py")
        check_int("--node-rank", args.node_rank, 0)
        if args.node_rank >= args.nnodes:
            raise ValueError(f"--node-rank must be below --nnodes. Received: --node-rank {args.node_rank} with "
                             f"--nnodes {args.nnodes}. Number the nodes 0 to {args.nnodes - 1}.")
        check_int("--master-port", args.master_port, 1)
        check_number("--rendezvous-timeout", args.rendezvous_timeout, above=0)

    def _check_elastic(self, args):
        from tfpar._checks import check_int

        if args.node_rank is not None:
            raise ValueError(f"An elastic job (--nnodes {args.nnodes}) numbers its nodes at each restart, node 0 being "
                             f"the first on --master-addr. Received: --node-rank {args.node_rank}. Leave it out and "
                             "run the same line on every node.")
        if args.master_addr is None:
            raise ValueError(f"--nnodes {args.nnodes} needs the address of the host whose first node hosts the "
                             "rendezvous. Received: no --master-addr. Write e.g. tfpar launch --nnodes 1:4 "
                             "--master-addr host0 --nproc-per-node 4 -- python train.py, the same on every node.")
        check_int("--master-port", args.master_port, 1)
        check_int("--max-restarts", args.max_restarts, 0, " (a node's failures before it leaves the job)")
        check_number("--rendezvous-timeout", args.rendezvous_timeout, above=0)
        check_number("--elastic-timeout", args.elastic_timeout, above=0, hint=" (seconds to wait for MIN nodes)")

    def start(self, args: Namespace, command: list[str]) -> int:
        from tfpar.launch.rendezvous.static import rendezvous

        nproc = 1 if args.nproc_per_node is None else args.nproc_per_node
        envs = _worker_envs(nproc)  # refused before the rendezvous: too few GPUs
        if self.elastic:
            from tfpar.launch.elastic.agent import run_elastic_nodes
            from tfpar.launch.runner import LaunchOptions

            options = LaunchOptions(grace_seconds=args.grace, max_restarts=args.max_restarts,
                                    heartbeat_timeout=args.heartbeat_timeout)
            return run_elastic_nodes(command, options, master_addr=args.master_addr, master_port=args.master_port,
                                     nnodes=self.nnodes, nproc=nproc, tasks_from=lambda first: _worker_tasks(first, envs),
                                     timeouts=(args.rendezvous_timeout, args.elastic_timeout), batch=args.elastic_batch)
        cluster, indices = rendezvous(master_addr=args.master_addr, master_port=args.master_port, nnodes=args.nnodes,
                                      node_rank=args.node_rank, nproc_per_node=nproc, timeout=args.rendezvous_timeout)
        print(f"tfpar launch: node {args.node_rank} of {args.nnodes}: workers {indices[0]} to {indices[-1]} of "
              f"{len(cluster['worker'])}", flush=True)
        tasks = _worker_tasks(indices[0], envs)
        return launch(command, cluster=cluster, tasks=tasks, grace_seconds=args.grace,
                      heartbeat_timeout=args.heartbeat_timeout)


class Hosts(Backend):
    """This machine's task of a cluster named by ``--hosts`` (workers) or ``--cluster`` (a file)."""

    name = "hosts"

    def chosen(self, args: Namespace) -> bool:
        return bool(args.hosts or args.cluster)

    def check(self, args: Namespace, command: list[str]) -> None:
        if args.hosts and args.cluster:
            raise ValueError("Give --hosts or --cluster, not both.")

    def start(self, args: Namespace, command: list[str]) -> int:
        from tfpar.cluster import parse_hosts

        cluster = {"worker": parse_hosts(args.hosts)} if args.hosts else load_cluster_file(args.cluster)
        if args.task_index is None:
            raise ValueError(
                "A multi-host job needs this machine's --task-index. Received: "
                f"{'--hosts ' + args.hosts if args.hosts else '--cluster ' + args.cluster} without it.")
        if args.nproc_per_node is not None:
            return self._start_per_node(args, command, cluster["worker"])
        # In a parameter-server cluster, ps and worker tasks serve; the chief runs the command.
        serves = "ps" in cluster and args.task_type in ("ps", "worker")
        task = Task(task_type=args.task_type, task_index=args.task_index, serves=serves)
        return launch(command, num_workers=args.workers, num_ps=args.ps, cluster=cluster, task=task,
                      grace_seconds=args.grace, max_restarts=args.max_restarts,
                      heartbeat_timeout=args.heartbeat_timeout)

    def _start_per_node(self, args, command, hosts):
        """``--hosts a:2222,b:2222 --nproc-per-node N --task-index K``: host K runs workers K·N to
        K·N+N-1 on its ports 2222 to 2222+N-1 (horovodrun's ``-H a:N,b:N``)."""
        from tfpar._checks import check_int

        if args.cluster or args.ps or args.task_type != "worker":
            raise ValueError("--nproc-per-node with a cluster takes --hosts (workers only). Received: "
                             f"--cluster/--ps/--task-type {args.task_type}. Write --hosts a:2222,b:2222 --nproc-per-node N.")
        n = args.nproc_per_node
        check_int("--nproc-per-node", n, 1)
        if not 0 <= args.task_index < len(hosts):
            raise ValueError(f"--task-index names this host in --hosts. Received: --task-index {args.task_index} "
                             f"with {len(hosts)} hosts. Use 0 to {len(hosts) - 1}.")
        workers = []
        for address in hosts:
            host, port = address.rsplit(":", 1)
            workers += [f"{host}:{int(port) + i}" for i in range(n)]
        tasks = _worker_tasks(args.task_index * n, _worker_envs(n))
        return launch(command, cluster={"worker": workers}, tasks=tasks, grace_seconds=args.grace,
                      max_restarts=args.max_restarts, heartbeat_timeout=args.heartbeat_timeout)


def _worker_envs(nproc_per_node):
    """This host's workers' device environments (`tfpar.launch.node.worker_envs`), its warning printed."""
    from tfpar.launch.node import worker_envs

    envs, warning = worker_envs(nproc_per_node)
    if warning:
        print(f"tfpar launch: {warning}", flush=True)
    return envs


def _worker_tasks(first_index, envs):
    """This host's worker tasks, numbered from ``first_index``, each with its environment."""
    from tfpar.launch.runner import task_env_pairs

    return [Task(task_type="worker", task_index=first_index + i, env=task_env_pairs(env)) for i, env in enumerate(envs)]


class Elastic(Backend):
    """``--min-workers``/``--max-workers``/``--host-discovery-script``/``--host-discovery-file``: a local job
    whose workers may change (`tfpar.launch.elastic`)."""

    name = "elastic"

    def chosen(self, args: Namespace) -> bool:
        return any(v is not None for v in (args.min_workers, args.max_workers, args.host_discovery_script,
                                           args.host_discovery_file))

    def check(self, args: Namespace, command: list[str]) -> None:
        from tfpar.launch.elastic.discovery import Discovery
        from tfpar.launch.elastic.membership import Membership

        for flag, given in (("--task-index", args.task_index is not None), ("--hosts", args.hosts),
                            ("--cluster", args.cluster), ("--nnodes", args.nnodes is not None), ("--slurm", args.slurm),
                            ("--horovod", args.horovod), ("--ps", args.ps), ("--nproc-per-node", args.nproc_per_node)):
            if given:
                raise ValueError(
                    f"An elastic job (--min-workers, --max-workers, --host-discovery-*) is a local job that tfpar "
                    f"launch supervises and restarts. Received: {flag} with it, a job it does not supervise that way. "
                    "Drop the elastic options; for an elastic job across hosts run tfpar launch --nnodes MIN:MAX "
                    "--master-addr HOST on each, or Horovod's elastic mode (horovodrun --min-np/--max-np "
                    "--host-discovery-script).")
        if args.workers is not None and args.max_workers is not None:
            raise ValueError(f"Give -n or --max-workers, not both. Received: -n {args.workers} --max-workers "
                             f"{args.max_workers}. In an elastic job -n is the most workers it trains with.")
        most = args.max_workers if args.max_workers is not None else args.workers
        if most is None and args.host_discovery_script is None and args.host_discovery_file is None:
            raise ValueError("An elastic job needs its most workers or a host discovery. Received: neither -n, "
                             "--max-workers nor --host-discovery-script/--host-discovery-file. Write e.g. "
                             "`tfpar launch --min-workers 2 --max-workers 4 -- python train.py`.")
        self.membership = Membership(args.min_workers or 1, most, args.max_restarts)
        self.discovery = Discovery(args.host_discovery_script, args.host_discovery_file, most or 1)
        self.discovery.hosts()  # its output checked now, before any worker starts
        check_number("elastic_timeout", args.elastic_timeout, above=0, hint=" (seconds to wait for --min-workers)")

    def start(self, args: Namespace, command: list[str]) -> int:
        from tfpar.launch.elastic.local import run_elastic
        from tfpar.launch.runner import LaunchOptions

        options = LaunchOptions(grace_seconds=args.grace, max_restarts=args.max_restarts,
                                heartbeat_timeout=args.heartbeat_timeout)
        return run_elastic(command, options, self.discovery, self.membership, args.elastic_timeout, args.elastic_batch)


class Local(Backend):
    """Every task of the job on 127.0.0.1: ``-n`` workers (and ``--ps`` servers with a chief)."""

    name = "local"

    def chosen(self, args: Namespace) -> bool:
        return True

    def check(self, args: Namespace, command: list[str]) -> None:
        if args.workers is None and args.nproc_per_node is None:
            raise ValueError(
                "Say how many local workers to start, or which cluster to join. "
                "Received: neither -n nor --hosts/--cluster. Write e.g. "
                "`tfpar launch -n 2 -- python train.py`.")

    def start(self, args: Namespace, command: list[str]) -> int:
        return launch(command, num_workers=args.workers, num_ps=args.ps, nproc_per_node=args.nproc_per_node,
                      grace_seconds=args.grace, max_restarts=args.max_restarts,
                      heartbeat_timeout=args.heartbeat_timeout)


BACKENDS = (Elastic(), Horovod(), Slurm(), Nodes(), Hosts(), Local())
"""The back-ends, in the order ``tfpar launch`` asks them: the first `chosen` runs the job."""


def backend_for(args: Namespace) -> Backend:
    """The back-end the command line ``args`` chose."""
    return next(backend for backend in BACKENDS if backend.chosen(args))
