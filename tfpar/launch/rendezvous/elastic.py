"""``tfpar launch --nnodes MIN:MAX``: the rendezvous of an elastic job across hosts, as torchrun's
c10d one.

Every host runs the same line: an *agent* (`tfpar.launch.elastic.agent.run_elastic_nodes`) that
keeps one connection to the rendezvous. The first agent on the host ``--master-addr`` names hosts it
(it binds ``--master-port``; the others there and elsewhere connect). The rendezvous forms *rounds*,
each one cluster of the agents that are ready, and starts them all on it:

- A round starts once ``MAX`` agents are ready, or at least ``MIN`` have been for
  `LAST_CALL_SECONDS` with no other joining. Node ranks: the hosting agent first (its node runs
  worker 0, the chief, whose backups the rendezvous watches), then the last round's nodes in their
  order, then newcomers in the order they joined.
- A round ends when all its workers succeed (every agent exits 0); when a node's workers fail (the
  others are stopped and every node starts again from FaultTolerance's backup: the failure reported
  first in a round counts against its node, which leaves the job after more than
  ``--max-restarts``); when an agent's connection closes or is silent for `NODE_TIMEOUT_SECONDS`
  (its host is gone: the job goes on without it); or when an agent joins a round of fewer than
  ``MAX`` nodes: the chief is asked for a backup to grow from (`GROW_REQUEST`, as in an elastic
  local job) and the round ends once that backup is marked.
- Fewer than ``MIN`` ready agents for the timeout (``--rendezvous-timeout`` before the first round,
  ``--elastic-timeout`` after): every agent fails, naming how many there were.
- The hosting agent's loss ends the job, as the loss of torchrun's c10d store host does.

The round's life is a `Phase` (`tfpar.launch.rendezvous.rounds`): forming, running, stopping (back
to forming) and ended, each move one of `TRANSITIONS`. Pure Python: the messages of
`tfpar.launch.rendezvous.protocol`, one JSON line each.
"""

import errno
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from tfpar.launch.elastic.membership import GrowRequest
from tfpar.launch.rendezvous.protocol import (
    Done,
    Ended,
    Hello,
    Invalid,
    Leave,
    Link,
    Ready,
    Wait,
)
from tfpar.launch.rendezvous.rounds import TRANSITIONS, Agent, Phase, Rounds
from tfpar.launch.rendezvous.static import RendezvousError

__all__ = [
    "LAST_CALL_SECONDS",
    "NODE_TIMEOUT_SECONDS",
    "TRANSITIONS",
    "Coordinator",
    "Phase",
    "parse_nnodes",
]

NODE_TIMEOUT_SECONDS = 15.0
"""An agent (or the rendezvous, for an agent) silent this long is gone: torchrun's 3 missed
keepalives of 5 s."""
LAST_CALL_SECONDS = 3.0
"""With at least ``MIN`` agents ready and fewer than ``MAX``, how long a round waits for another to
join."""
_HELLO_SECONDS = 10.0


def parse_nnodes(value: str) -> tuple[int, int]:
    """(MIN, MAX) from ``--nnodes K`` (K, K) or ``--nnodes MIN:MAX``.

    Raises:
        ValueError: not ``K`` or ``MIN:MAX`` with 1 <= MIN <= MAX, naming the value and the fix.
    """
    parts = str(value).split(":")
    if len(parts) > 2 or not all(p.strip().isdigit() for p in parts) or int(parts[0]) < 1:
        raise ValueError(
            f"--nnodes takes K or MIN:MAX, whole numbers >= 1. Received: --nnodes {value}. Write "
            "e.g. --nnodes 2 (two hosts) or --nnodes 1:4 (an elastic job on 1 to 4 hosts)."
        )
    low, high = int(parts[0]), int(parts[-1])
    if low > high:
        raise ValueError(
            f"--nnodes MIN:MAX needs MIN <= MAX. Received: --nnodes {value}. Write --nnodes "
            f"{high}:{low}."
        )
    return low, high


class Coordinator(Rounds):
    """The rendezvous, served on a thread of the hosting agent's process until the job ends.
    ``state``: that agent's launch folder (where its chief, worker 0, marks backups); ``timeouts``:
    seconds to wait for ``MIN`` agents before the first round and after."""

    def __init__(
        self,
        server: socket.socket,
        nnodes: tuple,
        nproc: int,
        state: str,
        say: Callable[[str], None],
        max_restarts: int,
        timeouts: tuple,
        node_timeout: float = NODE_TIMEOUT_SECONDS,
        last_call: float = LAST_CALL_SECONDS,
    ) -> None:
        self.server = server
        self.low, self.high = nnodes
        self.nproc = nproc
        self.state = state
        self.say = say
        self.max_restarts = max_restarts
        self.timeouts = timeouts
        self.node_timeout = node_timeout
        self.last_call = last_call
        self.token = secrets.token_hex(8)
        """What the hosting agent says in its hello, to be node 0."""
        self.agents: list = []
        self.pending: list = []  # (link, host, since): connected, no hello yet
        self.members: list = []
        self.round = -1
        self.phase = Phase.FORMING
        self.since = self.last_join = time.monotonic()
        self.blamed = self.said_waiting = False
        self.grow = GrowRequest(state, say)
        self.thread = threading.Thread(
            target=self._serve, daemon=True, name="tfpar-elastic-rendezvous"
        )
        self.thread.start()

    @classmethod
    def host(cls, master_addr: str, master_port: int, **kwargs: Any) -> "Coordinator | None":
        """The rendezvous, if this host is ``master_addr`` and no agent here hosts it yet; else
        None."""
        try:
            server = socket.create_server((master_addr, master_port), backlog=64)
        except OSError as error:
            if error.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL) or isinstance(
                error, socket.gaierror
            ):
                return None  # another agent hosts it, here or on the host --master-addr names
            raise RendezvousError(
                f"The rendezvous cannot listen on --master-addr {master_addr} --master-port "
                f"{master_port}: {error}. Give a free --master-port above 1023."
            ) from None
        server.setblocking(False)
        return cls(server, **kwargs)

    def close(self) -> None:
        """Waits (briefly) for the rendezvous to have told every agent how the job ended."""
        self.thread.join(timeout=10)

    def _serve(self):
        try:
            steps = {
                Phase.FORMING: self._forming,
                Phase.RUNNING: self._running,
                Phase.STOPPING: self._stopping,
            }
            while self.phase is not Phase.ENDED:
                self._accept()
                # a loss before the echoes it caused
                for agent in sorted(self.agents, key=lambda a: not a.link.closed):
                    self._hear(agent)
                if self.phase is not Phase.ENDED:
                    steps[self.phase]()
                time.sleep(0.05)
        except Exception as error:  # every agent is told, then the job ends
            self._end(Ended(f"the rendezvous failed: {error!r}"))
        finally:
            self.server.close()
            # each agent closes its end once told; then this one's closing resets nothing
            deadline = time.monotonic() + 2
            while any(not a.link.closed for a in self.agents) and time.monotonic() < deadline:
                time.sleep(0.05)
            for agent in self.agents:
                agent.link.close()

    def _accept(self):
        while True:
            try:
                conn, peer = self.server.accept()
            except (BlockingIOError, InterruptedError):
                break
            self.pending.append((Link(conn), peer[0], time.monotonic()))
        for item in list(self.pending):
            link, host, since = item
            hello = link.receive(0)
            if hello is None and not link.closed and time.monotonic() - since < _HELLO_SECONDS:
                continue
            self.pending.remove(item)
            problem = self._join(link, host, hello)
            if problem:
                link.send(Ended(problem))
                link.close()

    def _join(self, link, host, hello):
        """Adds an agent; returns why it is refused, if it is."""
        if not isinstance(hello, Hello):
            why = f" ({hello.why})" if isinstance(hello, Invalid) else ""
            return f"not a tfpar rendezvous message{why}: is every node running the same tfpar?"
        if tuple(hello.nnodes) != (self.low, self.high) or hello.nproc != self.nproc:
            return (
                f"{hello.name} was started with --nnodes {':'.join(map(str, hello.nnodes))} "
                f"--nproc-per-node {hello.nproc}, and the job with --nnodes {self.low}:{self.high} "
                f"--nproc-per-node {self.nproc}: give every node the same"
            )
        agent = Agent(link, hello.name, host, hello.token == self.token, list(hello.ports))
        self.agents.append(agent)
        self.last_join = time.monotonic()
        if self.phase is Phase.RUNNING:
            link.send(
                Wait(
                    f"the job runs on {len(self.members)} node(s); this one joins at its next "
                    "restart"
                )
            )
        return None

    def _hear(self, agent):
        while True:
            message = agent.link.receive(0)
            if message is None:
                break
            if isinstance(message, Ready):
                agent.ports = list(message.ports)
                agent.done = False
                if message.failed:
                    self._failed(agent, message.failed)
                    if agent not in self.agents:  # dropped for it
                        return None
            elif isinstance(message, Done):
                agent.done = True
            elif isinstance(message, Leave):
                return self._lost(agent, message.why)
            elif isinstance(message, Invalid):
                return self._lost(agent, f"it sent what the rendezvous cannot read: {message.why}")
        if agent.link.closed:
            self._lost(agent, "its connection closed")
        elif agent.link.silent_for() > self.node_timeout:
            self._lost(agent, f"silent for {self.node_timeout:g} s")

    def _lost(self, agent, why):
        self.agents.remove(agent)
        agent.link.close()
        if agent.own:
            return self._end(
                Ended(
                    f"node 0 ({agent.name}), which hosts the rendezvous, left ({why}): the job "
                    "ends with it, as torchrun's does with its store's host"
                )
            )
        if agent in self.members and self.phase is Phase.RUNNING:
            return self._stop(f"{agent.name} left ({why})")
        self.say(f"{agent.name} left ({why})")
