"""SLURM's view of a job: its tasks' layout over the node list (SLURM's host-list grammar
included), their ports, and their GPUs. Pure Python: `tfpar.cluster` builds a cluster from it.
"""

import itertools
import os
import re
from collections.abc import Mapping

__all__ = ["expand_hostlist", "slurm_gpu_env", "slurm_port", "slurm_workers", "started_by_srun"]


def slurm_workers(
    environ: Mapping[str, str] | None = None, port: int | None = None
) -> tuple[list[str], int]:
    """``(addresses, index)``: the workers of a job started by ``srun``, one a SLURM task, and this
    task's place among them (`tfpar.cluster.ClusterInfo.from_slurm` says how they are laid out).

    Raises:
        ValueError: a variable is missing, cannot be parsed, or disagrees with the others.
    """
    env = os.environ if environ is None else environ
    missing = [
        name for name in ("SLURM_JOB_NODELIST", "SLURM_NTASKS", "SLURM_PROCID") if not env.get(name)
    ]
    if missing:
        raise ValueError(
            f"A SLURM cluster needs {', '.join(missing)}, which srun sets for each task. Received: "
            f"{', '.join(f'{name}={env.get(name)!r}' for name in missing)}. Start the job with "
            "srun (e.g. srun --ntasks-per-node=1 tfpar launch --slurm -- python train.py)."
        )
    nodes = expand_hostlist(env["SLURM_JOB_NODELIST"])
    ntasks = _slurm_int(env, "SLURM_NTASKS", 1)
    procid = _slurm_int(env, "SLURM_PROCID", 0)
    if procid >= ntasks:
        raise ValueError(
            f"SLURM_PROCID must be below SLURM_NTASKS. Received: SLURM_PROCID={procid}, "
            f"SLURM_NTASKS={ntasks}."
        )
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
                "distribution: leave out --distribution, or set TF_CONFIG yourself."
            )
    return addresses, procid


def started_by_srun(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process is a task of a SLURM job step (srun sets ``SLURM_STEP_ID``), not the
    batch script itself."""
    env = os.environ if environ is None else environ
    return bool(env.get("SLURM_PROCID") and (env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")))


def slurm_gpu_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
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
            f"SLURM_LOCALID={local} has no GPU of its own: "
            f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']!r} lists {len(visible)}. Received: "
            "more tasks on the node than GPUs. Ask for as many tasks per node as GPUs "
            "(--ntasks-per-node, --gpus-per-task=1)."
        )
    return {"CUDA_VISIBLE_DEVICES": visible[local].strip()}


def slurm_port(environ: Mapping[str, str] | None = None) -> int:
    """The first port of a SLURM job's tasks on each node: 20000 + (``SLURM_JOB_ID`` mod 12000),
    so that two jobs sharing a node use other ports, all below the range Linux hands out for
    outgoing connections (32768 and up), where another process could take one before its server
    binds it; ``TFPAR_SLURM_PORT`` overrides it."""
    env = os.environ if environ is None else environ
    if env.get("TFPAR_SLURM_PORT"):
        return _slurm_int(env, "TFPAR_SLURM_PORT", 1)
    return 20000 + _slurm_int(env, "SLURM_JOB_ID", 0) % 12000


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
                raise ValueError(
                    f"SLURM_TASKS_PER_NODE must read like '2(x3),1'. Received: {raw!r}."
                )
            counts += [int(match.group(1))] * int(match.group(2) or 1)
    elif ntasks % len(nodes) == 0:
        counts = [ntasks // len(nodes)] * len(nodes)
    else:
        raise ValueError(
            f"SLURM_NTASKS={ntasks} does not spread evenly over the {len(nodes)} nodes of "
            f"SLURM_JOB_NODELIST={env['SLURM_JOB_NODELIST']!r}, and SLURM_TASKS_PER_NODE is unset. "
            "Set it (srun does), or use --ntasks-per-node."
        )
    if len(counts) != len(nodes) or sum(counts) != ntasks:
        raise ValueError(
            f"SLURM_NTASKS={ntasks} disagrees with the node list: SLURM_JOB_NODELIST="
            f"{env['SLURM_JOB_NODELIST']!r} has {len(nodes)} node(s) and SLURM_TASKS_PER_NODE="
            f"{raw!r} places {sum(counts)} task(s) on {len(counts)} node(s). Use the variables "
            "of one srun step."
        )
    return counts


_HOSTLIST_ITEM = re.compile(r"([^\[\],]*)(?:\[([^\]]*)\])?")


def expand_hostlist(text: str) -> list[str]:
    """Expands a SLURM host list: ``"node[01-03,07]"`` -> node01, node02, node03, node07;
    ``"a[1-2],b3"`` -> a1, a2, b3; several bracket groups multiply (``"r[1-2]n[1-2]"``).

    Raises:
        ValueError: an empty list, unbalanced brackets, or a range that is not ``lo-hi``, lo <= hi.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError(
            f"The node list must name at least one node. Received: node list {text!r}."
        )
    names, item, depth = [], "", 0
    for char in text.strip() + ",":  # split on the commas outside brackets
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise ValueError(
                f"Cannot parse the node list: nested or unbalanced brackets. Received: node list "
                f"{text!r}. Write it as SLURM does, e.g. 'node[01-03,07]' or 'a[1-2],b3'."
            )
        if char == "," and depth == 0:
            if not item:
                raise ValueError(
                    f"Cannot parse the node list: an empty entry. Received: node list {text!r}."
                )
            names += _expand_item(item, text)
            item = ""
        else:
            item += char
    if depth:
        raise ValueError(
            f"Cannot parse the node list: a '[' is not closed. Received: node list {text!r}."
        )
    return names


def _expand_item(item, text):
    parts = []  # one list of alternatives per piece: a prefix, then each bracket's expansion
    position = 0
    while position < len(item):
        match = _HOSTLIST_ITEM.match(item, position)
        if match.end() == position:
            raise ValueError(
                f"Cannot parse the node list at {item[position:]!r}. Received: node list {text!r}."
            )
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
            raise ValueError(
                f"Cannot parse the node list: {piece!r} is not a number or a range lo-hi "
                f"with lo <= hi. Received: node list {text!r}."
            )
        width = len(low) if low.startswith("0") else 0  # node[01-10]: keep the zero padding
        out += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
    return out
