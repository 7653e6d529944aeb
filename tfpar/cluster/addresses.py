"""Addresses of tasks: ``--hosts`` lists, free ports, and clusters on one host (loopback by
default). Pure Python: the launcher, the strategies and the tests share it.
"""

import errno
import random
import socket
import time
from collections.abc import Mapping, Sequence

__all__ = [
    "DEFAULT_PORT",
    "LOWEST_FREE_PORT",
    "ClusterUnreachableError",
    "accepts",
    "ephemeral_ports",
    "free_ports",
    "is_loopback_cluster",
    "local_cluster",
    "parse_hosts",
    "port_in_use",
    "wait_for_addresses",
]

DEFAULT_PORT = 2222
"""The port a ``--hosts`` entry without one gets (TensorFlow's usual)."""


def accepts(address: str, timeout: float = 1.0) -> bool:
    """Whether ``host:port`` accepts a TCP connection now (within ``timeout`` seconds)."""
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except OSError:
        return False


class ClusterUnreachableError(ConnectionError):
    """A task of the cluster did not accept connections within the wait."""


def wait_for_addresses(addresses: Sequence[str], timeout_seconds: float) -> None:
    """Waits until every ``host:port`` accepts a TCP connection.

    Raises:
        ClusterUnreachableError: naming the first address still closed at the deadline.
    """
    deadline = time.monotonic() + timeout_seconds
    for address in addresses:
        while not accepts(address):
            if time.monotonic() > deadline:
                raise ClusterUnreachableError(
                    f"Cannot reach {address} after waiting {timeout_seconds:g} s. Check that the "
                    "task runs there and the address in TF_CONFIG is right, or raise "
                    "connect_timeout_seconds."
                )
            time.sleep(0.2)


LOWEST_FREE_PORT = 10000
"""The lowest port `free_ports` picks: below it lie the well-known ports and most services'."""
_EPHEMERAL_DEFAULT = (32768, 60999)  # Linux's default net.ipv4.ip_local_port_range


def ephemeral_ports() -> tuple[int, int]:
    """The range this machine hands out for outgoing connections (and ``bind`` to port 0):
    ``net.ipv4.ip_local_port_range``, or Linux's default where it cannot be read."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            low, high = (int(part) for part in f.read().split())
        return low, high
    except (OSError, ValueError):
        return _EPHEMERAL_DEFAULT


def free_ports(count: int, host: str = "127.0.0.1", consecutive: bool = False) -> list[int]:
    """Returns ``count`` distinct TCP ports that are free on ``host`` now (``consecutive``: a run of
    them), chosen at random outside `ephemeral_ports`.

    Outside that range no outgoing connection of any process here takes a port between its
    choice and the bind of the server it is for; the sockets are held until every port is chosen,
    so that none is returned twice. A program that binds that very port may still take it first:
    `tfpar launch` then starts the job again on others (`port_taken`).

    Where that range leaves no port above `LOWEST_FREE_PORT` (a machine that hands out every port
    to outgoing connections), the system chooses them, as ``bind`` to port 0 does.

    Raises:
        OSError: fewer than ``count`` such ports are free, or ``host`` is not this machine's.
    """
    low, high = ephemeral_ports()
    span = count if consecutive else 1
    starts = [
        port
        for port in range(LOWEST_FREE_PORT, 65536 - span + 1)
        if port + span - 1 < low or port > high
    ]
    if not starts and not consecutive:
        return _system_ports(count, host)
    held: list = []
    try:
        for start in _candidates(starts):
            held += _bound(range(start, start + span), host)
            if len(held) >= count:
                return [sock.getsockname()[1] for sock in held[:count]]
    finally:
        _close(held)
    raise OSError(
        f"Fewer than {count} free ports on {host} between {LOWEST_FREE_PORT} and 65535 outside "
        f"the ephemeral range {low}-{high}."
    )


def port_in_use(address: str) -> bool:
    """Whether a process on this machine holds ``host:port`` now (it cannot be bound)."""
    host, port = address.rsplit(":", 1)
    host = host.strip("[]")
    sock = _socket_for(host)
    try:
        sock.bind((host, int(port)))
        return False
    except OSError as error:
        return error.errno == errno.EADDRINUSE
    finally:
        sock.close()


def _candidates(starts):
    """``starts`` in a random order, seeded afresh (not the user's seed): a few random picks first,
    which almost always suffice, then every one."""
    rng = random.Random()
    for _ in range(min(64, len(starts))):
        yield rng.choice(starts)
    yield from rng.sample(starts, len(starts))


def _system_ports(count, host):
    sockets = []
    try:
        for _ in range(count):
            sockets.append(_socket_for(host))
            sockets[-1].bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        _close(sockets)


def _socket_for(host):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.socket(family, socket.SOCK_STREAM)


def _bound(ports, host):
    """Sockets bound to every port of ``ports`` on ``host``, or [] (none kept) if one is taken.

    Raises:
        OSError: other than a port in use (or reserved): ``host`` is not this machine's.
    """
    sockets = []
    try:
        for port in ports:
            sockets.append(_socket_for(host))
            sockets[-1].bind((host, port))
        return sockets
    except OSError as error:
        _close(sockets)
        if error.errno in (errno.EADDRINUSE, errno.EACCES):
            return []
        raise


def _close(sockets):
    for sock in sockets:
        sock.close()


def local_cluster(roles: Mapping[str, int], host: str = "127.0.0.1") -> dict[str, list[str]]:
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


def is_loopback_cluster(cluster: Mapping[str, list[str]]) -> bool:
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


def parse_hosts(hosts: str, default_port: int = DEFAULT_PORT) -> list[str]:
    """Parses ``"a:2222,b,c:2223"`` into ``["a:2222", "b:2222", "c:2223"]``.

    Raises:
        ValueError: if the list is empty, a port is not a number, or a port is below 1024
            (horovodrun's ``host:slots``, which tfpar would read as a port).
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
        # horovodrun's host:slots ("a:4"), read as a port, would bind a privileged one
        if int(port) < 1024:
            raise ValueError(
                f"--hosts takes host:port, and port {port} is below 1024. Received: {entry!r} in "
                f"--hosts {hosts!r}. horovodrun writes host:slots (-H a:4); in tfpar that is "
                f"--hosts {host} with --nproc-per-node {port}, or one host:port entry per worker, "
                f"e.g. {host}:2222,{host}:2223."
            )
        out.append(f"{host}:{port}")
    return out
