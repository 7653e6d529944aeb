"""An elastic job across hosts as torchrun's users start one, the hosts standing on 127.0.0.1: the
same ``tfpar launch --nnodes 2:3 --master-addr 127.0.0.1`` line started three times (the first hosts
the rendezvous), and a fourth time once ``RECORDS/back`` says capacity returned (the job of
tests/multiproc/scripts/exactly_once.py --elastic-nodes). Shared by its test and
bench/elastic.py."""

import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "multiproc", "scripts", "exactly_once.py")


def run_agents(folder, batch, timeout=420.0):
    """Runs the job with its backup and records in ``folder``; returns (each agent's exit code, its
    output)."""
    from tfpar.cluster.addresses import free_ports

    records = os.path.join(folder, "records")
    os.makedirs(records, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "tfpar.cli",
        "launch",
        "--nnodes",
        "2:3",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_ports(1)[0]),
        "--elastic-batch",
        batch,
        "--",
        sys.executable,
        SCRIPT,
        os.path.join(folder, "backup"),
        records,
        "--elastic-nodes",
    ]
    env = {**os.environ, "PYTHONPATH": ROOT, "TFPAR_TEST_KERAS": "2"}
    paths, logs, agents = [], [], []

    def agent():
        paths.append(os.path.join(folder, f"agent{len(paths)}.log"))
        logs.append(open(paths[-1], "w"))
        agents.append(
            subprocess.Popen(
                argv,
                cwd=ROOT,
                env=env,
                stdout=logs[-1],
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )

    def read(path):
        with open(path) as f:
            return f.read()

    deadline = time.monotonic() + timeout
    try:
        agent()
        while "hosting the rendezvous" not in read(paths[0]):
            if agents[0].poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"the first agent did not host the rendezvous:\n{read(paths[0])}"
                )
            time.sleep(0.1)
        agent()
        agent()
        while any(a.poll() is None for a in agents) and time.monotonic() < deadline:
            if len(agents) == 3 and os.path.exists(os.path.join(records, "back")):
                agent()  # capacity returns: another host's agent joins
            time.sleep(0.2)
    finally:
        for a in agents:
            if a.poll() is None:
                os.killpg(a.pid, signal.SIGKILL)
            a.wait(timeout=30)
        for f in logs:
            f.close()
    return [a.returncode for a in agents], [read(p) for p in paths]
