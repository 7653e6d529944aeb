"""The rounds of an elastic job's rendezvous (`tfpar.launch.rendezvous.elastic.Coordinator`):
when a round starts, stops, ends and with which nodes; each move of its `Phase` one that
`TRANSITIONS` allows. Pure Python."""

import dataclasses
import enum
import time
from collections.abc import Callable
from typing import Any

from tfpar.launch.elastic.membership import change_line
from tfpar.launch.rendezvous.protocol import Drop, Ended, Link, Renew, Start, Stop
from tfpar.launch.rendezvous.static import address

__all__ = ["TRANSITIONS", "Agent", "Phase", "Rounds"]


class Phase(enum.Enum):
    """Where the rendezvous stands."""

    FORMING = "forming"
    """Waiting for enough ready agents to start a round."""
    RUNNING = "running"
    """A round's workers run."""
    STOPPING = "stopping"
    """A round's workers are being stopped; the next round forms once every member is ready."""
    ENDED = "ended"
    """Every agent was told how the job ended."""


TRANSITIONS = {
    Phase.FORMING: {Phase.RUNNING, Phase.ENDED},
    Phase.RUNNING: {Phase.STOPPING, Phase.ENDED},
    Phase.STOPPING: {Phase.FORMING, Phase.ENDED},
    Phase.ENDED: set(),
}
"""The moves the rendezvous may make from each phase."""


@dataclasses.dataclass(eq=False)
class Agent:
    """One agent the rendezvous knows: its link, name, host and state in the current round."""

    link: Link
    name: str
    host: str
    own: bool
    ports: list | None
    """Its workers' free ports while it is ready for a round; None while they run."""
    done: bool = False
    failures: int = 0


class Rounds:
    """The round decisions of the rendezvous; `Coordinator` keeps the connections that feed them
    and sets the state below."""

    agents: list
    """The agents connected and introduced."""
    members: list
    """The running (or last) round's agents, node 0 first."""
    phase: Phase
    since: float
    """When the phase began (`time.monotonic`)."""
    last_join: float
    round: int
    low: int
    high: int
    nproc: int
    max_restarts: int
    timeouts: tuple
    last_call: float
    blamed: bool
    said_waiting: bool
    grow: Any
    """The `tfpar.launch.elastic.membership.GrowRequest` to the chief."""
    say: Callable[[str], None]

    def _failed(self, agent, reason):
        if self.phase is not Phase.RUNNING or agent not in self.members:
            return
        if not self.blamed:  # the first failure of a round is the cause; the others' are its echo
            self.blamed = True
            agent.failures += 1
            if agent.failures > self.max_restarts:
                why = (
                    f"its workers failed {agent.failures} time(s), more than --max-restarts "
                    f"{self.max_restarts}"
                )
                if agent.own:
                    return self._end(Ended(f"node 0 ({agent.name}): {reason}; {why}"))
                agent.link.send(Drop(f"{reason}; {why}"))
                self.agents.remove(agent)
                return self._stop(f"{agent.name}: {reason}; dropped: {why}")
        self._stop(f"{agent.name}: {reason}")

    def _stop(self, reason):
        self.say(f"{reason}; stopping every node's workers")
        self._move(Phase.STOPPING)  # a grow request stays until the workers are stopped
        for agent in self.members:
            if agent in self.agents and agent.ports is None:  # its workers run, or are done
                agent.link.send(Stop(reason))

    def _stopping(self):
        if all(a.ports is not None for a in self.members if a in self.agents):
            self._move(Phase.FORMING)

    def _forming(self):
        order = {id(a): i for i, a in enumerate(self.members)}
        ready = sorted(
            (a for a in self.agents if a.ports is not None),
            key=lambda a: (not a.own, order.get(id(a), len(order))),
        )
        taken = set()
        # agents of one host may have picked one free port: the later one picks again
        for agent in ready:
            mine = {(agent.host, p) for p in agent.ports}
            if mine & taken or len(mine) < len(agent.ports):
                agent.link.send(Renew())
                agent.ports = None
                return
            taken |= mine
        now, fresh = time.monotonic(), any(a not in self.members for a in ready)
        # a restart of known nodes: at once
        called = not fresh or now - max(self.last_join, self.since) >= self.last_call
        if len(ready) >= self.high or (len(ready) >= self.low and called):
            return self._start(ready[: self.high])
        timeout = self.timeouts[self.round >= 0]
        if len(ready) < self.low and now - self.since >= timeout:
            return self._end(
                Ended(
                    f"{len(ready)} node(s) for {timeout:g} s, fewer than --nnodes {self.low}:"
                    f"{self.high} needs"
                )
            )
        if len(ready) < self.low and not self.said_waiting and now - self.since >= self.last_call:
            self.say(
                f"{len(ready)} node(s) ready, fewer than {self.low}; waiting up to {timeout:g} s "
                "for more"
            )
            self.said_waiting = True

    def _start(self, nodes):
        self.grow.withdraw()  # a new round: nobody waits
        self.round += 1
        before = [a.name for a in self.members]
        workers = [address(a.host, p) for a in nodes for p in a.ports]
        line = change_line(before, [a.name for a in nodes], len(workers), "nodes")
        if line:
            self.say(line)
        for rank, agent in enumerate(nodes):
            agent.link.send(
                Start(
                    round=self.round,
                    cluster={"worker": workers},
                    node=rank,
                    first=rank * self.nproc,
                    reference=self.high * self.nproc,
                    min_workers=self.low * self.nproc,
                )
            )
            agent.ports = None
            agent.done = False
        self.members = nodes
        self.blamed = self.said_waiting = False
        self._move(Phase.RUNNING)

    def _running(self):
        if all(a.done for a in self.members):
            return self._end(Ended())
        waiting = [a for a in self.agents if a not in self.members]
        if not waiting or len(self.members) >= self.high:
            return self.grow.withdraw()
        names = ", ".join(a.name for a in waiting)
        if self.grow.backed_up():
            return self._stop(f"{names} joined, and the chief backed up to start from")
        self.grow.ask(f"{names} joined")

    def _end(self, message):
        if self.phase is Phase.ENDED:  # every agent was told already
            return
        # the hosting agent last: it exits once told
        for agent in sorted(self.agents, key=lambda a: a.own):
            agent.link.send(message)
        self._move(Phase.ENDED)

    def _move(self, phase):
        """The one way the phase changes: a move `TRANSITIONS` allows, its time noted."""
        if phase not in TRANSITIONS[self.phase]:
            raise RuntimeError(f"the rendezvous cannot go from {self.phase.value} to {phase.value}")
        self.phase = phase
        self.since = time.monotonic()
