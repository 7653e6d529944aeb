"""Cluster descriptions: TF_CONFIG parsing and validation, loopback clusters.

Pure Python, no TensorFlow import: the launcher and the strategies share it.
"""

import dataclasses
import itertools
import json
import os
import re
import socket

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
    def training_cluster(self):
        """The cluster without its evaluator tasks (a TFJob's Evaluator replica): they train
        nothing and take part in no collective, so the strategies never reach for them."""
        return {role: list(tasks) for role, tasks in self.cluster.items() if role != "evaluator"}

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


    @classmethod
    def from_slurm(cls, environ=None, port=None):
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
        env = os.environ if environ is None else environ
        missing = [name for name in ("SLURM_JOB_NODELIST", "SLURM_NTASKS", "SLURM_PROCID")
                   if not env.get(name)]
        if missing:
            raise ValueError(
                f"A SLURM cluster needs {', '.join(missing)}, which srun sets for each task. Received: "
                f"{', '.join(f'{name}={env.get(name)!r}' for name in missing)}. Start the job with srun "
                "(e.g. srun --ntasks-per-node=1 tfpar launch --slurm -- python train.py).")
        nodes = expand_hostlist(env["SLURM_JOB_NODELIST"])
        ntasks = _slurm_int(env, "SLURM_NTASKS", 1)
        procid = _slurm_int(env, "SLURM_PROCID", 0)
        if procid >= ntasks:
            raise ValueError(f"SLURM_PROCID must be below SLURM_NTASKS. Received: SLURM_PROCID={procid}, "
                             f"SLURM_NTASKS={ntasks}.")
        per_node = _tasks_per_node(env, nodes, ntasks)
        base = slurm_port(env) if port is None else port
        addresses, node_of = [], []
        for node, count in zip(nodes, per_node):
            for local in range(count):
                addresses.append(f"{node}:{base + local}")
                node_of.append((node, local))
        node, local = node_of[procid]
        checks = {"SLURM_LOCALID": local, "SLURM_NODEID": nodes.index(node)}
        for name, expected in checks.items():
            if name in env and _slurm_int(env, name, 0) != expected:
                raise ValueError(
                    f"{name}={env[name]} disagrees with the layout of SLURM_JOB_NODELIST="
                    f"{env['SLURM_JOB_NODELIST']!r} and SLURM_TASKS_PER_NODE="
                    f"{env.get('SLURM_TASKS_PER_NODE')!r}, which put task {procid} on {node} as "
                    f"local task {local} ({name}={expected}). tfpar expects SLURM's default block "
                    "distribution: leave out --distribution, or set TF_CONFIG yourself.")
        return cls(cluster={"worker": addresses}, task_type="worker", task_index=procid)


def started_by_srun(environ=None):
    """Whether this process is a task of a SLURM job step (srun sets ``SLURM_STEP_ID``), not the
    batch script itself."""
    env = os.environ if environ is None else environ
    return bool(env.get("SLURM_PROCID") and (env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")))


def slurm_gpu_env(environ=None):
    """``{"CUDA_VISIBLE_DEVICES": ...}`` giving a SLURM task its own GPU, or ``{}``.

    When a node runs several tasks and SLURM made the same GPUs visible to each
    (``--gres=gpu:N`` without ``--gpus-per-task``), task ``SLURM_LOCALID`` takes the
    GPU at that place in the list; with one GPU listed, or none, nothing changes.
    """
    env = os.environ if environ is None else environ
    visible = [g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    if len(visible) < 2 or not env.get("SLURM_LOCALID", "").isdigit():
        return {}
    local = int(env["SLURM_LOCALID"])
    if local >= len(visible):
        raise ValueError(
            f"SLURM_LOCALID={local} has no GPU of its own: CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']!r} "
            f"lists {len(visible)}. Received: more tasks on the node than GPUs. Ask for as many "
            "tasks per node as GPUs (--ntasks-per-node, --gpus-per-task=1).")
    return {"CUDA_VISIBLE_DEVICES": visible[local].strip()}


def slurm_port(environ=None):
    """The first port of a SLURM job's tasks on each node: 20000 + (``SLURM_JOB_ID`` mod 20000),
    so that two jobs sharing a node use other ports; ``TFPAR_SLURM_PORT`` overrides it."""
    env = os.environ if environ is None else environ
    if env.get("TFPAR_SLURM_PORT"):
        return _slurm_int(env, "TFPAR_SLURM_PORT", 1)
    return 20000 + _slurm_int(env, "SLURM_JOB_ID", 0) % 20000


def _slurm_int(env, name, minimum):
    value = env.get(name, "")
    if not value.strip().isdigit() or int(value) < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}. Received: {name}={value!r}.")
    return int(value)


_COUNTS = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def _tasks_per_node(env, nodes, ntasks):
    """Tasks on each node: SLURM_TASKS_PER_NODE ("2(x3),1"), else SLURM_NTASKS spread evenly."""
    raw = env.get("SLURM_TASKS_PER_NODE") or env.get("SLURM_STEP_TASKS_PER_NODE")
    if raw:
        counts = []
        for part in raw.split(","):
            match = _COUNTS.match(part.strip())
            if not match:
                raise ValueError(f"SLURM_TASKS_PER_NODE must read like '2(x3),1'. Received: {raw!r}.")
            counts += [int(match.group(1))] * int(match.group(2) or 1)
    elif ntasks % len(nodes) == 0:
        counts = [ntasks // len(nodes)] * len(nodes)
    else:
        raise ValueError(
            f"SLURM_NTASKS={ntasks} does not spread evenly over the {len(nodes)} nodes of "
            f"SLURM_JOB_NODELIST={env['SLURM_JOB_NODELIST']!r}, and SLURM_TASKS_PER_NODE is unset. "
            "Set it (srun does), or use --ntasks-per-node.")
    if len(counts) != len(nodes) or sum(counts) != ntasks:
        raise ValueError(
            f"SLURM_NTASKS={ntasks} disagrees with the node list: SLURM_JOB_NODELIST="
            f"{env['SLURM_JOB_NODELIST']!r} has {len(nodes)} node(s) and SLURM_TASKS_PER_NODE="
            f"{raw!r} places {sum(counts)} task(s) on {len(counts)} node(s). Use the variables "
            "of one srun step.")
    return counts


_HOSTLIST_ITEM = re.compile(r"([^\[\],]*)(?:\[([^\]]*)\])?")


def expand_hostlist(text):
    """Expands a SLURM host list: ``"node[01-03,07]"`` -> node01, node02, node03, node07;
    ``"a[1-2],b3"`` -> a1, a2, b3; several bracket groups multiply (``"r[1-2]n[1-2]"``).

    Raises:
        ValueError: an empty list, unbalanced brackets, or a range that is not ``lo-hi``, lo <= hi.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"The node list must name at least one node. Received: node list {text!r}.")
    names, item, depth = [], "", 0
    for char in text.strip() + ",":  # split on the commas outside brackets
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise ValueError(f"Cannot parse the node list: nested or unbalanced brackets. Received: node list "
                             f"{text!r}. Write it as SLURM does, e.g. 'node[01-03,07]' or 'a[1-2],b3'.")
        if char == "," and depth == 0:
            if not item:
                raise ValueError(f"Cannot parse the node list: an empty entry. Received: node list {text!r}.")
            names += _expand_item(item, text)
            item = ""
        else:
            item += char
    if depth:
        raise ValueError(f"Cannot parse the node list: a '[' is not closed. Received: node list {text!r}.")
    return names


def _expand_item(item, text):
    parts = []  # one list of alternatives per piece: a prefix, then each bracket's expansion
    position = 0
    while position < len(item):
        match = _HOSTLIST_ITEM.match(item, position)
        if match.end() == position:
            raise ValueError(f"Cannot parse the node list at {item[position:]!r}. Received: node list {text!r}.")
        prefix, ranges = match.group(1), match.group(2)
        parts.append([prefix])
        if ranges is not None:
            parts.append(_expand_ranges(ranges, text))
        position = match.end()
    return ["".join(choice) for choice in itertools.product(*parts)]


def _expand_ranges(ranges, text):
    out = []
    for piece in ranges.split(","):
        low, _, high = piece.strip().partition("-")
        high = high or low
        if not (low.isdigit() and high.isdigit()) or int(low) > int(high):
            raise ValueError(f"Cannot parse the node list: {piece!r} is not a number or a range lo-hi "
                             f"with lo <= hi. Received: node list {text!r}.")
        width = len(low) if low.startswith("0") else 0  # node[01-10]: keep the zero padding
        out += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
    return out


def refuse_evaluator(info, strategy):
    """Refuses to make ``strategy`` in an evaluator task (a TFJob's Evaluator replica), which
    trains nothing: it evaluates the chief's checkpoints beside the job."""
    if info.task_type == "evaluator":
        raise ValueError(
            f"{strategy} trains on the chief and workers; an evaluator task only evaluates, beside "
            f"the job. Received: TF_CONFIG task {{'type': 'evaluator', 'index': {info.task_index}}}. "
            "In that task, build the model without a strategy and run "
            "keras.utils.SidecarEvaluator(model, data, checkpoint_dir=...).start() over the chief's "
            "checkpoints, or leave the Evaluator replica out of the TFJob.")


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
