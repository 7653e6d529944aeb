"""Cluster descriptions: TF_CONFIG parsing and validation, loopback clusters.

Pure Python, no TensorFlow import: the launcher and the strategies share it.
"""

import dataclasses
import json
import os
import socket

__all__ = [
    "ClusterInfo",
    "DEFAULT_PORT",
    "ROLES",
    "free_ports",
    "is_loopback_cluster",
    "local_cluster",
    "parse_hosts",
    "validate_cluster",
]

ROLES = ("chief", "worker", "ps", "evaluator")
"""Task types a cluster may name, in TensorFlow's vocabulary."""

DEFAULT_PORT = 2222
"""Port used for a host given without one (``--hosts a,b``)."""


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
                f"{self.task_type!r}. Fix the \"task\" entry of TF_CONFIG."
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
                f"task index {self.task_index!r}. Fix the \"task\" entry of "
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
    def address(self):
        """This task's ``host:port``."""
        return self.cluster[self.task_type][self.task_index]

    def to_tf_config(self):
        """Returns the JSON string to put in ``TF_CONFIG``."""
        return json.dumps(
            {
                "cluster": self.cluster,
                "task": {"type": self.task_type, "index": self.task_index},
            }
        )

    @classmethod
    def from_tf_config(cls, raw=None):
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
        if "index" not in task and len(cluster.get(task["type"], ()) if isinstance(task["type"], str) else ()) > 1:
            # Without it every task of that type would be index 0: several chiefs, one address.
            raise ValueError(
                f'TF_CONFIG must give this task\'s "index": the cluster has {len(cluster[task["type"]])} '
                f'{task["type"]!r} tasks. Received: TF_CONFIG={raw!r}. Add e.g. "index": 1.')
        return cls(cluster=cluster, task_type=task["type"], task_index=task.get("index", 0))


def validate_cluster(cluster):
    """Refuses a cluster TensorFlow would fail on later, or run wrongly: each address once, a port
    in 1..65535, at most one chief and one evaluator, at least one training task."""
    example = 'e.g. {"worker": ["host1:2222", "host2:2222"]}'
    if not isinstance(cluster, dict) or not cluster:
        raise ValueError(
            "A cluster must be a non-empty dict of task type -> list of "
            f"'host:port'. Received: {cluster!r}. Write {example}."
        )
    seen = {}
    for role, addresses in cluster.items():
        if not isinstance(role, str) or role not in ROLES:
            raise ValueError(
                f"Unknown task type {role!r} in the cluster. Received: "
                f"{cluster!r}. Task types are {list(ROLES)}."
            )
        if not isinstance(addresses, list) or not addresses or not all(isinstance(a, str) for a in addresses):
            raise ValueError(
                f"Cluster entry {role!r} must be a non-empty list of 'host:port' "
                f"strings. Received: {role!r}: {addresses!r}. Write {example}."
            )
        for index, address in enumerate(addresses):
            host, colon, port = address.rpartition(":")
            if not colon or not host.strip("[] ") or not port.isdigit() or not 1 <= int(port) <= 65535:
                raise ValueError(
                    f"Each address must be 'host:port' with a port in 1..65535. Received: {role} "
                    f"{index} at {address!r}. Write e.g. 'host1:2222'.")
            if address in seen:
                raise ValueError(
                    f"Two tasks have one address: {seen[address]} and {role} {index} at {address!r}. "
                    "Received: a cluster that names it twice. Give each task its own host:port.")
            seen[address] = f"{role} {index}"
    for role in ("chief", "evaluator"):
        if len(cluster.get(role, ())) > 1:
            raise ValueError(
                f"A cluster has at most one {role}. Received: {len(cluster[role])} ({cluster[role]}). "
                f"Make the others workers.")
    if not cluster.get("chief") and not cluster.get("worker"):
        raise ValueError(f"A cluster needs a chief or a worker to train. Received: {cluster!r}. Write {example}.")


def free_ports(count, host="127.0.0.1"):
    """Returns ``count`` distinct TCP ports that are free on ``host`` now.

    The sockets are held open until all ports are chosen so that no port is
    returned twice; another program may still take one before it is used.
    """
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def local_cluster(roles, host="127.0.0.1"):
    """Builds a cluster on ``host`` with free ports.

    Args:
        roles: task type -> number of tasks, e.g. ``{"worker": 2}``.
        host: the address every task listens on (loopback by default).

    Returns:
        The cluster dict, e.g. ``{"worker": ["127.0.0.1:41234", ...]}``.
    """
    counts = {role: n for role, n in roles.items() if n}
    ports = iter(free_ports(sum(counts.values()), host))
    return {role: [f"{host}:{next(ports)}" for _ in range(n)] for role, n in counts.items()}


def is_loopback_cluster(cluster):
    """Whether every task of ``cluster`` has a loopback address (127.0.0.0/8, ::1 or localhost)."""
    import ipaddress

    for addresses in cluster.values():
        for address in addresses:
            host = address.rsplit(":", 1)[0].strip("[]")
            if host != "localhost":
                try:
                    if not ipaddress.ip_address(host).is_loopback:
                        return False
                except ValueError:  # a host name
                    return False
    return True


def parse_hosts(hosts, default_port=DEFAULT_PORT):
    """Parses ``"a:2222,b,c:2223"`` into ``["a:2222", "b:2222", "c:2223"]``.

    Raises:
        ValueError: if the list is empty or a port is not a number.
    """
    entries = [h.strip() for h in hosts.split(",") if h.strip()]
    if not entries:
        raise ValueError(
            f"--hosts needs at least one host. Received: {hosts!r}. "
            "Write e.g. --hosts host1:2222,host2:2222."
        )
    out = []
    for entry in entries:
        host, _, port = entry.rpartition(":") if ":" in entry else (entry, "", "")
        port = port or str(default_port)
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(
                f"Each host must be 'name' or 'name:port' with a port in "
                f"1..65535. Received: {entry!r} in --hosts {hosts!r}."
            )
        out.append(f"{host}:{port}")
    return out
