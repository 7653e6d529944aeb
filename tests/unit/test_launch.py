"""The launcher, with plain Python children (no TensorFlow), through the real CLI."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, run_command, tfpar_command
from tfpar.launch import LaunchError, launch

PY = sys.executable


def _script(body):
    return [
        PY,
        "-c",
        "import os, json, sys, time, signal\n"
        "task = json.loads(os.environ['TF_CONFIG'])['task']\n" + body,
    ]


def test_every_worker_gets_its_tf_config_and_prefixed_output():
    result = run_command(
        tfpar_command(
            "launch",
            "-n",
            "3",
            "--",
            *_script(
                "c = json.loads(os.environ['TF_CONFIG'])\n"
                "print('index', task['index'], 'of', len(c['cluster']['worker']), "
                "c['cluster']['worker'][task['index']])\n"
            ),
        ),
        timeout=60,
    )
    assert result.returncode == 0, result.output
    lines = result.output.splitlines()
    for i in range(3):
        (line,) = [printed for printed in lines if printed.startswith(f"[worker {i}] index")]
        assert f"index {i} of 3 127.0.0.1:" in line


def test_failed_worker_stops_the_others_and_is_named(tmp_path):
    pid_file = tmp_path / "survivor.pid"
    start = time.monotonic()
    result = run_command(
        tfpar_command(
            "launch",
            "-n",
            "2",
            "--grace",
            "5",
            "--",
            *_script(
                "if task['index'] == 1:\n"
                "    time.sleep(1); print('failing'); sys.exit(3)\n"
                f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
                "time.sleep(600)\n"
            ),
        ),
        timeout=60,
    )
    elapsed = time.monotonic() - start
    assert result.returncode == 3, result.output
    assert "worker 1 exited with code 3" in result.output
    assert "[worker 1] failing" in result.output
    assert elapsed < 30
    survivor = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(survivor, 0)


def test_a_port_taken_before_its_server_binds_it_starts_the_job_again_on_fresh_ports(tmp_path):
    """Another program binds worker 1's port between the launcher's choice and the worker's own bind
    (here a process in a session of its own, which outlives the worker, as another program would):
    the job starts again on fresh ports, counting no restart (--max-restarts 0), and says why; every
    port it chose lies outside the ephemeral range."""
    from tfpar.cluster.addresses import ephemeral_ports

    thief_pid = tmp_path / "thief.pid"
    thief = (
        "import socket, sys, time; s = socket.create_server((sys.argv[1], int(sys.argv[2]))); "
        "print('bound', flush=True); time.sleep(60)"
    )
    body = (
        "import socket, subprocess\n"
        "address = json.loads(os.environ['TF_CONFIG'])['cluster']['worker'][task['index']]\n"
        "host, port = address.rsplit(':', 1)\n"
        f"if task['index'] == 1 and not os.path.exists({str(thief_pid)!r}):\n"
        f"    other = subprocess.Popen([sys.executable, '-c', {thief!r}, host, port],\n"
        "                             start_new_session=True, stdout=subprocess.PIPE, text=True)\n"
        f"    open({str(thief_pid)!r}, 'w').write(str(other.pid))\n"
        "    other.stdout.readline()  # the port is taken\n"
        "server = socket.create_server((host, int(port)))\n"
        "print('serving on', port)\n"
    )
    try:
        result = run_command(
            tfpar_command("launch", "-n", "2", "--grace", "5", "--", *_script(body)), timeout=60
        )
    finally:
        if thief_pid.exists():
            try:
                os.killpg(int(thief_pid.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert thief_pid.exists() and result.returncode == 0, result.output
    assert (
        result.output.count(
            "worker 1's port was taken by another process after tfpar chose it; starting the "
            "job again on fresh ports"
        )
        == 1
    ), result.output
    assert "Address already in use" in result.output and "restart 1 of" not in result.output
    ports = [
        int(line.rsplit(" ", 1)[1]) for line in result.output.splitlines() if "serving on" in line
    ]
    low, high = ephemeral_ports()
    assert len(ports) >= 2 and not any(low <= port <= high for port in ports), ports


def test_a_task_that_says_address_in_use_of_another_port_and_fails_is_not_started_again():
    """A task printing "Address already in use" about some port of its own (a metrics server, say)
    and failing is a failure of the job: its own port is free, so no fresh start is made."""
    result = run_command(
        tfpar_command(
            "launch",
            "-n",
            "1",
            "--grace",
            "5",
            "--",
            *_script("print('OSError: [Errno 98] Address already in use')\nsys.exit(2)\n"),
        ),
        timeout=60,
    )
    assert result.returncode == 2, result.output
    assert "port was taken" not in result.output and "worker 0 exited with code 2" in result.output


def test_the_last_restart_failing_gives_up_with_its_code_and_names_it():
    """--max-restarts 1, worker 1 SIGKILLed in both runs: one restart, warned that no
    FaultTolerance backup was made, then the job ends with the last failure's code, named."""
    result = run_command(
        tfpar_command(
            "launch",
            "-n",
            "2",
            "--max-restarts",
            "1",
            "--grace",
            "5",
            "--",
            *_script(
                "if task['index'] == 1:\n"
                "    time.sleep(0.5); os.kill(os.getpid(), signal.SIGKILL)\n"
                "time.sleep(600)\n"
            ),
        ),
        timeout=60,
    )
    assert result.returncode == 128 + 9, result.output  # SIGKILL, as a shell reports it
    assert (
        "tfpar launch: restart 1 of 1 at " in result.output
        and "worker 1 was killed by SIGKILL" in result.output
    )
    assert (
        "warning: the command made no tfpar.callbacks.FaultTolerance backup, so training starts "
        "over" in result.output
    )
    assert (
        "giving up after 1 restart(s); the last failure: worker 1 was killed by SIGKILL"
        in result.output
    )


@pytest.mark.parametrize(
    "launcher", [["-n", "1"], ["--horovod", "-n", "2"]], ids=["local", "horovod"]
)
def test_launch_with_a_timeline_leaves_tensorflow_out_of_the_launcher(tmp_path, launcher, request):
    """``tfpar launch --timeline DIR`` checks the folder before the tasks start and (under
    --horovod) merges Horovod's timeline after them, all in the launcher, which never imports
    TensorFlow."""
    if "--horovod" in launcher:
        request.getfixturevalue("horovod_installed")
    folder = tmp_path / "run"
    code = (
        "import sys; from tfpar.cli import main; "
        f"status = main(['launch', '--timeline', {str(folder)!r}, *{launcher!r}, '--', "
        "sys.executable, '-c', "
        "'print(1)']); print('STATUS', status, 'TENSORFLOW', 'tensorflow' in sys.modules)"
    )
    result = run_command([PY, "-c", code], timeout=120)
    assert "STATUS 0 TENSORFLOW False" in result.output, result.output[-3000:]
    assert folder.is_dir()


@pytest.mark.parametrize("grace", [1.0, 4.0])
def test_a_worker_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path, grace):
    """Worker 1 ignores SIGTERM: from worker 0's failure the launcher waits the grace period,
    then SIGKILLs it and returns."""
    out = open(os.devnull, "w")
    pid_file, exit_file = tmp_path / "pid", tmp_path / "exit"
    with pytest.raises(LaunchError) as info:
        launch(
            _script(
                "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                f"if task['index'] == 1: open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
                "if task['index'] == 0:\n"
                f"    while not os.path.exists({str(pid_file)!r}): time.sleep(0.05)\n"
                f"    open({str(exit_file)!r}, 'w').write(repr(time.time())); sys.exit(5)\n"
                "time.sleep(600)\n"
            ),
            num_workers=2,
            grace_seconds=grace,
            out=out,
        )
    elapsed = time.time() - float(exit_file.read_text())
    assert info.value.task.name == "worker 0" and info.value.returncode == 5
    assert grace <= elapsed < grace + 5, elapsed
    with pytest.raises(ProcessLookupError):  # worker 1 is gone
        os.kill(int(pid_file.read_text()), 0)


def test_ctrl_c_is_forwarded_to_every_worker():
    proc = subprocess.Popen(
        tfpar_command(
            "launch",
            "-n",
            "2",
            "--",
            *_script(
                "signal.signal(signal.SIGINT, lambda *a: (print('got SIGINT', flush=True), "
                "sys.exit(0)))\n"
                "print('ready', flush=True)\n"
                "time.sleep(600)\n"
            ),
        ),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        text=True,
    )
    try:
        ready = 0
        deadline = time.monotonic() + 30
        while ready < 2 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            ready += "ready" in line
        assert ready == 2
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGINT
    assert "[worker 0] got SIGINT" in output and "[worker 1] got SIGINT" in output


def test_multi_host_mode_runs_only_this_hosts_task():
    result = run_command(
        tfpar_command(
            "launch",
            "--hosts",
            "10.1.2.3:5001,10.1.2.4",
            "--task-index",
            "1",
            "--",
            *_script("print(os.environ['TF_CONFIG'])\n"),
        ),
        timeout=60,
    )
    assert result.returncode == 0, result.output
    (line,) = [
        printed for printed in result.output.splitlines() if printed.startswith("[worker 1] {")
    ]
    config = json.loads(line[len("[worker 1] ") :])
    assert config == {
        "cluster": {"worker": ["10.1.2.3:5001", "10.1.2.4:2222"]},
        "task": {"type": "worker", "index": 1},
    }
    assert "[worker 0]" not in result.output
    # Other hosts must reach this one, so its port is open on every interface: said once, at start.
    assert (
        result.output.count(
            "tfpar launch: WARNING: worker 1 listens on all interfaces, port(s) 2222, "
            "without authentication"
        )
        == 1
    )


def test_cluster_file(tmp_path):
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"cluster": {"chief": ["c:1"], "worker": ["w:1"]}}))
    result = run_command(
        tfpar_command(
            "launch",
            "--cluster",
            str(path),
            "--task-type",
            "chief",
            "--task-index",
            "0",
            "--",
            *_script("print('role', task['type'], task['index'])\n"),
        ),
        timeout=60,
    )
    assert result.returncode == 0 and "[chief 0] role chief 0" in result.output


@pytest.mark.parametrize(
    "args, match",
    [
        (["-n", "0", "--", PY, "-c", "pass"], r"needs at least one worker. Received: -n 0"),
        (["-n", "2"], r"Nothing to launch"),
        (["--", PY, "-c", "pass"], r"Received: neither -n nor --hosts/--cluster"),
        (
            ["--ps", "-1", "-n", "2", "--", PY, "-c", "pass"],
            r"--ps must be an int >= 0. Received: --ps -1",
        ),
        (["--hosts", "a,b", "--", PY, "-c", "pass"], r"needs this machine's --task-index"),
        (
            ["--hosts", "a,b", "--task-index", "2", "--", PY, "-c", "pass"],
            r"Received: task index 2",
        ),
    ],
)
def test_bad_launch_arguments(args, match):
    import re

    result = run_command(tfpar_command("launch", *args), timeout=60)
    assert result.returncode == 3
    assert re.search(match, result.output), result.output


@pytest.mark.parametrize(
    "argv, backend",
    [
        (["-n", "2"], "local"),
        (["-n", "1", "--ps", "1"], "local"),
        (["--hosts", "a,b", "--task-index", "0"], "hosts"),
        (["--cluster", "c.json", "--task-index", "0"], "hosts"),
        (["--slurm"], "slurm"),
        # the "not both" mistake is named first
        (["--slurm", "--hosts", "a", "--cluster", "c.json"], "hosts"),
        (["--horovod", "-n", "2"], "horovod"),
        (["--horovod", "--hosts", "a"], "horovod"),  # which refuses --hosts, naming the fix
        (["--nproc-per-node", "2"], "local"),
        (["--hosts", "a,b", "--nproc-per-node", "2", "--task-index", "0"], "hosts"),
        (["--nnodes", "2", "--node-rank", "1", "--master-addr", "a"], "nodes"),
        (["--nnodes", "2:3", "--master-addr", "a"], "nodes"),
        (["--horovod", "--nproc-per-node", "2"], "horovod"),
        (["--min-workers", "2", "-n", "3"], "elastic"),
        (["--host-discovery-file", "hosts"], "elastic"),
        # which refuses --hosts, naming it
        (["--max-workers", "2", "--hosts", "a,b", "--task-index", "0"], "elastic"),
    ],
)
def test_each_command_line_picks_one_launcher_backend_from_the_table(argv, backend):
    from tfpar.cli import _parser
    from tfpar.launch.backends import BACKENDS, backend_for
    from tfpar.launch.command import config_from_args

    config = config_from_args(_parser().parse_args(["launch", *argv, "--", PY, "-c", "pass"]))
    assert config.command == (PY, "-c", "pass")
    assert backend_for(config).name == backend
    assert [b.name for b in BACKENDS] == ["elastic", "horovod", "slurm", "nodes", "hosts", "local"]


def test_the_supervisor_gives_heartbeat_files_in_its_folder_and_merges_horovods_timeline_on_exit(
    tmp_path,
):
    from tfpar._tasks.env import HEARTBEAT_VARIABLE, TIMELINE_VARIABLE
    from tfpar.launch.supervisor import Supervisor

    said = []
    with Supervisor(None, said.append) as quiet:
        assert quiet.task_env("worker 0") == {}
        quiet.check()  # no heartbeats: nothing to watch
    (tmp_path / "timeline.json").write_text(
        json.dumps({"traceEvents": [{"ph": "X", "pid": 0, "ts": 1, "dur": 1}]})
    )
    (tmp_path / "horovod_timeline.json").write_text(
        json.dumps(
            [
                {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "allreduce.grad"}},
                {"ph": "B", "pid": 0, "ts": 5, "args": {"start_time_since_epoch_in_micros": 1000}},
            ]
        )
    )
    with Supervisor(5, said.append, env={TIMELINE_VARIABLE: str(tmp_path)}) as supervisor:
        path = supervisor.task_env("worker 1")[HEARTBEAT_VARIABLE]
        folder = os.path.dirname(path)
        assert os.path.basename(path) == "worker-1" and os.path.isdir(folder)
        supervisor.check()  # no task has beaten yet: none is stalled
        supervisor.finish()
    assert not os.path.exists(folder) and said == []
    merged = json.loads((tmp_path / "timeline.json").read_text())["traceEvents"]
    assert any(e.get("args", {}).get("name") == "Horovod allreduce.grad" for e in merged), merged
    with pytest.raises(ValueError, match=r"heartbeat_timeout.*Received: heartbeat_timeout=0"):
        Supervisor(0, said.append)


@pytest.mark.parametrize(
    "options, error, match",
    [
        (
            {"command": "python train.py"},
            TypeError,
            r"command must be a list of strings.*Received: command='python",
        ),
        ({"task_type": "boss"}, ValueError, r"task_type.*'boss'"),
        (
            {"nnodes": "3:1"},
            ValueError,
            r"--nnodes MIN:MAX needs MIN <= MAX. Received: --nnodes 3:1",
        ),
        ({"elastic_batch": "double"}, ValueError, r"elastic_batch.*'double'"),
    ],
)
def test_a_launch_config_refuses_a_bad_value_when_made(options, error, match):
    from tfpar.launch.config import LaunchConfig

    with pytest.raises(error, match=match):
        LaunchConfig(**{"command": (PY, "-c", "pass"), **options})


def test_the_launch_options_are_grouped_by_the_back_end_that_reads_them():
    from tfpar.cli import _parser

    launch = _parser()._subparsers._group_actions[0].choices["launch"]
    groups = {
        group.title: [a.dest for a in group._group_actions] for group in launch._action_groups
    }
    assert groups["several identical hosts (--nnodes, as torchrun)"] == [
        "nnodes",
        "node_rank",
        "master_addr",
        "master_port",
        "rendezvous_timeout",
    ]
    assert (
        "elastic_batch" in groups["an elastic job (--min-workers, --max-workers, --nnodes MIN:MAX)"]
    )
    assert groups["SLURM and Horovod"] == ["slurm", "horovod"]
    assert "several hosts, each named (--hosts, --cluster)" in launch.format_help()


def test_a_launch_config_names_the_options_given_by_their_flags():
    from tfpar.launch.config import LaunchConfig

    config = LaunchConfig(command=(PY,), workers=2, task_index=0, ps=0, slurm=True)
    assert config.given("workers", "task_index", "ps", "slurm", "hosts") == [
        "-n",
        "--task-index",
        "--slurm",
    ]


def test_the_command_freezes_its_objects_before_its_process_exits_and_a_call_from_python_not():
    """``tfpar`` run as the command (no argv: the process ends when it returns) freezes its objects,
    so that the interpreter's exit does not walk them; called from Python with arguments, it leaves
    the caller's collector alone."""
    launch_nothing = ["launch", "-n", "1", "--", PY, "-c", "pass"]
    code = (
        "import gc, sys; from tfpar.cli import main; "
        f"status = main({launch_nothing!r}); print('CALLED', status, gc.get_freeze_count()); "
        f"sys.argv = ['tfpar', *{launch_nothing!r}]; "
        "status = main(); print('COMMAND', status, gc.get_freeze_count() > 0)"
    )
    result = run_command([PY, "-c", code], timeout=120)
    assert "CALLED 0 0" in result.output and "COMMAND 0 True" in result.output, result.output
