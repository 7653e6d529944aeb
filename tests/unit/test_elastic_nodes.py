"""``tfpar launch --nnodes MIN:MAX``: agents on 127.0.0.1 standing for hosts, their workers plain
Python (no TensorFlow). A host lost (its agent killed, or silent), a node whose workers fail beyond
--max-restarts, too few nodes, node 0 lost, and what is refused at once. The resize with
TensorFlow's workers, every example once, is tests/multiproc/test_exactly_once.py's."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, run_command, tfpar_command
from tfpar.cluster.addresses import free_ports
from tfpar.launch.rendezvous.elastic import Coordinator, Phase, parse_nnodes
from tfpar.launch.rendezvous.protocol import (
    Alive,
    Hello,
    Ready,
    Renew,
    Start,
    Stop,
    decode,
    encode,
)

PY = sys.executable
# Each worker prints its place and round; in round 0 it then does what $WORKER_ROUND0 says of its
# index: "sleep" (until stopped), "fail 2" (worker 2 exits 1), or nothing.
WORKER = """
import json, os, sys, time
t = json.loads(os.environ["TF_CONFIG"]); index, round_ = t["task"]["index"], \
int(os.environ["TFPAR_RESTART_COUNT"])
print("TASK", json.dumps({"index": index, "round": round_, "workers": len(t["cluster"]["worker"]),
                          "elastic": json.loads(os.environ["TFPAR_ELASTIC"])}), flush=True)
what = os.environ.get("WORKER_ROUND0", "")
if round_ == 0 and what == "fail %d" % index:
    sys.exit(1)
if round_ == 0 and what.startswith("sleep"):
    time.sleep(600)
"""


def _agent(port, log, nnodes="2:3", *extra, round0="", marker="-"):
    """An agent; its workers' command lines end with ``marker`` (to find any left running)."""
    argv = tfpar_command(
        "launch",
        "--nnodes",
        nnodes,
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        *extra,
        "--",
        PY,
        "-c",
        WORKER,
        marker,
    )
    return subprocess.Popen(
        argv,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "WORKER_ROUND0": round0},
    )


def _listening(port, proc, deadline):
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)


def _run_agents(tmp_path, count, round0="", extra=(), act=None, timeout=90):
    """Starts ``count`` agents (the first hosts), calls ``act(agents, logs)`` once every one is in
    round 0, waits for all to exit; returns (their exit codes, their outputs)."""
    port = free_ports(1)[0]
    paths = [tmp_path / f"agent{i}.log" for i in range(count)]
    logs = [open(p, "w") for p in paths]
    deadline = time.monotonic() + timeout
    agents = [_agent(port, logs[0], "2:3", *extra, round0=round0, marker=str(tmp_path))]
    try:
        _listening(port, agents[0], deadline)
        agents += [
            _agent(port, log, "2:3", *extra, round0=round0, marker=str(tmp_path))
            for log in logs[1:]
        ]
        if act is not None:
            while sum("TASK" in p.read_text() for p in paths) < count:
                assert time.monotonic() < deadline, [p.read_text() for p in paths]
                time.sleep(0.05)
            act(agents, paths)
        for agent in agents:
            agent.wait(timeout=max(1, deadline - time.monotonic()))
    finally:
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()
        for log in logs:
            log.close()
    return [a.returncode for a in agents], [p.read_text() for p in paths]


def _tasks(out):
    return [json.loads(line.split("TASK ", 1)[1]) for line in out.splitlines() if "TASK {" in line]


def _node_of(outs, node):
    """The agent that was node ``node`` in round 0."""
    return next(i for i, o in enumerate(outs) if f"round 0: node {node} of" in o)


@pytest.mark.parametrize("loss", ["agent-killed", "workers-fail"])
def test_a_lost_node_leaves_and_the_others_go_on_in_a_new_round(tmp_path, loss):
    """Three agents, a worker each, in round 0. Either node 2's agent is SIGKILLed (its host gone:
    its worker goes with it) or node 2's worker exits 1 with --max-restarts 0 (the node leaves, exit
    1). Nodes 0 and 1 start round 1 as workers 0 and 1 of 2, told the job's reference of 3 workers,
    and succeed."""

    def kill_node_2(agents, paths):
        if loss == "agent-killed":
            outs = [p.read_text() for p in paths]
            os.kill(agents[_node_of(outs, 2)].pid, signal.SIGKILL)

    codes, outs = _run_agents(
        tmp_path, 3, round0="sleep" if loss == "agent-killed" else "fail 2", act=kill_node_2
    )
    lost = _node_of(outs, 2)
    assert codes[lost] == (-9 if loss == "agent-killed" else 1), outs
    assert [c for i, c in enumerate(codes) if i != lost] == [0, 0], outs
    survivors = [o for i, o in enumerate(outs) if i != lost]
    name = re.search(r"nodes 3 -> 2 \(left: (\S+\[\d+\])\); world size 2", outs[0])
    assert name, outs[0]
    why = (
        "its connection closed"
        if loss == "agent-killed"
        else "worker 2 exited with code 1; dropped: its workers failed 1 time(s), more than "
        "--max-restarts 0"
    )
    assert f"{name.group(1)} left ({why})" in outs[0] or f"{name.group(1)}: {why}" in outs[0], outs[
        0
    ]
    if loss == "workers-fail":
        assert "this node leaves the job" in outs[lost], outs[lost]
    rounds = sorted((t["round"], t["index"], t["workers"]) for o in survivors for t in _tasks(o))
    assert rounds == [(0, 0, 3), (0, 1, 3), (1, 0, 2), (1, 1, 2)], rounds
    assert all(
        t["elastic"] == {"reference_workers": 3, "min_workers": 2, "batch": "accumulate"}
        for o in survivors
        for t in _tasks(o)
    )
    assert "round 1: node 0 of 2: workers 0 to 0 of 2" in outs[0]
    left = [
        line
        for line in subprocess.run(
            ["ps", "-eo", "args"], capture_output=True, text=True
        ).stdout.splitlines()
        if line.endswith(str(tmp_path))
    ]
    assert not left  # the lost node's worker too


def test_node_0_lost_ends_the_job_on_every_node_naming_it(tmp_path):
    """Node 0's agent hosts the rendezvous: SIGKILLed, the others stop their workers and fail,
    naming why."""

    def kill_node_0(agents, paths):
        os.kill(agents[0].pid, signal.SIGKILL)

    begin = time.monotonic()
    codes, outs = _run_agents(tmp_path, 2, round0="sleep", act=kill_node_0)
    assert codes == [-9, 1], outs
    assert (
        "the rendezvous is gone (node 0's agent or host stopped answering): the job ends" in outs[1]
    ), outs[1]
    assert time.monotonic() - begin < 60


def test_a_rendezvous_host_that_stops_answering_ends_the_job_on_the_agent(tmp_path):
    """The other side of the node timeout: the rendezvous (here a bare socket, so that it can fall
    silent while its connection stays open, as a frozen or cut-off host's does) starts the agent's
    worker, then says nothing. After the node timeout the agent stops its worker and fails, naming
    why."""
    from tfpar.launch.rendezvous.elastic import NODE_TIMEOUT_SECONDS

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    with open(tmp_path / "agent.log", "w") as log:
        agent = _agent(port, log, "1:1", round0="sleep", marker=str(tmp_path))
        try:
            server.settimeout(30)
            conn, _ = server.accept()
            hello = decode(conn.makefile("rb").readline())
            assert isinstance(hello, Hello), hello
            worker = f"127.0.0.1:{hello.ports[0]}"
            conn.sendall(
                encode(
                    Start(
                        round=0,
                        cluster={"worker": [worker]},
                        node=0,
                        first=0,
                        reference=1,
                        min_workers=1,
                    )
                )
            )
            begin = time.monotonic()
            agent.wait(timeout=NODE_TIMEOUT_SECONDS + 30)
            waited = time.monotonic() - begin
        finally:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()
            server.close()
    out = (tmp_path / "agent.log").read_text()
    assert (
        agent.returncode == 1
        and "the rendezvous is gone (node 0's agent or host stopped answering)" in out
    ), out
    assert len(_tasks(out)) == 1 and NODE_TIMEOUT_SECONDS <= waited < NODE_TIMEOUT_SECONDS + 20, (
        waited,
        out,
    )
    left = [
        line
        for line in subprocess.run(
            ["ps", "-eo", "args"], capture_output=True, text=True
        ).stdout.splitlines()
        if line.endswith(str(tmp_path))
    ]
    assert not left  # its worker stopped


def test_too_few_nodes_fail_at_the_timeout_naming_how_many(tmp_path):
    begin = time.monotonic()
    codes, outs = _run_agents(tmp_path, 1, extra=("--rendezvous-timeout", "3"))
    assert codes == [1], outs
    assert "1 node(s) for 3 s, fewer than --nnodes 2:3 needs" in outs[0], outs[0]
    assert "TASK" not in outs[0] and time.monotonic() - begin < 30


def test_a_silent_agent_is_dropped_and_the_others_are_stopped():
    """A host that stops answering (no keepalive: its agent frozen, its network cut) is gone after
    the node timeout; the rendezvous stops the others, naming it. Agents here are bare sockets
    speaking the protocol."""
    said = []
    server = socket.create_server(("127.0.0.1", 0))
    server.setblocking(False)
    port = server.getsockname()[1]
    coordinator = Coordinator(
        server,
        nnodes=(1, 2),
        nproc=1,
        state="/nonexistent",
        say=said.append,
        max_restarts=0,
        timeouts=(30, 30),
        node_timeout=1.5,
    )
    clients = []
    try:
        for name in ("alive[1]", "silent[2]"):
            clients.append(socket.create_connection(("127.0.0.1", port), timeout=10))
            clients[-1].sendall(
                encode(Hello(name=name, nnodes=(1, 2), nproc=1, ports=tuple(free_ports(1))))
            )
        # The silent one's last word is its hello: its silence is counted from there, not from the
        # round's start (read later, on a loaded machine up to a second later).
        begin = time.monotonic()
        reader = clients[0].makefile("rb")
        start = decode(reader.readline())
        assert (start.round, start.node, len(start.cluster["worker"])) == (0, 0, 2)
        while True:  # the live one keeps answering; the silent one says nothing more
            clients[0].sendall(encode(Alive()))
            message = decode(reader.readline())
            if isinstance(message, Stop):
                break
        assert message.why == "silent[2] left (silent for 1.5 s)"
        assert 1.5 <= time.monotonic() - begin < 10
        assert said == [
            "2 node(s); world size 2",
            "silent[2] left (silent for 1.5 s); stopping every node's workers",
        ]
    finally:
        for client in clients:
            client.close()
        coordinator.phase = Phase.ENDED
        coordinator.close()


def test_two_agents_of_one_host_that_picked_one_port_are_told_to_pick_again():
    """Free ports are picked by each agent: on one host two may pick the same. The later one is
    asked again before the round starts, so no cluster names an address twice."""
    server = socket.create_server(("127.0.0.1", 0))
    server.setblocking(False)
    coordinator = Coordinator(
        server,
        nnodes=(2, 2),
        nproc=1,
        state="/nonexistent",
        say=lambda line: None,
        max_restarts=0,
        timeouts=(30, 30),
    )
    clients, port = [], free_ports(1)[0]
    try:
        for name in ("first[1]", "second[2]"):
            clients.append(
                socket.create_connection(("127.0.0.1", server.getsockname()[1]), timeout=10)
            )
            clients[-1].sendall(encode(Hello(name=name, nnodes=(2, 2), nproc=1, ports=(port,))))
        readers = [c.makefile("rb") for c in clients]
        assert decode(readers[1].readline()) == Renew()
        other = free_ports(1)[0]
        clients[1].sendall(encode(Ready((other,))))
        starts = [decode(r.readline()) for r in readers]
        assert (
            starts[0].cluster
            == starts[1].cluster
            == {"worker": [f"127.0.0.1:{port}", f"127.0.0.1:{other}"]}
        )
    finally:
        for client in clients:
            client.close()
        coordinator.phase = Phase.ENDED
        coordinator.close()


@pytest.mark.parametrize(
    "value, expected", [("3", (3, 3)), ("1:4", (1, 4)), (2, (2, 2)), ("2:2", (2, 2))]
)
def test_nnodes_spellings(value, expected):
    assert parse_nnodes(value) == expected


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--nnodes", "3:2", "--master-addr", "127.0.0.1"],
            "--nnodes MIN:MAX needs MIN <= MAX. Received: --nnodes 3:2",
        ),
        (
            ["--nnodes", "0:2", "--master-addr", "127.0.0.1"],
            "--nnodes takes K or MIN:MAX, whole numbers >= 1. Received: --nnodes 0:2",
        ),
        (["--nnodes", "a:b", "--master-addr", "127.0.0.1"], "Received: --nnodes a:b"),
        (
            ["--nnodes", "1:2"],
            "needs the address of the host whose first node hosts the rendezvous. Received: no "
            "--master-addr",
        ),
        (
            ["--nnodes", "1:2", "--master-addr", "127.0.0.1", "--node-rank", "0"],
            "numbers its nodes at each restart",
        ),
        (
            ["--nnodes", "1:2", "--master-addr", "127.0.0.1", "--task-index", "0"],
            "Received: --nnodes with --task-index",
        ),
        (
            ["--nnodes", "1:2", "--master-addr", "127.0.0.1", "--min-workers", "1"],
            "Received: --nnodes with it",
        ),
        (
            ["--nnodes", "1:2", "--master-addr", "127.0.0.1", "--elastic-timeout", "0"],
            "elastic-timeout must be",
        ),
    ],
)
def test_elastic_nodes_spellings_refused_at_once_with_the_fix(args, message):
    begin = time.monotonic()
    result = run_command(
        tfpar_command("launch", *args, "--", PY, "-c", "print('started')"), timeout=60
    )
    assert result.returncode == 3 and message in result.output, result.output
    assert (
        "started" not in result.output
        and "hosting" not in result.output
        and time.monotonic() - begin < 30
    )


def test_a_node_started_with_other_sizes_is_refused_by_the_rendezvous(tmp_path):
    """One agent with --nproc-per-node 2 against a job of 1 a node: refused, naming both; the job
    goes on."""
    port = free_ports(1)[0]
    with open(tmp_path / "node0.log", "w") as log:
        node0 = _agent(port, log, "1:2", "--rendezvous-timeout", "20")
        try:
            _listening(port, node0, time.monotonic() + 30)
            odd = run_command(
                tfpar_command(
                    "launch",
                    "--nnodes",
                    "1:2",
                    "--master-addr",
                    "127.0.0.1",
                    "--master-port",
                    str(port),
                    "--nproc-per-node",
                    "2",
                    "--",
                    PY,
                    "-c",
                    WORKER,
                ),
                timeout=60,
            )
            node0.wait(timeout=60)
        finally:
            if node0.poll() is None:
                os.killpg(node0.pid, signal.SIGKILL)
    out = (tmp_path / "node0.log").read_text()
    assert (
        odd.returncode == 1
        and "--nnodes 1:2 --nproc-per-node 2, and the job with --nnodes 1:2 --nproc-per-node 1: "
        "give every node the same"
        in odd.output
    ), odd.output
    assert node0.returncode == 0 and len(_tasks(out)) == 1, out


@pytest.mark.parametrize(
    "message",
    [
        Hello(name="host[1]", nnodes=(1, 3), nproc=2, ports=(40001, 40002), token="abc"),
        Ready((40001,), "worker 1 failed"),
        Start(
            round=2,
            cluster={"worker": ["127.0.0.1:40001"]},
            node=0,
            first=0,
            reference=3,
            min_workers=1,
        ),
        Stop("a node left"),
        Renew(),
        Alive(),
    ],
    ids=lambda message: type(message).__name__,
)
def test_each_message_of_the_elastic_protocol_reads_back_as_it_was_sent(message):
    line = encode(message)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode(line) == message


@pytest.mark.parametrize(
    "line, why",
    [
        (b"not json", "not JSON"),
        (b'{"ready": [1]}', "no kind of message this rendezvous knows"),  # the old spelling
        (b'{"kind": "ready", "ports": [1], "colour": "red"}', "Ready has no field(s) ['colour']"),
        (b'{"kind": "start", "round": 0}', "Start: "),
        (
            b'{"kind": "hello", "name": "a", "nnodes": [1, 2], "nproc": 1, "ports": 5}',
            "Hello's ports is not",
        ),
        (b'{"kind": "ready", "ports": [1], "failed": 3}', "Ready's failed is not what it must be"),
    ],
)
def test_a_line_that_is_no_message_is_read_as_invalid_naming_why(line, why):
    from tfpar.launch.rendezvous.protocol import Invalid

    message = decode(line)
    assert isinstance(message, Invalid) and message.why.startswith(why), message


def test_the_rendezvous_moves_only_between_the_phases_its_table_allows():
    from tfpar.launch.rendezvous.elastic import TRANSITIONS

    assert {phase for phase in Phase if not TRANSITIONS[phase]} == {Phase.ENDED}
    assert all(Phase.ENDED in TRANSITIONS[phase] for phase in Phase if phase is not Phase.ENDED)
    server = socket.create_server(("127.0.0.1", 0))
    server.setblocking(False)
    coordinator = Coordinator(
        server,
        nnodes=(1, 1),
        nproc=1,
        state="/nonexistent",
        say=lambda line: None,
        max_restarts=0,
        timeouts=(30, 30),
    )
    try:
        with pytest.raises(RuntimeError, match="cannot go from forming to stopping"):
            coordinator._move(Phase.STOPPING)
    finally:
        coordinator.phase = Phase.ENDED
        coordinator.close()
