"""Cluster descriptions: TF_CONFIG read, validated and written, and the cluster of a SLURM job.

Pure Python, no TensorFlow import: the launcher and the strategies share it. The addresses of tasks
(``--hosts``, free ports, clusters on one host) are `tfpar.cluster.addresses`; SLURM's layout of
tasks is `tfpar.cluster.slurm`; their public names are exported here too.
"""

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from tfpar.cluster.addresses import (
    DEFAULT_PORT,
    free_ports,
    is_loopback_cluster,
    local_cluster,
    parse_hosts,
)
from tfpar.cluster.slurm import (
    expand_hostlist,
    slurm_gpu_env,
    slurm_port,
    slurm_workers,
    started_by_srun,
)

__all__ = [
    "ClusterInfo",
    "DEFAULT_PORT",
    "ROLES",
    "expand_hostlist",
    "free_ports",
    "is_loopback_cluster",
    "local_cluster",
    "parse_hosts",
    "refuse_evaluator",
    "slurm_gpu_env",
    "slurm_port",
    "started_by_srun",
    "validate_cluster",
]

ROLES = ("chief", "worker", "ps", "evaluator")
"""Task types a cluster may name, in TensorFlow's vocabulary."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClusterInfo:
    """A cluster and this process's task in it (the content of ``TF_CONFIG``)."""

    cluster: dict
    """Task type -> list of ``host:port`` addresses, e.g. ``{"worker": [...]}``."""
    task_type: str
    """This process's task type: ``"worker"``, ``"chief"``, ``"ps"``, ..."""
    task_index: int
    """This process's index among the tasks of ``task_type``."""

    def __post_init__(self):
        validate_cluster(self.cluster)
        if not isinstance(self.task_type, str) or self.task_type not in self.cluster:
            raise ValueError(
                f"The task type must be one the cluster names "
                f"({sorted(self.cluster)}). Received: task type "
                f'{self.task_type!r}. Fix the "task" entry of TF_CONFIG.'
            )
        size = len(self.cluster[self.task_type])
        if (
            isinstance(self.task_index, bool)
            or not isinstance(self.task_index, int)
            or not 0 <= self.task_index < size
        ):
            raise ValueError(
                f"The task index must be an int in [0, {size}) since the "
                f"cluster has {size} {self.task_type!r} task(s). Received: "
                f'task index {self.task_index!r}. Fix the "task" entry of '
                "TF_CONFIG (or --task-index)."
            )

    @property
    def num_workers(self):
        """Number of processes that train: chief plus workers."""
        return len(self.cluster.get("chief", ())) + len(self.cluster.get("worker", ()))

    @property
    def worker_index(self):
        """This task's rank among the training processes (chief first)."""
        if self.task_type == "chief":
            return 0
        return len(self.cluster.get("chief", ())) + self.task_index

    @property
    def is_chief(self):
        """Whether this task saves checkpoints and prints: the chief, else worker 0."""
        if "chief" in self.cluster:
            return self.task_type == "chief"
        return self.task_type == "worker" and self.task_index == 0

    @property
    def training_cluster(self):
        """The cluster without its evaluator tasks (a TFJob's Evaluator replica): they train
        nothing and take part in no collective, so the strategies never reach for them."""
        return {role: list(tasks) for role, tasks in self.cluster.items() if role != "evaluator"}

    @property
    def address(self):
        """This task's ``host:port``."""
        return self.cluster[self.task_type][self.task_index]

    def to_tf_config(self) -> str:
        """Returns the JSON string to put in ``TF_CONFIG``."""
        return json.dumps(
            {
                "cluster": self.cluster,
                "task": {"type": self.task_type, "index": self.task_index},
            }
        )

    @classmethod
    def from_tf_config(cls, raw: str | None = None) -> "ClusterInfo | None":
        """Parses ``TF_CONFIG`` (or ``raw``); returns None where it is unset or empty.

        Raises:
            ValueError: if it is not JSON, or its cluster or task is invalid.
        """
        if raw is None:
            raw = os.environ.get("TF_CONFIG", "")
        if not raw.strip():
            return None
        try:
            config = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"TF_CONFIG must be JSON ({e}). Received: TF_CONFIG={raw!r}. "
                'Expected e.g. {"cluster": {"worker": ["host:port", ...]}, '
                '"task": {"type": "worker", "index": 0}}.'
            ) from None
        if not isinstance(config, dict) or not config.get("cluster"):
            raise ValueError(
                'TF_CONFIG must be a JSON object with a "cluster" entry. '
                f"Received: TF_CONFIG={raw!r}."
            )
        task = config.get("task") or {}
        if not isinstance(task, dict) or "type" not in task:
            raise ValueError(
                'TF_CONFIG must name this process\'s task: "task": {"type": '
                f'"worker", "index": N}}. Received: TF_CONFIG={raw!r}.'
            )
        cluster = config["cluster"]
        validate_cluster(cluster)
        if (
            "index" not in task
            and len(cluster.get(task["type"], ()) if isinstance(task["type"], str) else ()) > 1
        ):
            # Without it every task of that type would be index 0: several chiefs, one address.
            raise ValueError(
                'TF_CONFIG must give this task\'s "index": the cluster has '
                f"{len(cluster[task['type']])} {task['type']!r} tasks. Received: "
                f'TF_CONFIG={raw!r}. Add e.g. "index": 1.'
            )
        return cls(cluster=cluster, task_type=task["type"], task_index=task.get("index", 0))

    @classmethod
    def from_slurm(
        cls, environ: Mapping[str, str] | None = None, port: int | None = None
    ) -> "ClusterInfo":
        """The cluster of a job started by ``srun``, one worker per SLURM task.

        Tasks are laid out over ``SLURM_JOB_NODELIST`` as SLURM's default (block) distribution
        places them: ``SLURM_TASKS_PER_NODE`` tasks on each node in turn (``"2(x3),1"``), or
        ``SLURM_NTASKS`` spread evenly. The task ``SLURM_PROCID`` is worker ``SLURM_PROCID``; the
        tasks of one node listen on consecutive ports from `slurm_port` (one per
        ``SLURM_LOCALID``), so that several tasks share a node.

        Args:
            environ: the variables to read (default: this process's environment).
            port: the first port on each node (default: derived from ``SLURM_JOB_ID``).

        Raises:
            ValueError: a variable is missing, cannot be parsed, or disagrees with the others
                (e.g. ``SLURM_NTASKS`` against the node list and tasks per node).
        """
        addresses, procid = slurm_workers(environ, port)
        return cls(cluster={"worker": addresses}, task_type="worker", task_index=procid)


def refuse_evaluator(info: "ClusterInfo", strategy: str) -> None:
    """Refuses to make ``strategy`` in an evaluator task (a TFJob's Evaluator replica), which
    trains nothing: it evaluates the chief's checkpoints beside the job."""
    if info.task_type == "evaluator":
        raise ValueError(
            f"{strategy} trains on the chief and workers; an evaluator task only evaluates, beside "
            f"the job. Received: TF_CONFIG task {{'type': 'evaluator', 'index': "
            f"{info.task_index}}}. In that task, build the model without a strategy and run "
            "keras.utils.SidecarEvaluator(model, data, checkpoint_dir=...).start() over the "
            "chief's checkpoints, or leave the Evaluator replica out of the TFJob."
        )


def validate_cluster(cluster: Any) -> None:
    """Refuses a cluster TensorFlow would fail on later, or run wrongly: each address once, a port
    in 1..65535, at most one chief and one evaluator, at least one training task."""
    example = 'e.g. {"worker": ["host1:2222", "host2:2222"]}'
    if not isinstance(cluster, dict) or not cluster:
        raise ValueError(
            "A cluster must be a non-empty dict of task type -> list of "
            f"'host:port'. Received: {cluster!r}. Write {example}."
        )
    seen: dict = {}
    for role, addresses in cluster.items():
        if not isinstance(role, str) or role not in ROLES:
            raise ValueError(
                f"Unknown task type {role!r} in the cluster. Received: "
                f"{cluster!r}. Task types are {list(ROLES)}."
            )
        if (
            not isinstance(addresses, list)
            or not addresses
            or not all(isinstance(a, str) for a in addresses)
        ):
            raise ValueError(
                f"Cluster entry {role!r} must be a non-empty list of 'host:port' "
                f"strings. Received: {role!r}: {addresses!r}. Write {example}."
            )
        for index, address in enumerate(addresses):
            host, colon, port = address.rpartition(":")
            if (
                not colon
                or not host.strip("[] ")
                or not port.isdigit()
                or not 1 <= int(port) <= 65535
            ):
                raise ValueError(
                    f"Each address must be 'host:port' with a port in 1..65535. Received: {role} "
                    f"{index} at {address!r}. Write e.g. 'host1:2222'."
                )
            if address in seen:
                raise ValueError(
                    f"Two tasks have one address: {seen[address]} and {role} {index} at "
                    f"{address!r}. Received: a cluster that names it twice. Give each task its own "
                    "host:port."
                )
            seen[address] = f"{role} {index}"
    for role in ("chief", "evaluator"):
        if len(cluster.get(role, ())) > 1:
            raise ValueError(
                f"A cluster has at most one {role}. Received: {len(cluster[role])} "
                f"({cluster[role]}). Make the others workers."
            )
    if not cluster.get("chief") and not cluster.get("worker"):
        raise ValueError(
            f"A cluster needs a chief or a worker to train. Received: {cluster!r}. Write {example}."
        )
