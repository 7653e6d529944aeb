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
from tfpar.launch.elastic.membership import MembershipChange
from tfpar.launch.runner import LaunchOptions, run_job, warn_without_backup

__all__ = ["run_elastic_nodes"]


def run_elastic_nodes(command: list, options: LaunchOptions, *, master_addr: str, master_port: int,
                      nnodes: tuple, nproc: int, tasks_from: Callable, timeouts: tuple, batch: str = "accumulate") -> int:
    """This host's agent of an elastic job across hosts (``--nnodes MIN:MAX``, `tfpar.launch.rendezvous.elastic`):
    hosts the rendezvous if it is the first agent on ``master_addr``, joins it, and runs this host's ``nproc``
    workers (``tasks_from(first_index)``) in each round it is given, until the job ends; returns 0.
    ``timeouts``: seconds to wait for ``MIN`` nodes before the first round and after.

    Raises:
        LaunchError: the job failed (its rendezvous names why: too few nodes, node 0 gone), or this node's
            workers failed more than ``max_restarts`` times, or it was interrupted.
        RendezvousError: the rendezvous could not be reached or refused this node.
    """
    from tfpar.cluster.addresses import free_ports
    from tfpar.launch.rendezvous.elastic import NODE_TIMEOUT_SECONDS, Coordinator
    from tfpar.launch.rendezvous.protocol import Done, Hello, Leave, Link, Ready, Start, Wait
    from tfpar.launch.rendezvous.static import RendezvousError, address, connect

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
            token = coordinator.token if coordinator is not None else None
            link.send(Hello(name=f"{socket.gethostname()}[{os.getpid()}]", nnodes=tuple(nnodes), nproc=nproc,
                            ports=tuple(ports), token=token))
            while True:
                start = _next(link, None, NODE_TIMEOUT_SECONDS)
                if isinstance(start, Wait):
                    options.say(start.why)
                    continue
                if start is _ENDED:
                    return 0
                if not isinstance(start, Start):  # a stop or a renew: another node's failed after this one's were
                    ports = free_ports(nproc, host)  # done, or a port another agent here picked too
                    link.send(Ready(tuple(ports)))
                    continue
                cluster = start.cluster
                first = start.first
                if cluster["worker"][first] != address(host, ports[0]):  # node 0 saw this node through another address
                    raise RendezvousError(f"The rendezvous lists this node's first worker as {cluster['worker'][first]}, "
                                          f"not {address(host, ports[0])}: the nodes must reach node 0 without address "
                                          "translation.")
                options.say(f"round {start.round}: node {start.node} of {len(cluster['worker']) // nproc}: "
                            f"workers {first} to {first + nproc - 1} of {len(cluster['worker'])}")
                told = ElasticBatch(start.reference, start.min_workers, batch)
                run = dataclasses.replace(options, watch=lambda: _next(link, 0, NODE_TIMEOUT_SECONDS), env={
                    **(options.env or {}), RESTART_VARIABLE: str(start.round), STATE_VARIABLE: state,
                    ELASTIC_VARIABLE: told.to_env()})
                failed = None
                try:
                    run_job(command, cluster, tasks_from(first), run)
                    link.send(Done())
                    continue
                except MembershipChange as reason:
                    options.say(f"{reason}; stopped this node's workers")
                except LaunchError as error:
                    if error.task is None:  # interrupted, or the job ended elsewhere
                        link.send(Leave(str(error)))
                        raise
                    failed = str(error)
                    if coordinator is not None:
                        warn_without_backup(state, options)
                ports = free_ports(nproc, host)
                link.send(Ready(tuple(ports), failed))
        finally:
            if link is not None:
                link.close()
            if coordinator is not None:
                coordinator.close()


_ENDED = object()
"""What `_next` returns when the job ended with every node's workers done."""


def _next(link, timeout, silence):
    """The rendezvous' next message (within ``timeout`` seconds; None: wait for it), or None if none
    came; a stop raises MembershipChange, a job that ended with an error or a drop LaunchError, and
    a job that ended well returns `_ENDED`."""
    from tfpar.launch.rendezvous.protocol import Drop, Ended, Invalid, Stop

    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        message = link.receive(0.2 if deadline is None else max(0.0, deadline - time.monotonic()))
        if message is None:
            if link.closed or link.silent_for() > silence:
                raise LaunchError("the rendezvous is gone (node 0's agent or host stopped answering): the job ends")
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
            raise LaunchError(f"the rendezvous sent what this agent cannot read ({message.why}): is every node "
                              "running the same tfpar?")
        if isinstance(message, Stop) and timeout is not None:
            raise MembershipChange(message.why)
        return message
