"""``tfpar launch --nnodes``: identical hosts agreeing on a cluster through node 0, or an elastic
job across hosts."""

from tfpar._checks import check_int, check_number
from tfpar.launch.api import launch
from tfpar.launch.backends.base import Backend, worker_envs, worker_tasks
from tfpar.launch.config import LaunchConfig

__all__ = ["Nodes"]


class Nodes(Backend):
    """``--nnodes K --node-rank R --master-addr A``: K identical hosts, ``--nproc-per-node`` workers
    each, their addresses agreed through node 0 (`tfpar.launch.rendezvous.static`), as torchrun's
    users start a job. ``--nnodes MIN:MAX``: an elastic job on MIN to MAX hosts, the same line on
    each, no ``--node-rank`` (`tfpar.launch.rendezvous.elastic`)."""

    name = "nodes"

    def chosen(self, config: LaunchConfig) -> bool:
        return config.nnodes is not None

    def check(self, config: LaunchConfig) -> None:
        elastic = config.elastic_nodes
        restarts = () if elastic else ("max_restarts",)
        given = config.given("workers", "hosts", "cluster", "task_index", "ps", *restarts, "slurm")
        if given:
            raise ValueError(
                "--nnodes finds the cluster through node 0. Received: --nnodes with "
                f"{', '.join(given)}. Leave those out; each node runs --nproc-per-node workers."
            )
        if elastic:
            self._check_elastic(config)
        else:
            self._check_static(config)

    def _check_static(self, config):
        nodes = config.node_range[0]
        if config.node_rank is None or config.master_addr is None:
            raise ValueError(
                f"--nnodes {nodes} needs this node's --node-rank (0 to {nodes - 1}) and node 0's "
                f"--master-addr. Received: --node-rank {config.node_rank} --master-addr "
                f"{config.master_addr}. Write e.g. tfpar launch --nnodes 2 --node-rank 0 "
                "--master-addr host0 --nproc-per-node 4 -- python train.py"
            )
        check_int("--node-rank", config.node_rank, 0)
        if config.node_rank >= nodes:
            raise ValueError(
                f"--node-rank must be below --nnodes. Received: --node-rank {config.node_rank} "
                f"with --nnodes {nodes}. Number the nodes 0 to {nodes - 1}."
            )
        check_int("--master-port", config.master_port, 1)
        check_number("--rendezvous-timeout", config.rendezvous_timeout, above=0)

    def _check_elastic(self, config):
        if config.node_rank is not None:
            raise ValueError(
                f"An elastic job (--nnodes {config.nnodes}) numbers its nodes at each restart, "
                "node 0 being the first on --master-addr. Received: --node-rank "
                f"{config.node_rank}. Leave it out and run the same line on every node."
            )
        if config.master_addr is None:
            raise ValueError(
                f"--nnodes {config.nnodes} needs the address of the host whose first node hosts "
                "the rendezvous. Received: no --master-addr. Write e.g. tfpar launch --nnodes 1:4 "
                "--master-addr host0 --nproc-per-node 4 -- python train.py, the same on every "
                "node."
            )
        check_int("--master-port", config.master_port, 1)
        check_int(
            "--max-restarts",
            config.max_restarts,
            0,
            " (a node's failures before it leaves the job)",
        )
        check_number("--rendezvous-timeout", config.rendezvous_timeout, above=0)
        check_number(
            "--elastic-timeout",
            config.elastic_timeout,
            above=0,
            hint=" (seconds to wait for MIN nodes)",
        )

    def start(self, config: LaunchConfig) -> int:
        nproc = 1 if config.nproc_per_node is None else config.nproc_per_node
        envs = worker_envs(nproc)  # refused before the rendezvous: too few GPUs
        if config.elastic_nodes:
            from tfpar.launch.elastic.agent import run_elastic_nodes

            # check() saw to it
            assert config.master_addr is not None and config.node_range is not None
            return run_elastic_nodes(
                list(config.command),
                config.options(),
                master_addr=config.master_addr,
                master_port=config.master_port,
                nnodes=config.node_range,
                nproc=nproc,
                tasks_from=lambda first: worker_tasks(first, envs),
                timeouts=(config.rendezvous_timeout, config.elastic_timeout),
                batch=config.elastic_batch,
            )
        return self._start_static(config, envs)

    def _start_static(self, config, envs):
        from tfpar.launch.rendezvous.static import rendezvous

        nodes = config.node_range[0]
        cluster, indices = rendezvous(
            master_addr=config.master_addr,
            master_port=config.master_port,
            nnodes=nodes,
            node_rank=config.node_rank,
            nproc_per_node=len(envs),
            timeout=config.rendezvous_timeout,
        )
        print(
            f"tfpar launch: node {config.node_rank} of {nodes}: workers {indices[0]} to "
            f"{indices[-1]} of {len(cluster['worker'])}",
            flush=True,
        )
        tasks = worker_tasks(indices[0], envs)
        return launch(
            list(config.command),
            cluster=cluster,
            tasks=tasks,
            grace_seconds=config.grace,
            heartbeat_timeout=config.heartbeat_timeout,
        )
