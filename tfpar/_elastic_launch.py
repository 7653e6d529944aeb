"""``tfpar launch --min-workers/--max-workers [--host-discovery-script|--host-discovery-file]``: a local
job that goes on when it loses workers and grows back when capacity returns, as torchrun's
``--nnodes MIN:MAX`` does: every change restarts all workers, on fresh ports, and
`tfpar.callbacks.FaultTolerance` resumes them from its last backup with the new world size
(`tfpar.data.distribute` re-deals the rest of the epoch over them, every example once).

- A worker that fails counts against its slot (`tfpar._elastic.Membership`); the job restarts with
  the slots it has, dropping one that failed more than ``--max-restarts`` times.
- A host that leaves discovery stops the job at once, which restarts without its workers. Discovery that
  fails or prints what does not parse while the job runs is said and asked again: the job goes on.
- New capacity is taken at the next backup: the launcher asks for it (`GROW_REQUEST`), FaultTolerance's
  chief marks it and waits to be stopped, so no step is trained twice (the last backup of training is
  not one: the job ends instead); a command that makes no backup is not grown (it would start over).
- The global batch: each worker is told the number of workers it was divided for (``--max-workers``, else
  the most the job has had) and ``--elastic-batch`` (`tfpar._elastic.ElasticBatch`), by which `DataParallel`
  computes each replica's batch in micro-batches on fewer workers.
- Fewer than ``--min-workers``: the launcher waits for discovery to list enough, up to
  ``elastic_timeout`` seconds, then fails.

Across hosts (``--nnodes MIN:MAX``), `run_elastic_nodes` is each host's agent: the rendezvous
(`tfpar._elastic_rendezvous`) decides the rounds, the agent runs its host's workers in each.

Pure Python, as the rest of the launcher.
"""

import dataclasses
import itertools
import os
import socket
import tempfile
import time

from tfpar._elastic import DISCOVERY_PERIOD_SECONDS, Discovery, ElasticBatch, GrowRequest, Membership, MembershipChange
from tfpar._processes import LaunchError
from tfpar._task_env import ELASTIC_VARIABLE, RESTART_VARIABLE, STATE_VARIABLE
from tfpar.launch import LaunchOptions, _local_job, _run_tasks, warn_without_backup

__all__ = ["run_elastic"]


def run_elastic(command: list, options: LaunchOptions, discovery: Discovery, membership: Membership,
                elastic_timeout: float = 600.0, batch: str = "accumulate") -> int:
    """Runs ``command`` as an elastic local job until it succeeds; returns 0. ``batch``: one of
    `tfpar._elastic.ELASTIC_BATCHES`.

    Raises:
        LaunchError: fewer than ``min_workers`` for ``elastic_timeout`` seconds (discovery that kept failing
            or printing what is not ``host:slots`` included), or interrupted.
    """
    start, warned = time.monotonic(), False
    with tempfile.TemporaryDirectory(prefix="tfpar-launch-") as state:
        for attempt in itertools.count():
            slots = _enough_slots(discovery, membership, elastic_timeout, options)
            change = membership.change(slots)
            if change:
                options.say(f"{change} at {time.monotonic() - start:.1f} s")
            cluster, tasks = _local_job({"worker": len(slots)})
            watch = _Watch(discovery, membership, state, options)
            told = ElasticBatch(membership.reference, membership.min_workers, batch)
            run = dataclasses.replace(options, watch=watch, env={
                **(options.env or {}), RESTART_VARIABLE: str(attempt), STATE_VARIABLE: state,
                ELASTIC_VARIABLE: told.to_env()})
            try:
                return _run_tasks(command, cluster, tasks, run)
            except MembershipChange as reason:
                options.say(f"{reason}; restarting the workers")
            except LaunchError as error:
                if error.task is None:  # interrupted
                    raise
                dropped = membership.failed(error.task.task_index)
                options.say(f"{error}" + (f"; {dropped}" if dropped else "; restarting the workers"))
                warned = warned or warn_without_backup(state, options)
    raise AssertionError("itertools.count() ended")


def _enough_slots(discovery, membership, elastic_timeout, options):
    """The slots to run on, once there are at least ``min_workers`` (waiting up to ``elastic_timeout``)."""
    deadline, said, error = time.monotonic() + elastic_timeout, False, None
    while True:
        try:
            slots, error = membership.slots(discovery.hosts()), None
        except ValueError as failed:  # caught half-written, or failing once: asked again until the deadline
            slots, error = [], failed
        if len(slots) >= membership.min_workers:
            return slots
        if time.monotonic() >= deadline:
            raise LaunchError(
                f"{len(slots)} worker slot(s) for {elastic_timeout:g} s, fewer than --min-workers "
                f"{membership.min_workers}: {error or discovery.source + ' lists too few'} (or their workers "
                "failed too often)")
        if not said:
            options.say(f"{len(slots)} worker slot(s), fewer than --min-workers {membership.min_workers}; "
                        f"waiting up to {elastic_timeout:g} s for {discovery.source} to list more")
            said = True
        time.sleep(DISCOVERY_PERIOD_SECONDS)


class _Watch:
    """Called at each look of the launcher at a running job. Every ``DISCOVERY_PERIOD_SECONDS`` it asks
    discovery: a member's host gone stops the job at once (MembershipChange); more slots ask
    FaultTolerance's chief for a backup to grow from (`GROW_REQUEST`), and the job is stopped as soon as
    that backup is marked."""

    def __init__(self, discovery, membership, state, options):
        self.discovery, self.membership, self.options = discovery, membership, options
        self.next_look = time.monotonic() + DISCOVERY_PERIOD_SECONDS
        self.grow = GrowRequest(state, options.say)  # a new job: nobody waits
        self.said_error = None

    def __call__(self):
        if self.grow.backed_up():
            raise MembershipChange(f"{self.more} more worker slot(s) and a backup to start them from")
        if time.monotonic() < self.next_look:
            return
        self.next_look = time.monotonic() + DISCOVERY_PERIOD_SECONDS
        members = self.membership.members
        try:
            hosts = self.discovery.hosts()
        except ValueError as error:  # a file caught half-written, a script that failed once: the job goes on
            if str(error) != self.said_error:
                self.options.say(f"{error}; the job goes on with its {len(members)} worker(s), asking again")
                self.said_error = str(error)
            return
        self.said_error = None
        slots = self.membership.slots(hosts)
        gone = [s for s in members if s not in slots]
        if gone:
            raise MembershipChange(f"{', '.join(gone)} left {self.discovery.source}")
        self.more = len(slots) - len(members)
        if self.more <= 0:
            self.grow.withdraw()
        else:
            self.grow.ask(f"{self.more} more worker slot(s) in {self.discovery.source}")


def run_elastic_nodes(command: list, options: LaunchOptions, *, master_addr: str, master_port: int,
                      nnodes: tuple, nproc: int, tasks_from, timeouts: tuple, batch: str = "accumulate") -> int:
    """This host's agent of an elastic job across hosts (``--nnodes MIN:MAX``, `tfpar._elastic_rendezvous`):
    hosts the rendezvous if it is the first agent on ``master_addr``, joins it, and runs this host's ``nproc``
    workers (``tasks_from(first_index)``) in each round it is given, until the job ends; returns 0.
    ``timeouts``: seconds to wait for ``MIN`` nodes before the first round and after.

    Raises:
        LaunchError: the job failed (its rendezvous names why: too few nodes, node 0 gone), or this node's
            workers failed more than ``max_restarts`` times, or it was interrupted.
        RendezvousError: the rendezvous could not be reached or refused this node.
    """
    from tfpar._addresses import free_ports
    from tfpar._elastic_rendezvous import NODE_TIMEOUT_SECONDS, Coordinator
    from tfpar._rendezvous import Link, RendezvousError, address, connect

    with tempfile.TemporaryDirectory(prefix="tfpar-launch-") as state:
        coordinator = Coordinator.host(master_addr, master_port, nnodes=nnodes, nproc=nproc, state=state, say=options.say,
                                       max_restarts=options.max_restarts, timeouts=timeouts)
        if coordinator is not None:
            options.say(f"hosting the rendezvous at {address(master_addr, master_port)}")
        link = None
        try:
            link = Link(connect(master_addr, master_port, time.monotonic() + timeouts[0], timeouts[0], lambda: None))
            host = link.sock.getsockname()[0]
            ports = free_ports(nproc, host)
            link.send({"hello": {"name": f"{socket.gethostname()}[{os.getpid()}]", "nnodes": list(nnodes),
                                 "nproc": nproc, "ports": ports, "token": coordinator and coordinator.token}})
            while True:
                message = _next(link, None, NODE_TIMEOUT_SECONDS)
                if "wait" in message:
                    options.say(message["wait"])
                    continue
                if "exit" in message:
                    return 0
                if "stop" in message or "renew" in message:  # (another node's failed after this one's were done;
                    ports = free_ports(nproc, host)                # a port another agent here picked too)
                    link.send({"ready": ports})
                    continue
                start = message["start"]
                cluster, first = start["cluster"], start["first"]
                if cluster["worker"][first] != address(host, ports[0]):  # node 0 saw this node through another address
                    raise RendezvousError(f"The rendezvous lists this node's first worker as {cluster['worker'][first]}, "
                                          f"not {address(host, ports[0])}: the nodes must reach node 0 without address "
                                          "translation.")
                options.say(f"round {start['round']}: node {start['node']} of {len(cluster['worker']) // nproc}: "
                            f"workers {first} to {first + nproc - 1} of {len(cluster['worker'])}")
                told = ElasticBatch(start["reference"], start["min_workers"], batch)
                run = dataclasses.replace(options, watch=lambda: _next(link, 0, NODE_TIMEOUT_SECONDS), env={
                    **(options.env or {}), RESTART_VARIABLE: str(start["round"]), STATE_VARIABLE: state,
                    ELASTIC_VARIABLE: told.to_env()})
                failed = None
                try:
                    _run_tasks(command, cluster, tasks_from(first), run)
                    link.send({"done": 1})
                    continue
                except MembershipChange as reason:
                    options.say(f"{reason}; stopped this node's workers")
                except LaunchError as error:
                    if error.task is None:  # interrupted, or the job ended elsewhere
                        link.send({"leave": str(error)})
                        raise
                    failed = str(error)
                    if coordinator is not None:
                        warn_without_backup(state, options)
                ports = free_ports(nproc, host)
                link.send({"ready": ports, "failed": failed})
        finally:
            if link is not None:
                link.close()
            if coordinator is not None:
                coordinator.close()


def _next(link, timeout, silence):
    """The rendezvous' next message (within ``timeout`` seconds; None: wait for it): {} if none yet; a stop
    raises MembershipChange, and how the job ended elsewhere LaunchError."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        message = link.receive(0.2 if deadline is None else max(0.0, deadline - time.monotonic()))
        if message is None:
            if link.closed or link.silent_for() > silence:
                raise LaunchError("the rendezvous is gone (node 0's agent or host stopped answering): the job ends")
            if deadline is not None and time.monotonic() >= deadline:
                return {}
            continue
        if "error" in message or "drop" in message:
            raise LaunchError(message.get("error") or f"this node leaves the job: {message['drop']}")
        if "stop" in message and timeout is not None:
            raise MembershipChange(message["stop"])
        return message
