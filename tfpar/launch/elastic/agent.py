"""``tfpar launch --nnodes MIN:MAX``: this host's agent of an elastic job across hosts. The
rendezvous (`tfpar.launch.rendezvous.elastic`) decides the rounds; the agent runs its host's
workers in each, restarting them when the membership changes. Pure Python."""

import dataclasses
import os
import socket
import tempfile
import time
from collections.abc import Callable

from tfpar._local.processes import LaunchError
from tfpar._tasks.elastic_batch import ElasticBatch
from tfpar._tasks.env import ELASTIC_VARIABLE, RESTART_VARIABLE, STATE_VARIABLE
from tfpar.cluster.addresses import free_ports
from tfpar.launch.elastic.membership import MembershipChange
from tfpar.launch.rendezvous.elastic import NODE_TIMEOUT_SECONDS
from tfpar.launch.rendezvous.protocol import (
    Done,
    Drop,
    Ended,
    Hello,
    Invalid,
    Leave,
    Link,
    Ready,
    Start,
    Stop,
    Wait,
)
from tfpar.launch.rendezvous.static import RendezvousError, address, connect
from tfpar.launch.runner import LaunchOptions, run_job, warn_without_backup

__all__ = ["run_elastic_nodes"]


def run_elastic_nodes(
    command: list,
    options: LaunchOptions,
    *,
    master_addr: str,
    master_port: int,
    nnodes: tuple,
    nproc: int,
    tasks_from: Callable,
    timeouts: tuple,
    batch: str = "accumulate",
) -> int:
    """This host's agent of an elastic job across hosts (``--nnodes MIN:MAX``,
    `tfpar.launch.rendezvous.elastic`): hosts the rendezvous if it is the first agent on
    ``master_addr``, joins it, and runs this host's ``nproc`` workers (``tasks_from(first_index)``)
    in each round it is given, until the job ends; returns 0.
    ``timeouts``: seconds to wait for ``MIN`` nodes before the first round and after.

    Raises:
        LaunchError: the job failed (its rendezvous names why: too few nodes, node 0 gone), or this
            node's workers failed more than ``max_restarts`` times, or it was interrupted.
        RendezvousError: the rendezvous could not be reached or refused this node.
    """
    from tfpar.launch.rendezvous.elastic import Coordinator

    with tempfile.TemporaryDirectory(prefix="tfpar-launch-") as state:
        coordinator = Coordinator.host(
            master_addr,
            master_port,
            nnodes=nnodes,
            nproc=nproc,
            state=state,
            say=options.say,
            max_restarts=options.max_restarts,
            timeouts=timeouts,
        )
        if coordinator is not None:
            options.say(f"hosting the rendezvous at {address(master_addr, master_port)}")
        deadline = time.monotonic() + timeouts[0]
        link = None
        try:
            link = Link(connect(master_addr, master_port, deadline, timeouts[0], lambda: None))
            token = coordinator.token if coordinator is not None else None
            job = _NodeJob(
                command, options, link, state, tasks_from, batch, hosting=token is not None
            )
            return job.run(nnodes, nproc, token)
        finally:
            if link is not None:
                link.close()
            if coordinator is not None:
                coordinator.close()


@dataclasses.dataclass
class _NodeJob:
    """This node's side of an elastic job: its hello, then each round's workers until the job
    ends."""

    command: list
    options: LaunchOptions
    link: Link
    state: str
    tasks_from: Callable
    batch: str
    hosting: bool

    def run(self, nnodes, nproc, token):
        """Says hello, then runs each round the rendezvous starts; 0 once the job ended well."""
        host = self.link.sock.getsockname()[0]
        ports = free_ports(nproc, host)
        name = f"{socket.gethostname()}[{os.getpid()}]"
        hello = Hello(name=name, nnodes=tuple(nnodes), nproc=nproc, ports=tuple(ports), token=token)
        self.link.send(hello)
        while True:
            message = _next(self.link, None, NODE_TIMEOUT_SECONDS)
            if message is _ENDED:
                return 0
            if isinstance(message, Wait):
                self.options.say(message.why)
                continue
            failed = None
            if isinstance(message, Start):  # else a stop or a renew: pick ports again
                _check_own_address(message, address(host, ports[0]))
                failed = self._round(message, nproc)
                if failed is _DONE:
                    continue
            ports = free_ports(nproc, host)
            self.link.send(Ready(tuple(ports), failed))

    def _round(self, start, nproc):
        """Runs this node's workers of round ``start``: `_DONE`, or why they failed (None:
        stopped)."""
        workers = len(start.cluster["worker"])
        self.options.say(
            f"round {start.round}: node {start.node} of {workers // nproc}: "
            f"workers {start.first} to {start.first + nproc - 1} of {workers}"
        )
        told = ElasticBatch(start.reference, start.min_workers, self.batch)
        env = {
            **(self.options.env or {}),
            RESTART_VARIABLE: str(start.round),
            STATE_VARIABLE: self.state,
            ELASTIC_VARIABLE: told.to_env(),
        }
        run = dataclasses.replace(self.options, watch=self._watch, env=env)
        try:
            run_job(self.command, start.cluster, self.tasks_from(start.first), run)
        except MembershipChange as reason:
            self.options.say(f"{reason}; stopped this node's workers")
            return None
        except LaunchError as error:
            if error.task is None:  # interrupted, or the job ended elsewhere
                self.link.send(Leave(str(error)))
                raise
            if self.hosting:
                warn_without_backup(self.state, self.options)
            return str(error)
        self.link.send(Done())
        return _DONE

    def _watch(self):
        """At each look of the running job: a stop from the rendezvous raises MembershipChange."""
        _next(self.link, 0, NODE_TIMEOUT_SECONDS)


def _check_own_address(start, own):
    """Refuses a round whose cluster lists this node's first worker at another address than its own
    (node 0 saw this node through address translation)."""
    listed = start.cluster["worker"][start.first]
    if listed != own:
        raise RendezvousError(
            f"The rendezvous lists this node's first worker as {listed}, not {own}: the nodes must "
            "reach node 0 without address translation."
        )


_DONE = object()
"""What `_NodeJob._round` returns when this node's workers all succeeded."""


_ENDED = object()
"""What `_next` returns when the job ended with every node's workers done."""


def _next(link, timeout, silence):
    """The rendezvous' next message (within ``timeout`` seconds; None: wait for it), or None if none
    came; a stop raises MembershipChange, a job that ended with an error or a drop LaunchError, and
    a job that ended well returns `_ENDED`."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        message = link.receive(0.2 if deadline is None else max(0.0, deadline - time.monotonic()))
        if message is None:
            if link.closed or link.silent_for() > silence:
                raise LaunchError(
                    "the rendezvous is gone (node 0's agent or host stopped answering): the job "
                    "ends"
                )
            if deadline is not None and time.monotonic() >= deadline:
                return None
            continue
        if isinstance(message, Ended):
            if message.error is not None:
                raise LaunchError(message.error)
            return _ENDED
        if isinstance(message, Drop):
            raise LaunchError(f"this node leaves the job: {message.why}")
        if isinstance(message, Invalid):
            raise LaunchError(
                f"the rendezvous sent what this agent cannot read ({message.why}): is every node "
                "running the same tfpar?"
            )
        if isinstance(message, Stop) and timeout is not None:
            raise MembershipChange(message.why)
        return message
