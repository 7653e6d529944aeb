"""torchrun's and horovodrun's launch habits: --nproc-per-node (a device each), --nnodes with one
coordinator address, and horovodrun's host:slots refused. Plain Python children, no TensorFlow.

No machine here has a GPU: the GPU decisions are tested as decisions (which ids each worker gets),
from CUDA_VISIBLE_DEVICES or a driver count given to the function.
"""

import json
import socket
import sys
import time

import pytest

from tests.conftest import run_command, tfpar_command
from tfpar.cluster.addresses import free_ports
from tfpar.launch.node import visible_gpus, worker_envs

PY = sys.executable
PRINT_TASK = (
    "import json, os; t = json.loads(os.environ['TF_CONFIG']); "
    "print('TASK', json.dumps({'index': t['task']['index'], 'cluster': t['cluster'], "
    "'env': {k: os.environ.get(k) for k in ('CUDA_VISIBLE_DEVICES', 'TFPAR_NUM_CPU_DEVICES', "
    "'LOCAL_RANK', 'LOCAL_WORLD_SIZE')}}))"
)


def _tasks(output):
    return sorted(
        (json.loads(line.split("TASK ", 1)[1]) for line in output.splitlines() if "TASK {" in line),
        key=lambda t: t["index"],
    )


@pytest.mark.parametrize(
    "env, driver, nproc, expected",
    [
        ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, 0, 4, ["0", "1", "2", "3"]),
        ({"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, 0, 2, ["4,5", "6,7"]),  # a block each, in order
        ({}, 2, 2, ["0", "1"]),  # no variable: the driver's count
        ({"CUDA_VISIBLE_DEVICES": "GPU-a1,GPU-b2"}, 0, 1, ["GPU-a1,GPU-b2"]),  # UUIDs pass through
    ],
    ids=["one-each", "blocks", "driver", "uuids"],
)
def test_each_worker_gets_its_own_gpus(env, driver, nproc, expected):
    envs, warning = worker_envs(nproc, env, driver_gpus=driver)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == expected and warning is None
    assert [e["LOCAL_RANK"] for e in envs] == [str(i) for i in range(nproc)]
    assert all(
        e["LOCAL_WORLD_SIZE"] == str(nproc) and "TFPAR_NUM_CPU_DEVICES" not in e for e in envs
    )


def test_gpus_left_over_are_named_and_too_few_gpus_are_refused():
    envs, warning = worker_envs(2, {"CUDA_VISIBLE_DEVICES": "0,1,2"})
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == [
        "0",
        "1",
    ] and "GPU(s) 2 left unused" in warning
    with pytest.raises(ValueError) as error:
        worker_envs(4, {"CUDA_VISIBLE_DEVICES": "0,1"})
    assert str(error.value) == (
        "--nproc-per-node 4 gives each worker its own GPU, and this host has 2 (0,1). Received: "
        "more workers than "
        "GPUs. Use --nproc-per-node 2, or -n 4 to start workers that share every GPU."
    )


@pytest.mark.parametrize(
    "env, nproc, expected",
    [
        ({}, 2, "1"),
        ({"TFPAR_NUM_CPU_DEVICES": "4"}, 2, "2"),
        ({"TFPAR_NUM_CPU_DEVICES": "2"}, 4, "1"),
        ({"CUDA_VISIBLE_DEVICES": ""}, 2, "1"),
        ({"CUDA_VISIBLE_DEVICES": "-1"}, 2, "1"),  # GPUs hidden: the CPU
    ],
)
def test_without_a_gpu_each_worker_gets_its_share_of_virtual_devices(env, nproc, expected):
    envs, warning = worker_envs(nproc, env, driver_gpus=8 if "CUDA_VISIBLE_DEVICES" in env else 0)
    assert [e["TFPAR_NUM_CPU_DEVICES"] for e in envs] == [expected] * nproc and warning is None
    assert all("CUDA_VISIBLE_DEVICES" not in e for e in envs)
    assert visible_gpus({}, driver_gpus=0) == []


def test_nproc_per_node_starts_that_many_workers_each_with_its_own_device():
    result = run_command(
        tfpar_command("launch", "--nproc-per-node", "2", "--", PY, "-c", PRINT_TASK),
        timeout=60,
        env={"CUDA_VISIBLE_DEVICES": "0,1", "TFPAR_NUM_CPU_DEVICES": None},
    )
    assert result.returncode == 0, result.output
    tasks = _tasks(result.output)
    assert [
        (t["index"], t["env"]["CUDA_VISIBLE_DEVICES"], t["env"]["LOCAL_RANK"]) for t in tasks
    ] == [(0, "0", "0"), (1, "1", "1")]
    assert len(tasks[0]["cluster"]["worker"]) == 2


def _node(rank, port, nproc=2, nnodes=2, timeout="60"):
    return tfpar_command(
        "launch",
        "--nnodes",
        str(nnodes),
        "--node-rank",
        str(rank),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        "--nproc-per-node",
        str(nproc),
        "--rendezvous-timeout",
        timeout,
        "--",
        PY,
        "-c",
        PRINT_TASK,
    )


def test_nnodes_agree_on_one_cluster_through_node_0_whichever_starts_first():
    import subprocess

    port = free_ports(1)[0]
    # Node 1 first: it waits for node 0's coordinator.
    node1 = subprocess.Popen(
        _node(1, port),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**__import__("os").environ, "TFPAR_NUM_CPU_DEVICES": "4"},
    )
    try:
        time.sleep(1)
        node0 = run_command(_node(0, port), timeout=60)
        out1, _ = node1.communicate(timeout=60)
    finally:
        node1.kill()
    assert node0.returncode == 0 and node1.returncode == 0, node0.output + out1
    assert (
        "node 0 of 2: workers 0 to 1 of 4" in node0.output
        and "node 1 of 2: workers 2 to 3 of 4" in out1
    )
    tasks = _tasks(node0.output) + _tasks(out1)
    assert [t["index"] for t in tasks] == [0, 1, 2, 3]
    assert all(t["cluster"] == tasks[0]["cluster"] for t in tasks)  # one cluster, every worker
    workers = tasks[0]["cluster"]["worker"]
    assert len(set(workers)) == 4 and all(w.startswith("127.0.0.1:") for w in workers)
    assert [t["env"]["LOCAL_RANK"] for t in tasks] == ["0", "1", "0", "1"]
    # node 1 had 4 to share
    assert [t["env"]["TFPAR_NUM_CPU_DEVICES"] for t in tasks] == ["1", "1", "2", "2"]
    with pytest.raises(OSError):  # the coordinator closed its port
        socket.create_connection(("127.0.0.1", port), timeout=1)


@pytest.mark.parametrize("case", ["missing", "port-taken", "nnodes"])
def test_a_rendezvous_that_cannot_complete_fails_on_every_node_naming_why(case):
    import subprocess

    port = free_ports(1)[0]
    others = {
        "missing": [],
        "port-taken": [_node(0, port, nnodes=3, timeout="5")],
        "nnodes": [_node(1, port, nnodes=3, timeout="20")],
    }[case]
    started = [
        subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for argv in others
    ]
    try:
        time.sleep(1)
        begin = time.monotonic()
        node0 = run_command(
            _node(0, port, nnodes=3 if case != "nnodes" else 2, timeout="3"), timeout=60
        )
        waited = time.monotonic() - begin
        outputs = [p.communicate(timeout=60)[0] for p in started]
    finally:
        for p in started:
            p.kill()
    if case == "port-taken":  # a second node 0 cannot coordinate; the first one times out alone
        assert node0.returncode == 3 and "cannot listen there" in node0.output, node0.output
        assert started[0].returncode == 3 and "node(s) 1, 2 of 3 did not join" in outputs[0], (
            outputs[0]
        )
        return
    assert node0.returncode == 3, node0.output
    expected = {
        "missing": "node(s) 1, 2 of 3 did not join the rendezvous within 3 s",
        "nnodes": "node 0 was started with --nnodes 2 and node 1 (127.0.0.1) with --nnodes 3",
    }[case]
    assert f"tfpar launch: error: The rendezvous failed: {expected}" in node0.output, node0.output
    assert all(expected in out and p.returncode == 3 for p, out in zip(started, outputs)), outputs
    assert "TASK" not in node0.output + "".join(outputs)  # no worker started anywhere
    assert waited < 30


def test_two_nodes_claiming_one_rank_are_named():
    import subprocess

    port = free_ports(1)[0]
    twins = [
        subprocess.Popen(
            _node(1, port, nnodes=3, timeout="20"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for _ in range(2)
    ]
    try:
        time.sleep(1)
        node0 = run_command(_node(0, port, nnodes=3, timeout="20"), timeout=60)
        outputs = [p.communicate(timeout=60)[0] for p in twins]
    finally:
        for p in twins:
            p.kill()
    assert (
        node0.returncode == 3
        and "two nodes say --node-rank 1: 127.0.0.1 and 127.0.0.1" in node0.output
    ), node0.output
    assert all(
        p.returncode == 3 and "two nodes say --node-rank 1" in out for p, out in zip(twins, outputs)
    )


def test_hosts_with_nproc_per_node_run_this_hosts_workers_on_consecutive_ports():
    first, second = free_ports(2)
    result = run_command(
        tfpar_command(
            "launch",
            "--hosts",
            f"127.0.0.1:{first},127.0.0.1:{second}",
            "--task-index",
            "1",
            "--nproc-per-node",
            "2",
            "--",
            PY,
            "-c",
            PRINT_TASK,
        ),
        timeout=60,
    )
    assert result.returncode == 0, result.output
    tasks = _tasks(result.output)
    assert [t["index"] for t in tasks] == [2, 3]
    assert tasks[0]["cluster"]["worker"] == [
        f"127.0.0.1:{p}" for p in (first, first + 1, second, second + 1)
    ]


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--hosts", "a:4,b:4", "--task-index", "0"],
            "horovodrun writes host:slots (-H a:4); in tfpar that is --hosts a "
            "with --nproc-per-node 4",
        ),
        (["-n", "2", "--nproc-per-node", "2"], "Give -n or --nproc-per-node, not both"),
        (
            ["--nnodes", "2", "--node-rank", "0"],
            "needs this node's --node-rank (0 to 1) and node 0's --master-addr",
        ),
        (
            ["--nnodes", "2", "--node-rank", "2", "--master-addr", "127.0.0.1"],
            "--node-rank must be below --nnodes",
        ),
        (
            ["--nnodes", "2", "-n", "2", "--node-rank", "0", "--master-addr", "x"],
            "Received: --nnodes with -n",
        ),
        (["--nproc-per-node", "0"], "nproc_per_node must be an int >= 1"),
    ],
)
def test_launch_spellings_refused_at_once_with_the_fix(args, message):
    begin = time.monotonic()
    result = run_command(
        tfpar_command("launch", *args, "--", PY, "-c", "print('started')"), timeout=60
    )
    assert result.returncode == 3 and message in result.output, result.output
    assert "started" not in result.output and time.monotonic() - begin < 30
