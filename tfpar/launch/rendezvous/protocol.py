"""What an elastic job's agents and their rendezvous (`tfpar.launch.rendezvous.elastic`) say to
each other: one frozen dataclass a kind of message, `encode` and `decode` the one place that turns
them into JSON lines and back, and `Link`, one lasting connection that sends and receives them.

An agent says `Hello` once, then `Ready` (its workers' free ports; after a failure, why), `Done`
(its workers succeeded) or `Leave`. The rendezvous answers `Wait` (a round runs without it),
`Start` (a round: the cluster and this node's place in it), `Stop` (end this round's workers),
`Renew` (pick other ports), `Drop` (this node leaves the job) and `Ended` (the job is over, with
the error that ended it, if one did). Both ends send `Alive` every `KEEPALIVE_SECONDS`. Pure Python.
"""

import dataclasses
import json
import queue
import socket
import threading
import time

__all__ = [
    "KEEPALIVE_SECONDS",
    "Alive",
    "Done",
    "Drop",
    "Ended",
    "Hello",
    "Invalid",
    "Leave",
    "Link",
    "Message",
    "Ready",
    "Renew",
    "Start",
    "Stop",
    "Wait",
    "decode",
    "encode",
]

KEEPALIVE_SECONDS = 1.0
"""How often each end of a `Link` says it is alive."""
_MAX_MESSAGE = 1 << 16


@dataclasses.dataclass(frozen=True)
class Hello:
    """An agent's first message: who it is, the sizes it was started with, its workers' ports, and
    the token only the hosting agent knows (None elsewhere)."""

    name: str
    nnodes: tuple[int, int]
    nproc: int
    ports: tuple[int, ...]
    token: str | None = None


@dataclasses.dataclass(frozen=True)
class Ready:
    """The agent's workers are stopped (or not started) and these ports free; ``failed``: why its
    last round's workers failed, if they did."""

    ports: tuple[int, ...]
    failed: str | None = None


@dataclasses.dataclass(frozen=True)
class Done:
    """The agent's workers of this round all succeeded."""


@dataclasses.dataclass(frozen=True)
class Leave:
    """The agent leaves the job (interrupted, or its job ended elsewhere)."""

    why: str


@dataclasses.dataclass(frozen=True)
class Wait:
    """A round runs without the agent; it joins at the next."""

    why: str


@dataclasses.dataclass(frozen=True)
class Start:
    """A round: its ``cluster``, this ``node``'s rank and ``first`` worker index, and the workers
    the global batch is divided for (``reference``) and the fewest the job trains with."""

    round: int
    cluster: dict
    node: int
    first: int
    reference: int
    min_workers: int


@dataclasses.dataclass(frozen=True)
class Stop:
    """Stop this round's workers (a node left or failed, or the job grows)."""

    why: str


@dataclasses.dataclass(frozen=True)
class Renew:
    """Another agent on this host picked the same port: pick free ports again."""


@dataclasses.dataclass(frozen=True)
class Drop:
    """This node's workers failed more than ``--max-restarts`` times: it leaves the job."""

    why: str


@dataclasses.dataclass(frozen=True)
class Ended:
    """The job is over: every node's workers succeeded (``error`` None), or ``error`` ended it."""

    error: str | None = None


@dataclasses.dataclass(frozen=True)
class Alive:
    """A keepalive."""


@dataclasses.dataclass(frozen=True)
class Invalid:
    """A line that is no message of this protocol (what `Link` receives in its place)."""

    why: str


Message = Hello | Ready | Done | Leave | Wait | Start | Stop | Renew | Drop | Ended | Alive
_KINDS: dict[str, type] = {
    kind.__name__.lower(): kind
    for kind in (Hello, Ready, Done, Leave, Wait, Start, Stop, Renew, Drop, Ended, Alive)
}
_TUPLES = {"nnodes", "ports"}  # JSON has lists only


def encode(message: Message) -> bytes:
    """``message`` as one JSON line: ``{"kind": ..., its fields}``."""
    fields = dataclasses.asdict(message)
    return (json.dumps({"kind": type(message).__name__.lower(), **fields}) + "\n").encode("utf-8")


def decode(line: bytes) -> "Message | Invalid":
    """The message of one JSON line, or `Invalid` naming what is wrong with it."""
    try:
        data = json.loads(line)
    except ValueError:
        return Invalid("not JSON")
    kind = _KINDS.get(str(data.get("kind"))) if isinstance(data, dict) else None
    if kind is None:
        return Invalid(f"no kind of message this rendezvous knows: {str(data)[:80]}")
    data.pop("kind")
    names = {field.name for field in dataclasses.fields(kind)}
    if not set(data) <= names:
        return Invalid(f"{kind.__name__} has no field(s) {sorted(set(data) - names)}")
    for name in _TUPLES & set(data):
        if isinstance(data[name], list):
            data[name] = tuple(data[name])
    try:
        message = kind(**data)
    except TypeError as error:
        return Invalid(f"{kind.__name__}: {error}")
    wrong = _wrongly_typed(message)
    return Invalid(f"{kind.__name__}'s {wrong} is not what it must be") if wrong else message


def _wrongly_typed(message):
    """The first field of ``message`` whose value is not of its declared type, or None."""
    for field in dataclasses.fields(message):
        value = getattr(message, field.name)
        if field.name in _TUPLES:
            if not (isinstance(value, tuple) and all(isinstance(v, int) for v in value)):
                return field.name
        elif not isinstance(value, field.type) or isinstance(value, bool):  # a class or a union
            return field.name
    return None


class Link:
    """One connection between an agent and the rendezvous, either end: lines read on a thread and
    decoded into a queue (`Alive` only notes the time), `Alive` sent every `KEEPALIVE_SECONDS`."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.heard = time.monotonic()
        self.closed = False
        self.messages: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._ended = threading.Event()
        sock.settimeout(None)
        threading.Thread(target=self._read, daemon=True, name="tfpar-link-read").start()
        threading.Thread(target=self._keepalive, daemon=True, name="tfpar-link-alive").start()

    def _read(self):
        buffer = b""
        try:
            while len(buffer) <= _MAX_MESSAGE:
                chunk = self.sock.recv(65536)
                if not chunk:
                    break
                self.heard = time.monotonic()
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    message = decode(line)
                    if not isinstance(message, Alive):
                        self.messages.put(message)
        except OSError:
            pass
        self.closed = True
        self.messages.put(None)  # wakes whoever waits

    def _keepalive(self):
        while not self._ended.wait(KEEPALIVE_SECONDS):
            self.send(Alive())

    def send(self, message: Message) -> bool:
        """Sends ``message``; False if the other end is gone."""
        with self._lock:
            try:
                self.sock.sendall(encode(message))
                return True
            except OSError:
                self.closed = True
                return False

    def receive(self, timeout: float) -> "Message | Invalid | None":
        """The next message within ``timeout`` seconds (0: only one already here); None if there is
        none yet, or the connection closed (`closed`)."""
        try:
            return self.messages.get(timeout=timeout) if timeout > 0 else self.messages.get_nowait()
        except queue.Empty:
            return None

    def silent_for(self) -> float:
        """Seconds since the other end last said anything."""
        return time.monotonic() - self.heard

    def close(self) -> None:
        """Stops the keepalives and shuts the connection."""
        self._ended.set()
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
