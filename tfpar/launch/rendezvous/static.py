"""``tfpar launch --nnodes K --node-rank R --master-addr A``: N identical hosts agree on one
cluster.

TensorFlow's workers need every worker's address in their ``TF_CONFIG`` before any starts, and
torchrun's users give one coordinator address only. So node 0 listens on ``A:--master-port``;
every node (node 0 too) connects, says its rank and the free ports of its workers, and gets the
whole cluster back once all K have joined: workers ordered by node rank, then local rank. A node
is known by the address the coordinator sees it connect from. A node missing at the timeout, two
nodes claiming one rank, or nodes disagreeing on K end the rendezvous with an error naming them,
sent to every node that joined.

Pure Python: the launcher never imports TensorFlow. One JSON line each way; anything else on the
port is answered with an error and ignored. An elastic job's agents keep a lasting connection to
their rendezvous instead (`tfpar.launch.rendezvous.protocol`).
"""

import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from tfpar.cluster.addresses import free_ports

__all__ = ["DEFAULT_MASTER_PORT", "RendezvousError", "address", "connect", "rendezvous"]

DEFAULT_MASTER_PORT = 29500
"""torchrun's default ``--master-port``."""
_MAX_MESSAGE = 1 << 16


class RendezvousError(ValueError):
    """The nodes could not agree on a cluster (missing, duplicated or disagreeing nodes)."""


def address(host: str, port: int) -> str:
    """``host:port``, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _read_line(conn, deadline):
    data = b""
    while not data.endswith(b"\n"):
        conn.settimeout(max(0.05, deadline - time.monotonic()))
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
        if len(data) > _MAX_MESSAGE:
            raise ValueError("message too long")
    return json.loads(data.decode("utf-8"))


def _send(conn, message):
    try:
        conn.sendall((json.dumps(message) + "\n").encode("utf-8"))
    except OSError:
        pass  # that node is gone; the others still get theirs


class _Coordinator:
    """Node 0's side: collects K nodes, answers each with the cluster (or the error)."""

    def __init__(self, master_addr, master_port, nnodes, timeout):
        try:
            self.server = socket.create_server(
                (master_addr, master_port), backlog=max(16, 2 * nnodes)
            )
        except OSError as error:
            raise RendezvousError(
                f"Node 0 coordinates the rendezvous on --master-addr {master_addr} --master-port "
                f"{master_port}, and cannot listen there: {error}. Received: an address that is "
                "not this host's, or a port in use. Run node 0 on the host --master-addr names, "
                "with a free --master-port."
            ) from None
        self.nnodes, self.timeout = nnodes, timeout
        self.error = None
        self.thread = threading.Thread(target=self._serve, daemon=True, name="tfpar-rendezvous")
        self.thread.start()

    def _serve(self):
        deadline = time.monotonic() + self.timeout
        joined = {}  # node rank -> (conn, host, ports)
        problem = None
        try:
            while len(joined) < self.nnodes and problem is None:
                self.server.settimeout(max(0.05, deadline - time.monotonic()))
                try:
                    conn, peer = self.server.accept()
                except TimeoutError:
                    if time.monotonic() >= deadline:
                        missing = sorted(set(range(self.nnodes)) - set(joined))
                        problem = (
                            f"node(s) {', '.join(map(str, missing))} of {self.nnodes} did not join "
                            f"the rendezvous within {self.timeout:g} s"
                        )
                    continue
                problem = self._join(conn, peer[0], joined, deadline)
            if problem is None:
                workers = [
                    address(joined[rank][1], port)
                    for rank in sorted(joined)
                    for port in joined[rank][2]
                ]
                reply = {"cluster": {"worker": workers}}
            else:
                self.error, reply = problem, {"error": problem}
            for conn, _, _ in joined.values():
                _send(conn, reply)
                conn.close()
        finally:
            self.server.close()

    def _join(self, conn, host, joined, deadline):
        """Adds one node; returns the job's error if its message ends the rendezvous."""
        try:
            message = _read_line(conn, min(deadline, time.monotonic() + 10))
            rank, nnodes, ports = message["node_rank"], message["nnodes"], message["ports"]
            if not (
                isinstance(rank, int)
                and isinstance(nnodes, int)
                and isinstance(ports, list)
                and ports
                and all(isinstance(p, int) for p in ports)
            ):
                raise ValueError("bad fields")
        except (OSError, ValueError, KeyError, TypeError):
            _send(conn, {"error": "not a tfpar rendezvous message"})
            conn.close()
            return None  # a stray connection does not end the job
        if nnodes != self.nnodes:
            joined[("nnodes", rank)] = (conn, host, [])
            return (
                f"node 0 was started with --nnodes {self.nnodes} and node {rank} ({host}) with "
                f"--nnodes {nnodes}: give every node the same --nnodes"
            )
        if rank in joined:
            joined[("duplicate", rank)] = (conn, host, [])
            return (
                f"two nodes say --node-rank {rank}: {joined[rank][1]} and {host}. Give each node "
                f"its own --node-rank, 0 to {self.nnodes - 1}"
            )
        joined[rank] = (conn, host, ports)
        return None


def rendezvous(
    *,
    master_addr: str,
    master_port: int,
    nnodes: int,
    node_rank: int,
    nproc_per_node: int,
    timeout: float = 300.0,
) -> tuple[dict, list[int]]:
    """Joins the rendezvous; returns (cluster, the worker indices of this node's tasks).

    Raises:
        RendezvousError: the nodes did not agree (the message names which and why), or node 0 did
            not answer within ``timeout`` seconds.
    """
    coordinator = (
        _Coordinator(master_addr, master_port, nnodes, timeout) if node_rank == 0 else None
    )
    deadline = time.monotonic() + timeout
    # Node 0's own coordinator may end (another node's message was wrong) before node 0 joins it.
    conn = connect(
        master_addr, master_port, deadline, timeout, lambda: coordinator and coordinator.error
    )
    try:
        host = conn.getsockname()[0]
        ports = free_ports(nproc_per_node, host)
        _send(conn, {"node_rank": node_rank, "nnodes": nnodes, "ports": ports})
        try:
            reply = _read_line(conn, deadline + 5)
        except (OSError, ValueError):
            reply = {
                "error": f"node 0 ({address(master_addr, master_port)}) closed the rendezvous "
                "without a cluster"
            }
    finally:
        conn.close()
    if coordinator is not None:
        coordinator.thread.join(timeout=10)
        # node 0 names the reason, even when its own connection was cut short by it
        if coordinator.error:
            raise RendezvousError(f"The rendezvous failed: {coordinator.error}.")
    if "error" in reply:
        raise RendezvousError(f"The rendezvous failed: {reply['error']}.")
    cluster = reply["cluster"]
    mine = address(host, ports[0])
    if mine not in cluster["worker"]:  # node 0 saw this node through another address (NAT)
        raise RendezvousError(
            "The rendezvous failed: node 0 does not list this node's first worker "
            f"{address(host, ports[0])} in {cluster['worker']}; the nodes must reach node 0 "
            "without address translation."
        )
    first = cluster["worker"].index(mine)
    return cluster, list(range(first, first + nproc_per_node))


def connect(
    master_addr: str, master_port: int, deadline: float, timeout: float, ended: Callable[[], Any]
) -> socket.socket:
    """A connection to node 0, tried until ``deadline`` (node 0 may start after this node), or until
    ``ended()`` returns the error that ended the rendezvous."""
    while True:
        try:
            return socket.create_connection((master_addr, master_port), timeout=5)
        except OSError as error:
            if ended():
                raise RendezvousError(f"The rendezvous failed: {ended()}.") from None
            if time.monotonic() >= deadline:
                raise RendezvousError(
                    "The rendezvous failed: node 0 did not answer at "
                    f"{address(master_addr, master_port)} within {timeout:g} s ({error}). Start "
                    "node 0 on the host --master-addr names (--node-rank 0; in an elastic job, "
                    "any node there)."
                ) from None
            time.sleep(0.2)
