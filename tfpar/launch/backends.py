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

from tfpar._checks import check_int, check_number
from tfpar._local.processes import run_command
from tfpar.launch.config import LaunchConfig
from tfpar.launch.runner import Task, launch, load_cluster_file
from tfpar.launch.supervisor import Supervisor

__all__ = ["BACKENDS", "Backend", "Elastic", "Horovod", "Hosts", "Local", "Nodes", "Slurm", "backend_for"]


class Backend:
    """How ``tfpar launch`` starts a job's tasks. Stateless: what a job needs is on its `LaunchConfig`."""

    name = ""

    def chosen(self, config: LaunchConfig) -> bool:
        """Whether the command line asks for this back-end."""
        raise NotImplementedError

    def check(self, config: LaunchConfig) -> None:
        """Raises ValueError, naming the option, for what this back-end cannot take."""

    def start(self, config: LaunchConfig) -> int:
        """Runs the job; returns its exit code (0) or raises `tfpar.launch.LaunchError`."""
        raise NotImplementedError

    def run(self, config: LaunchConfig) -> int:
        """`check`, then `start`."""
        self.check(config)
        return self.start(config)


class Horovod(Backend):
    """``horovodrun --gloo`` on this machine, which supervises the ranks; tfpar watches their
    heartbeats and merges Horovod's timeline into the job's."""

    name = "horovod"

    def chosen(self, config: LaunchConfig) -> bool:
        return config.horovod

    def check(self, config: LaunchConfig) -> None:
        if config.hosts or config.cluster:
            raise ValueError(
                "tfpar launch --horovod starts local ranks only. Received: --hosts/--cluster. "
                "On several machines run horovodrun -H host1:N,host2:N --gloo directly.")
        if config.ranks is None or config.ranks < 1:
            raise ValueError(f"tfpar launch --horovod needs -n N >= 1. Received: -n {config.ranks}.")
        if not config.command:
            raise ValueError("Nothing to launch. Received: an empty command.")
        check_number("heartbeat_timeout", config.heartbeat_timeout, above=0, allow_none=True,
                     hint=" (seconds a rank may make no step)")
        if shutil.which("horovodrun") is None:
            from tfpar.strategies.horovod import INSTALL_HINT

            raise ValueError(f"tfpar launch --horovod needs horovodrun, which is not on PATH. {INSTALL_HINT}")

    def start(self, config: LaunchConfig) -> int:
        n = str(config.ranks)
        horovodrun = shutil.which("horovodrun") or "horovodrun"
        argv = [horovodrun, "-np", n, "-H", f"localhost:{n}", "--gloo", *config.command]

        def say(message):
            print(f"tfpar launch: {message}", flush=True)

        with Supervisor(config.heartbeat_timeout, say) as supervisor:
            code = run_command(argv, env={**os.environ, **supervisor.task_env("rank-{rank}")},
                               grace_seconds=config.grace, check=supervisor.check)
            if code == 0:
                supervisor.finish("rank")
            return code


class Slurm(Backend):
    """This srun task's worker: the cluster from SLURM's variables, run as `Hosts` runs one task."""

    name = "slurm"

    def chosen(self, config: LaunchConfig) -> bool:
        return config.slurm and not (config.hosts and config.cluster)  # that mistake is Hosts' to name

    def check(self, config: LaunchConfig) -> None:
        given = [flag for flag, value in (("-n", config.workers), ("--hosts", config.hosts), ("--cluster", config.cluster),
                                          ("--task-index", config.task_index), ("--ps", config.ps or None),
                                          ("--max-restarts", config.max_restarts or None),
                                          ("--nproc-per-node", config.nproc_per_node), ("--nnodes", config.nnodes))
                 if value is not None]
        if given:
            raise ValueError(f"--slurm takes the cluster from SLURM. Received: --slurm with {', '.join(given)}. "
                             "Leave those out (srun starts one task per worker).")

    def start(self, config: LaunchConfig) -> int:
        from tfpar.cluster import ClusterInfo, slurm_gpu_env

        info = ClusterInfo.from_slurm()
        task = Task(task_type=info.task_type, task_index=info.task_index)
        return launch(list(config.command), cluster=info.cluster, task=task, env={**os.environ, **slurm_gpu_env()},
                      grace_seconds=config.grace, heartbeat_timeout=config.heartbeat_timeout)


class Nodes(Backend):
    """``--nnodes K --node-rank R --master-addr A``: K identical hosts, ``--nproc-per-node`` workers
    each, their addresses agreed through node 0 (`tfpar.launch.rendezvous.static`), as torchrun's users start a job.
    ``--nnodes MIN:MAX``: an elastic job on MIN to MAX hosts, the same line on each, no ``--node-rank``
    (`tfpar.launch.rendezvous.elastic`)."""

    name = "nodes"

    def chosen(self, config: LaunchConfig) -> bool:
        return config.nnodes is not None

    def check(self, config: LaunchConfig) -> None:
        elastic = config.elastic_nodes
        restarts = None if elastic else config.max_restarts or None
        given = [flag for flag, value in (("-n", config.workers), ("--hosts", config.hosts),
                                          ("--cluster", config.cluster), ("--task-index", config.task_index),
                                          ("--ps", config.ps or None), ("--max-restarts", restarts),
                                          ("--slurm", config.slurm or None))
                 if value is not None]
        if given:
            raise ValueError(f"--nnodes finds the cluster through node 0. Received: --nnodes with {', '.join(given)}. "
                             "Leave those out; each node runs --nproc-per-node workers.")
        if elastic:
            self._check_elastic(config)
        else:
            self._check_static(config)

    def _check_static(self, config):
        nodes = config.node_range[0]
        if config.node_rank is None or config.master_addr is None:
            raise ValueError(
                f"--nnodes {nodes} needs this node's --node-rank (0 to {nodes - 1}) and node 0's "
                f"--master-addr. Received: --node-rank {config.node_rank} --master-addr {config.master_addr}. Write "
                "e.g. tfpar launch --nnodes 2 --node-rank 0 --master-addr host0 --nproc-per-node 4 -- python train.py")
        check_int("--node-rank", config.node_rank, 0)
        if config.node_rank >= nodes:
            raise ValueError(f"--node-rank must be below --nnodes. Received: --node-rank {config.node_rank} with "
                             f"--nnodes {nodes}. Number the nodes 0 to {nodes - 1}.")
        check_int("--master-port", config.master_port, 1)
        check_number("--rendezvous-timeout", config.rendezvous_timeout, above=0)

    def _check_elastic(self, config):
        if config.node_rank is not None:
            raise ValueError(f"An elastic job (--nnodes {config.nnodes}) numbers its nodes at each restart, node 0 being "
                             f"the first on --master-addr. Received: --node-rank {config.node_rank}. Leave it out and "
                             "run the same line on every node.")
        if config.master_addr is None:
            raise ValueError(f"--nnodes {config.nnodes} needs the address of the host whose first node hosts the "
                             "rendezvous. Received: no --master-addr. Write e.g. tfpar launch --nnodes 1:4 "
                             "--master-addr host0 --nproc-per-node 4 -- python train.py, the same on every node.")
        check_int("--master-port", config.master_port, 1)
        check_int("--max-restarts", config.max_restarts, 0, " (a node's failures before it leaves the job)")
        check_number("--rendezvous-timeout", config.rendezvous_timeout, above=0)
        check_number("--elastic-timeout", config.elastic_timeout, above=0, hint=" (seconds to wait for MIN nodes)")

    def start(self, config: LaunchConfig) -> int:
        nproc = 1 if config.nproc_per_node is None else config.nproc_per_node
        envs = _worker_envs(nproc)  # refused before the rendezvous: too few GPUs
        if config.elastic_nodes:
            from tfpar.launch.elastic.agent import run_elastic_nodes

            assert config.master_addr is not None and config.node_range is not None  # check() saw to it
            return run_elastic_nodes(list(config.command), config.options(), master_addr=config.master_addr,
                                     master_port=config.master_port, nnodes=config.node_range, nproc=nproc,
                                     tasks_from=lambda first: _worker_tasks(first, envs),
                                     timeouts=(config.rendezvous_timeout, config.elastic_timeout),
                                     batch=config.elastic_batch)
        return self._start_static(config, envs)

    def _start_static(self, config, envs):
        from tfpar.launch.rendezvous.static import rendezvous

        nodes = config.node_range[0]
        cluster, indices = rendezvous(master_addr=config.master_addr, master_port=config.master_port, nnodes=nodes,
                                      node_rank=config.node_rank, nproc_per_node=len(envs),
                                      timeout=config.rendezvous_timeout)
        print(f"tfpar launch: node {config.node_rank} of {nodes}: workers {indices[0]} to {indices[-1]} of "
              f"{len(cluster['worker'])}", flush=True)
        tasks = _worker_tasks(indices[0], envs)
        return launch(list(config.command), cluster=cluster, tasks=tasks, grace_seconds=config.grace,
                      heartbeat_timeout=config.heartbeat_timeout)


class Hosts(Backend):
    """This machine's task of a cluster named by ``--hosts`` (workers) or ``--cluster`` (a file)."""

    name = "hosts"

    def chosen(self, config: LaunchConfig) -> bool:
        return bool(config.hosts or config.cluster)

    def check(self, config: LaunchConfig) -> None:
        if config.hosts and config.cluster:
            raise ValueError("Give --hosts or --cluster, not both.")

    def start(self, config: LaunchConfig) -> int:
        from tfpar.cluster import parse_hosts

        if config.hosts:
            cluster = {"worker": parse_hosts(config.hosts)}
            given = f"--hosts {config.hosts}"
        else:
            cluster = load_cluster_file(str(config.cluster))
            given = f"--cluster {config.cluster}"
        if config.task_index is None:
            raise ValueError(f"A multi-host job needs this machine's --task-index. Received: {given} without it.")
        if config.nproc_per_node is not None:
            return self._start_per_node(config, cluster["worker"])
        # In a parameter-server cluster, ps and worker tasks serve; the chief runs the command.
        serves = "ps" in cluster and config.task_type in ("ps", "worker")
        task = Task(task_type=config.task_type, task_index=config.task_index, serves=serves)
        return launch(list(config.command), num_workers=config.workers, num_ps=config.ps, cluster=cluster, task=task,
                      grace_seconds=config.grace, max_restarts=config.max_restarts,
                      heartbeat_timeout=config.heartbeat_timeout)

    def _start_per_node(self, config, hosts):
        """``--hosts a:2222,b:2222 --nproc-per-node N --task-index K``: host K runs workers K·N to
        K·N+N-1 on its ports 2222 to 2222+N-1 (horovodrun's ``-H a:N,b:N``)."""
        if config.cluster or config.ps or config.task_type != "worker":
            raise ValueError("--nproc-per-node with a cluster takes --hosts (workers only). Received: "
                             f"--cluster/--ps/--task-type {config.task_type}. Write --hosts a:2222,b:2222 --nproc-per-node N.")
        n = config.nproc_per_node
        check_int("--nproc-per-node", n, 1)
        if not 0 <= config.task_index < len(hosts):
            raise ValueError(f"--task-index names this host in --hosts. Received: --task-index {config.task_index} "
                             f"with {len(hosts)} hosts. Use 0 to {len(hosts) - 1}.")
        workers = []
        for address in hosts:
            host, port = address.rsplit(":", 1)
            workers += [f"{host}:{int(port) + i}" for i in range(n)]
        tasks = _worker_tasks(config.task_index * n, _worker_envs(n))
        return launch(list(config.command), cluster={"worker": workers}, tasks=tasks, grace_seconds=config.grace,
                      max_restarts=config.max_restarts, heartbeat_timeout=config.heartbeat_timeout)


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

    def chosen(self, config: LaunchConfig) -> bool:
        return config.elastic

    def check(self, config: LaunchConfig) -> None:
        for flag, given in (("--task-index", config.task_index is not None), ("--hosts", config.hosts),
                            ("--cluster", config.cluster), ("--nnodes", config.nnodes is not None),
                            ("--slurm", config.slurm), ("--horovod", config.horovod), ("--ps", config.ps),
                            ("--nproc-per-node", config.nproc_per_node)):
            if given:
                raise ValueError(
                    f"An elastic job (--min-workers, --max-workers, --host-discovery-*) is a local job that tfpar "
                    f"launch supervises and restarts. Received: {flag} with it, a job it does not supervise that way. "
                    "Drop the elastic options; for an elastic job across hosts run tfpar launch --nnodes MIN:MAX "
                    "--master-addr HOST on each, or Horovod's elastic mode (horovodrun --min-np/--max-np "
                    "--host-discovery-script).")
        if config.workers is not None and config.max_workers is not None:
            raise ValueError(f"Give -n or --max-workers, not both. Received: -n {config.workers} --max-workers "
                             f"{config.max_workers}. In an elastic job -n is the most workers it trains with.")
        if _most_workers(config) is None and config.host_discovery_script is None \
                and config.host_discovery_file is None:
            raise ValueError("An elastic job needs its most workers or a host discovery. Received: neither -n, "
                             "--max-workers nor --host-discovery-script/--host-discovery-file. Write e.g. "
                             "`tfpar launch --min-workers 2 --max-workers 4 -- python train.py`.")
        _membership(config)  # its options checked
        _discovery(config).hosts()  # its output checked now, before any worker starts
        check_number("elastic_timeout", config.elastic_timeout, above=0, hint=" (seconds to wait for --min-workers)")

    def start(self, config: LaunchConfig) -> int:
        from tfpar.launch.elastic.local import run_elastic

        return run_elastic(list(config.command), config.options(), _discovery(config), _membership(config),
                           config.elastic_timeout, config.elastic_batch)


def _most_workers(config):
    return config.max_workers if config.max_workers is not None else config.workers


def _membership(config):
    from tfpar.launch.elastic.membership import Membership

    return Membership(config.min_workers or 1, _most_workers(config), config.max_restarts)


def _discovery(config):
    from tfpar.launch.elastic.discovery import Discovery

    return Discovery(config.host_discovery_script, config.host_discovery_file, _most_workers(config) or 1)


class Local(Backend):
    """Every task of the job on 127.0.0.1: ``-n`` workers (and ``--ps`` servers with a chief)."""

    name = "local"

    def chosen(self, config: LaunchConfig) -> bool:
        return True

    def check(self, config: LaunchConfig) -> None:
        if config.workers is None and config.nproc_per_node is None:
            raise ValueError(
                "Say how many local workers to start, or which cluster to join. "
                "Received: neither -n nor --hosts/--cluster. Write e.g. "
                "`tfpar launch -n 2 -- python train.py`.")

    def start(self, config: LaunchConfig) -> int:
        return launch(list(config.command), num_workers=config.workers, num_ps=config.ps, nproc_per_node=config.nproc_per_node,
                      grace_seconds=config.grace, max_restarts=config.max_restarts,
                      heartbeat_timeout=config.heartbeat_timeout)


BACKENDS = (Elastic(), Horovod(), Slurm(), Nodes(), Hosts(), Local())
"""The back-ends, in the order ``tfpar launch`` asks them: the first `chosen` runs the job."""


def backend_for(config: LaunchConfig) -> Backend:
    """The back-end ``config`` chose."""
    return next(backend for backend in BACKENDS if backend.chosen(config))
