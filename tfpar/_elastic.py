"""Elastic local jobs: the workers a job may have, from Horovod's host discovery (a script or a file
printing ``host:slots`` lines), and which of them it has now. Pure Python: `tfpar.launch` runs the job.

A worker's place is a *slot* of a host ("localhost slot 1"). The job runs one worker per slot of the
hosts discovery lists, at most ``max_workers``, and needs ``min_workers``. A slot whose worker failed
more than ``max_restarts`` times is dropped while its host stays listed; a host that leaves the
list takes its slots with it, and brings them back, fresh, when it returns. Every host must be this
machine (`tfpar launch` starts local processes; across hosts, each host's agent of ``--nnodes MIN:MAX``
starts its own, `tfpar._elastic_rendezvous`).
"""

import dataclasses
import ipaddress
import json
import math
import os
import socket
import stat
import subprocess
from collections import Counter

from tfpar._checks import check_choice, check_int, check_number
from tfpar._task_env import BACKUP_MARK, ELASTIC_VARIABLE, FAULT_TOLERANCE_MARK, GROW_REQUEST

__all__ = ["DISCOVERY_PERIOD_SECONDS", "ELASTIC_BATCHES", "SCALING_RULES", "Discovery", "ElasticBatch", "GrowRequest",
           "Membership", "MembershipChange", "change_line", "parse_host_lines", "rule_factor"]

DISCOVERY_PERIOD_SECONDS = 1.0
"""How often a running elastic job asks discovery again (Horovod's period too)."""
SCRIPT_TIMEOUT_SECONDS = 30.0
"""How long a discovery script may take to answer."""


class MembershipChange(Exception):
    """Raised inside the launcher to stop a running job whose workers must change."""


def parse_host_lines(text: str, source: str) -> dict[str, int]:
    """``{host: slots}`` from discovery output: one ``host`` or ``host:slots`` a line (blank lines and
    ``#`` comments skipped; a host listed twice adds its slots).

    Raises:
        ValueError: a line that is not ``host[:slots]`` with slots an int >= 1, naming ``source``.
    """
    hosts: Counter = Counter()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        host, _, slots = line.rpartition(":") if ":" in line and not line.endswith("]") else (line, "", "1")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]  # [::1]:2
        if not host or any(c.isspace() for c in host) or not slots.isdigit() or int(slots) < 1:
            raise ValueError(
                f"{source} printed line {number} that is not host:slots. Received: {raw!r}. Each line names a "
                "host and how many workers it takes, as Horovod's host discovery does: e.g. 'localhost:2'.")
        hosts[host] += int(slots)
    return dict(hosts)


def _this_machine(host):
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host in ("localhost", socket.gethostname(), socket.getfqdn())


@dataclasses.dataclass(frozen=True)
class Discovery:
    """Where the hosts come from: ``script`` (run; its output read) or ``file`` (read), or neither (then
    ``fixed`` slots on this machine)."""

    script: str | None = None
    file: str | None = None
    fixed: int = 1

    def __post_init__(self):
        if self.script is not None and self.file is not None:
            raise ValueError(
                "Give a host discovery script or a file, not both. Received: --host-discovery-script "
                f"{self.script} and --host-discovery-file {self.file}.")
        if self.script is not None:
            if not os.path.isfile(self.script):
                raise ValueError(f"The host discovery script does not exist. Received: --host-discovery-script "
                                 f"{self.script}. Give the path of an executable that prints host:slots lines.")
            if not os.stat(self.script).st_mode & (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH) or \
                    not os.access(self.script, os.X_OK):
                raise ValueError(f"The host discovery script is not executable. Received: --host-discovery-script "
                                 f"{self.script}. Run `chmod +x {self.script}` (Horovod needs it executable too).")
        if self.file is not None and not os.path.isfile(self.file):
            raise ValueError(f"The host discovery file does not exist. Received: --host-discovery-file {self.file}. "
                             "Give a file of host:slots lines (it is read again while the job runs).")

    @property
    def source(self):
        """How messages name it."""
        if self.script is not None:
            return f"the host discovery script {self.script}"
        return f"the host discovery file {self.file}" if self.file is not None else "this machine"

    def hosts(self) -> dict[str, int]:
        """``{host: slots}`` now.

        Raises:
            ValueError: output that does not parse, a script that fails, or a host that is not this machine.
        """
        if self.script is None and self.file is None:
            return {"localhost": self.fixed}
        if self.script is not None:
            try:
                done = subprocess.run([os.path.abspath(self.script)], capture_output=True, text=True,
                                      timeout=SCRIPT_TIMEOUT_SECONDS, check=False)
            except subprocess.TimeoutExpired:
                raise ValueError(f"{self.source} did not answer within {SCRIPT_TIMEOUT_SECONDS:g} s.") from None
            if done.returncode:
                raise ValueError(f"{self.source} exited with code {done.returncode}: {done.stderr.strip()[-500:]}")
            text = done.stdout
        else:
            with open(str(self.file), encoding="utf-8") as f:
                text = f.read()
        hosts = parse_host_lines(text, self.source)
        others = [h for h in hosts if not _this_machine(h)]
        if others:
            raise ValueError(
                f"{self.source} lists hosts other than this machine: {others}. Received: {hosts}. An elastic "
                "tfpar launch starts its workers on this machine (name it localhost, 127.0.0.1 or its host name); "
                "across machines, run tfpar launch --nnodes MIN:MAX --master-addr HOST on each, or Horovod's elastic "
                "mode (horovodrun --host-discovery-script).")
        return hosts


class Membership:
    """Which slots the job has: the discovered ones, less those dropped, at most ``max_workers``."""

    def __init__(self, min_workers: int, max_workers: int | None, max_restarts: int) -> None:
        check_int("min_workers", min_workers, 1, " (the fewest workers the job trains with)")
        check_number("max_workers", max_workers, minimum=1, integer=True, allow_none=True,
                     hint=" (the most workers the job trains with)")
        if max_workers is not None and min_workers > max_workers:
            raise ValueError(f"min_workers must not exceed max_workers. Received: --min-workers {min_workers} "
                             f"--max-workers {max_workers}.")
        check_int("max_restarts", max_restarts, 0, " (failures of one worker's slot before it is dropped)")
        self.min_workers, self.max_workers, self.max_restarts = min_workers, max_workers, max_restarts
        self.failures: Counter = Counter()
        self.dropped: set = set()
        self.members: list = []
        """The slots of the running (or last) job, worker i on slot i."""
        self.largest = 0
        """The most workers the job has run with."""

    @property
    def reference(self) -> int:
        """The number of workers the global batch is divided for (`ElasticBatch`): ``max_workers``, else the
        most the job has run with."""
        return self.max_workers if self.max_workers is not None else max(self.largest, 1)

    def slots(self, hosts: dict[str, int]) -> list[str]:
        """The slots a job would have with ``hosts``; forgets the drops of hosts no longer listed."""
        listed = [f"{host} slot {i}" for host, count in hosts.items() for i in range(count)]
        self.dropped &= set(listed)
        self.failures = Counter({s: n for s, n in self.failures.items() if s in listed})
        usable = [s for s in listed if s not in self.dropped]
        return usable[:self.max_workers] if self.max_workers is not None else usable

    def failed(self, worker: int) -> str | None:
        """Counts a failure of worker ``worker``; returns a message if its slot is dropped for it."""
        slot = self.members[worker]
        self.failures[slot] += 1
        if self.failures[slot] > self.max_restarts:
            self.dropped.add(slot)
            return (f"{slot} dropped: its worker failed {self.failures[slot]} time(s), more than --max-restarts "
                    f"{self.max_restarts}")
        return None

    def change(self, slots: list[str]) -> str | None:
        """Adopts ``slots``; returns the line that says who left and joined, or None if the same."""
        before, self.members = self.members, list(slots)
        self.largest = max(self.largest, len(slots))
        return change_line(before, slots, len(slots))


def change_line(before: list, after: list, world_size: int, unit: str = "workers") -> str | None:
    """The line that says a job's members went from ``before`` to ``after`` (``unit``: what they are), who left
    and joined, and the new world size; None if they are the same."""
    if before == after:
        return None
    left = [s for s in before if s not in after]
    joined = [s for s in after if s not in before]
    parts = [f"left: {', '.join(left)}"] if left else []
    parts += [f"joined: {', '.join(joined)}"] if joined and before else []
    return (f"{unit} {len(before)} -> {len(after)}" if before else f"{len(after)} {unit.rstrip('s')}(s)") + \
        (f" ({'; '.join(parts)})" if parts else "") + f"; world size {world_size}"


class GrowRequest:
    """An elastic launch's request to FaultTolerance's chief, whose launch folder is ``state``, for a backup to grow
    the job from (`GROW_REQUEST`): after its next backup the chief marks it (`BACKUP_MARK`) and waits to be
    stopped. Made with none standing; ``say`` prints the launcher's lines."""

    def __init__(self, state: str, say) -> None:
        self.state, self.say = state, say
        self.requested: float | None = None
        """The request's time, once written."""
        self.said_no_backup = False
        self.withdraw()

    def ask(self, what: str) -> None:
        """Asks for the backup, once, saying ``what`` came; a command that makes no FaultTolerance backup is not
        asked (a restart would start training over), which is said once."""
        if self.requested is not None:
            return
        if not os.path.exists(os.path.join(self.state, FAULT_TOLERANCE_MARK)):
            if not self.said_no_backup:
                self.say("not growing: the command makes no tfpar.callbacks.FaultTolerance backup, so a restart "
                         "would start training over")
                self.said_no_backup = True
            return
        request = os.path.join(self.state, GROW_REQUEST)
        with open(request, "w"):
            pass
        self.requested = os.path.getmtime(request)
        self.say(f"{what}; growing the job after its next backup")

    def backed_up(self) -> bool:
        """Whether the chief has marked a backup since the request (False with none standing)."""
        mark = os.path.join(self.state, BACKUP_MARK)
        return self.requested is not None and os.path.exists(mark) and os.path.getmtime(mark) >= self.requested

    def withdraw(self) -> None:
        """Removes the request: the chief stops waiting."""
        try:
            os.remove(os.path.join(self.state, GROW_REQUEST))
        except FileNotFoundError:
            pass
        self.requested = None


SCALING_RULES = ("linear", "sqrt")
"""How the learning rate follows the global batch: ``linear`` (Goyal et al. 2017: k times the batch,
k times the rate, with a warm-up) or ``sqrt`` (Krizhevsky 2014, Hoffer et al. 2017: sqrt(k) times the
rate, which keeps the noise of the update; LAMB's paper scales that way). `tfpar.callbacks` exports it."""


def rule_factor(ratio: float, rule: str) -> float:
    """What a learning rate is multiplied by when the global batch is multiplied by ``ratio``, by ``rule``
    (one of `SCALING_RULES`): the one formula behind `tfpar.callbacks.scaled_learning_rate` and
    `ElasticBatch.learning_rate_factor`."""
    return ratio if rule == "linear" else math.sqrt(ratio)


ELASTIC_BATCHES = ("accumulate", "grow", "scale-lr", "scale-lr-sqrt")
"""How an elastic job on fewer workers than its reference trains: "accumulate" (the default) keeps the global
batch, each replica computing its batch in micro-batches no larger than the reference's per-replica batch and
applying their accumulated gradients once (DeepSpeed's elasticity keeps its micro-batch so too); "grow" keeps it
with larger per-replica batches; "scale-lr" keeps the per-replica batch, so the global batch follows the
workers, and scales the learning rate with it by the linear rule (Goyal et al. 2017), "scale-lr-sqrt" by the
square root (`SCALING_RULES`)."""


@dataclasses.dataclass(frozen=True)
class ElasticBatch:
    """What an elastic launch tells its workers (`ELASTIC_VARIABLE`): the global batch is divided for
    ``reference_workers``; the job trains on ``min_workers`` or more."""

    reference_workers: int
    min_workers: int
    batch: str = "accumulate"

    def __post_init__(self):
        check_int("reference_workers", self.reference_workers, 1)
        check_int("min_workers", self.min_workers, 1)
        check_choice("elastic_batch", self.batch, ELASTIC_BATCHES)

    @property
    def scales_learning_rate(self) -> bool:
        """Whether the global batch follows the workers and the learning rate with it ("scale-lr")."""
        return self.learning_rate_rule is not None

    def microbatches(self, workers: int) -> int:
        """The micro-batches each replica's batch is computed in on ``workers`` workers: the fewest that keep
        a micro-batch within the reference's per-replica batch (1 at the reference size or above, or unless
        "accumulate")."""
        if self.batch != "accumulate" or workers >= self.reference_workers:
            return 1
        return math.ceil(self.reference_workers / workers)

    def global_batch(self, given: int, workers: int) -> int:
        """The global batch a step holds on ``workers`` workers, ``given`` the one set for the reference: the
        same, or under "scale-lr" the reference's per-replica batch on each replica (``given * workers /
        reference``; `check_global_batch` makes it whole)."""
        return given * workers // self.reference_workers if self.scales_learning_rate else given

    @property
    def learning_rate_rule(self) -> str | None:
        """The scaling rule of "scale-lr" ("linear") or "scale-lr-sqrt" ("sqrt"); None otherwise."""
        return {"scale-lr": "linear", "scale-lr-sqrt": "sqrt"}.get(self.batch)

    def learning_rate_factor(self, workers: int) -> float:
        """What the learning rate is multiplied by on ``workers`` workers: 1, or under "scale-lr" the scaling
        rule's factor for a global batch ``workers / reference`` times the reference's."""
        rule = self.learning_rate_rule
        return 1.0 if rule is None else rule_factor(workers / self.reference_workers, rule)

    def check_global_batch(self, global_batch_size: int, replicas_per_worker: int) -> None:
        """Refuses a global batch that one of the job's sizes (``min_workers`` to ``reference_workers``) cannot
        divide into its replicas' micro-batches (under "scale-lr": that the reference cannot divide, since each
        size keeps its per-replica batch): that resize would fail when it happens, so it fails now.

        Raises:
            ValueError: naming the sizes, the global batch to use instead and the other fixes.
        """
        sizes = range(self.min_workers, max(self.min_workers, self.reference_workers) + 1)
        if self.scales_learning_rate:  # each size takes the reference's per-replica batch
            parts = {w: self.reference_workers * replicas_per_worker for w in sizes}
        else:
            parts = {w: w * replicas_per_worker * self.microbatches(w) for w in sizes}
        bad = [w for w, p in parts.items() if global_batch_size % p]
        if not bad:
            return
        multiple = math.lcm(*parts.values())
        fit = max(multiple, round(global_batch_size / multiple) * multiple)
        if self.scales_learning_rate:
            how = f"{self.reference_workers} workers x {replicas_per_worker} replica(s), each size keeping that per-replica batch"
        else:
            how = " x ".join(["workers", f"{replicas_per_worker} replica(s)"] + (["micro-batches"] if self.batch == "accumulate" else []))
        raise ValueError(
            f"This elastic job trains on {self.min_workers} to {self.reference_workers} workers, and its global "
            f"batch does not divide into equal parts ({how}) on {', '.join(f'{w} ({parts[w]} parts)' for w in bad)}"
            f" worker(s): a resize there would fail. Received: global_batch_size={global_batch_size}. Use a "
            f"multiple of {multiple} (e.g. {fit}), or narrow --min-workers/--max-workers.")

    def to_env(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_env(cls, environ=None) -> "ElasticBatch | None":
        """The setting of this worker's elastic launch, or None outside one."""
        text = (os.environ if environ is None else environ).get(ELASTIC_VARIABLE)
        return cls(**json.loads(text)) if text else None
