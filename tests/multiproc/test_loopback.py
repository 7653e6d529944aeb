"""Local jobs listen on loopback only; a process tfpar did not start says which ports it opens.

What listens is read from /proc/net/tcp and tcp6 (`tfpar._local.loopback.listening`): no test sends
anything to a non-loopback address.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

from tests.conftest import ROOT, run_command, tfpar_command

# A chief that serves its own task, as a parameter-server chief does, and reports what listens
# on the job's ports once every task is up.
_CHIEF = """
import json, os, time
import tensorflow as tf
from tfpar._local.loopback import listening
config = json.loads(os.environ["TF_CONFIG"])
cluster = config["cluster"]
server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name="chief", task_index=0, \
start=True)
ports = {int(a.rsplit(":", 1)[1]) for addresses in cluster.values() for a in addresses}
deadline = time.time() + 60
while time.time() < deadline:
    found = sorted({(a, p) for a, p in listening() if p in ports})
    if {p for _, p in found} == ports:
        break
    time.sleep(0.2)
print("REPORT " + json.dumps({"ports": sorted(ports), "listening": found}), flush=True)
"""


def _report(output):
    (line,) = [printed for printed in output.splitlines() if "REPORT " in printed]
    return json.loads(line.split("REPORT ", 1)[1])


def test_a_local_parameter_server_job_listens_on_loopback_only():
    # Without the tests' own LD_PRELOAD: the launcher must add tfpar's library itself.
    result = run_command(
        tfpar_command("launch", "--ps", "1", "-n", "1", "--", sys.executable, "-c", _CHIEF),
        timeout=180,
        env={"LD_PRELOAD": None},
    )
    assert result.returncode == 0, result.output[-3000:]
    report = _report(result.output)
    assert sorted({p for _, p in report["listening"]}) == report["ports"]  # chief, worker and ps
    assert {a for a, _ in report["listening"]} == {"127.0.0.1"}, report
    assert result.output.count("(loopback only)") == 2  # the ps and the worker server say so
    assert "listens on all interfaces" not in result.output


def _docs_block(fragment):
    from tests.conftest import document_blocks

    (block,) = [text for _, language, text, _ in document_blocks(("python",)) if fragment in text]
    return block


def _listening_tree(pid):
    """(address, port) of every TCP socket that ``pid`` or a descendant listens on (psutil, from
    /proc)."""
    import psutil

    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return set()
    found = set()
    for proc in procs:
        try:
            found |= {
                (c.laddr.ip, c.laddr.port)
                for c in proc.net_connections("tcp")
                if c.status == psutil.CONN_LISTEN
            }
        except psutil.NoSuchProcess:
            pass
    return found


LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1", "::1"}


def test_the_readmes_parameter_server_block_run_as_a_plain_script_keeps_every_server_on_loopback(
    tmp_path,
):
    """The documented ParameterServer.local() block as a user runs it (test_docs.py leaves it to
    this test) (`python train.py`, no tfpar launch, no LD_PRELOAD): every socket its process tree
    listens on while it trains is on loopback, the chief's included (local() starts the script again
    with the library), and the job's end prints none of TensorFlow's remote-function cleanup
    errors."""
    script = tmp_path / "train.py"
    script.write_text(_docs_block("ParameterServer.local("))
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("LD_PRELOAD", "PYTHONPATH", "TF_USE_LEGACY_KERAS")
    }
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    seen, deadline = set(), time.monotonic() + 300
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            seen |= _listening_tree(proc.pid)
            time.sleep(0.1)
        output = proc.communicate(timeout=max(1, deadline - time.monotonic()))[0].decode(
            errors="replace"
        )
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, output[-3000:]
    assert "Epoch 2/2" in output and "Traceback" not in output
    assert "'ps': ['127.0.0.1:" in output  # the cluster it printed
    assert (
        output.count(
            "ParameterServer.local() starts this script again with tfpar's loopback library"
        )
        == 1
    )
    # the chief, the ps and the two workers at least
    assert len({port for _, port in seen}) >= 4, seen
    assert {address for address, _ in seen} <= LOOPBACK, seen
    assert "listens on all interfaces" not in output
    assert output.count("Failed to remove function remotely") == 0, output[-3000:]


def _piped(script, timeout=180):
    """``python -`` reading ``script`` from stdin: a session tfpar cannot start again."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    done = subprocess.run(
        [sys.executable, "-"],
        input=script.encode(),
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=timeout,
    )
    return done.returncode, done.stdout.decode(errors="replace")


def test_a_parameter_server_chief_that_cannot_start_again_is_refused_before_any_server_starts():
    code, output = _piped(
        "from tfpar._local.loopback import _children\n"
        "from tfpar.strategies.parameter_server import ParameterServer\n"
        "try:\n"
        "    ParameterServer.local(num_workers=1, num_ps=1)\n"
        "except ValueError as e:\n"
        "    print('REFUSED', len(_children()), e)\n"
    )
    assert code == 0, output[-3000:]
    (line,) = [printed for printed in output.splitlines() if printed.startswith("REFUSED ")]
    assert line.startswith("REFUSED 0 ParameterServer.local() keeps every server on 127.0.0.1"), (
        line
    )
    assert "an interactive session" in line and "Received: listen_on_all_interfaces=False" in line
    assert (
        "`tfpar launch -n 1 -- python train.py`" in line and "listen_on_all_interfaces=True" in line
    )


def test_a_parameter_server_chief_that_opts_in_names_its_open_port():
    """With listen_on_all_interfaces=True the servers (children) still listen on loopback; the
    chief's own server, in that process, cannot, and one warning says so."""
    code, output = _piped(
        "import json, tfpar\n"
        "from tfpar.strategies.parameter_server import ParameterServer\n"
        "from tfpar._local.loopback import listening\n"
        "s = ParameterServer.local(num_workers=1, num_ps=1, listen_on_all_interfaces=True)\n"
        "c = s.config.cluster.cluster\n"
        "ports = {int(a.rsplit(':', 1)[1]): r for r in c for a in c[r]}\n"
        "print('REPORT ' + json.dumps(sorted({(a, ports[p]) for a, p in listening() if p in "
        "ports})))\n"
        "s.shutdown()\n"
    )
    assert code == 0, output[-3000:]
    (line,) = [printed for printed in output.splitlines() if printed.startswith("REPORT ")]
    found = json.loads(line[len("REPORT ") :])
    assert {a for a, r in found if r in ("ps", "worker")} == {"127.0.0.1"}
    chief_addresses = {a for a, r in found if r == "chief"}
    assert chief_addresses and chief_addresses <= {"0.0.0.0", "::"}
    warnings = [
        printed for printed in output.splitlines() if "listens on all interfaces" in printed
    ]
    assert len(warnings) == 1 and "this process (the chief)" in warnings[0]
    assert "tfpar launch -n 1 -- python" in warnings[0]


def test_doctor_lists_what_a_running_local_job_listens_on():
    import os
    import signal
    import subprocess
    import time

    from tests.conftest import ROOT

    job = subprocess.Popen(
        tfpar_command(
            "launch",
            "--ps",
            "1",
            "-n",
            "1",
            "--",
            sys.executable,
            "-c",
            "import time; time.sleep(120)",
        ),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        serving, deadline = 0, time.monotonic() + 90
        while serving < 2 and time.monotonic() < deadline:
            serving += "(loopback only)" in job.stdout.readline()
        assert serving == 2
        result = run_command(tfpar_command("doctor"), timeout=120)
        assert result.returncode == 0, result.output
        import psutil

        # other tests' jobs may run too
        ours = {p.pid for p in psutil.Process(job.pid).children(recursive=True)}
        lines = [printed for printed in result.output.splitlines() if printed.startswith("jobs:")]
        for task in ("ps 0", "worker 0"):
            (line,) = [
                printed
                for printed in lines
                if printed.startswith(f"jobs:        {task} (pid ")
                and int(re.search(r"\(pid (\d+)", printed).group(1)) in ours
            ]
            assert "listens on 127.0.0.1:" in line and line.endswith("(loopback only)"), line
    finally:
        os.killpg(job.pid, signal.SIGTERM)
        job.communicate(timeout=60)


_ONE_RANK = """
import json, os
from tfpar.strategies.horovod import HorovodStrategy
from tfpar._local.loopback import _listen_rows
strategy = HorovodStrategy()

def sockets(pid):
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    return sorted({address for address, _, inode in _listen_rows("self") if inode in inodes})

me = str(os.getpid())
children = [p for p in os.listdir("/proc") if p.isdigit() and \
open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1] == me]
print("REPORT " + json.dumps({"size": strategy.size, "self": sockets("self"),
                              "children": [a for c in children for a in sockets(c)],
                              "LD_PRELOAD": os.environ.get("LD_PRELOAD")}), flush=True)
"""


def test_a_one_rank_horovod_strategy_opens_no_port_beyond_loopback(horovod_installed):
    """Under plain `python` (no horovodrun), MPI's singleton and its daemon stay on loopback, and
    the process's own environment is left as it was."""
    result = run_command([sys.executable, "-c", _ONE_RANK], timeout=180, env={"LD_PRELOAD": None})
    assert result.returncode == 0, result.output[-3000:]
    report = _report(result.output)
    assert report["size"] == 1 and report["self"] == [] and report["LD_PRELOAD"] is None
    assert set(report["children"]) <= {"127.0.0.1"}, report
