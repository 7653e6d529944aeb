"""Nothing a launcher starts outlives it: kills, hang-ups, failed starts, grandchildren, closed
pipes.

Plain Python children (no TensorFlow). Each child writes its pid to a folder; a test ends by
counting which of them still run (a zombie left for init to reap counts as ended).
"""

import os
import signal
import subprocess
import sys
import time

import pytest

import tfpar.launch.job as job_module
from tests.conftest import ROOT, run_command, tfpar_command
from tfpar.launch import LaunchError, Task, run_tasks

PY = sys.executable


def _running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _pids(folder):
    return [int(p.name) for p in folder.iterdir() if p.name.isdigit()]


def _wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout} s for {what}")
        time.sleep(0.05)


def _orphans_after(folder, timeout=15):
    """The recorded processes still running once ``timeout`` has passed (or none is left)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_running(p) for p in _pids(folder)):
        time.sleep(0.1)
    return [p for p in _pids(folder) if _running(p)]


def _sleeper(folder, seconds=120):
    """A worker that records itself and a background grandchild, then sleeps."""
    return [
        PY,
        "-c",
        "import os, subprocess, time\n"
        f"open(os.path.join({str(folder)!r}, str(os.getpid())), 'w').close()\n"
        f"child = subprocess.Popen(['sleep', '{seconds}'])\n"
        f"open(os.path.join({str(folder)!r}, str(child.pid)), 'w').close()\n"
        "print('ready', flush=True)\n"
        f"time.sleep({seconds})\n",
    ]


def _start_launcher(args):
    return subprocess.Popen(
        tfpar_command("launch", *args),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


@pytest.mark.parametrize(
    "mode, sig",
    [
        ("launch", signal.SIGKILL),
        ("launch", signal.SIGHUP),
        ("launch", signal.SIGTERM),
        ("horovod", signal.SIGKILL),
        ("horovod", signal.SIGTERM),
    ],
    ids=lambda v: v.name if isinstance(v, signal.Signals) else v,
)
def test_killing_the_launcher_leaves_no_worker_and_no_grandchild(tmp_path, mode, sig, request):
    """2 workers (or 2 Horovod ranks, which horovodrun starts in sessions of their own), each
    with a child of its own; the signal goes to the launcher alone, as a `kill -9 <pid>` does."""
    if mode == "horovod":
        request.getfixturevalue("horovod_installed")
    proc = _start_launcher(
        [
            *(["--horovod"] if mode == "horovod" else []),
            "-n",
            "2",
            "--grace",
            "3",
            "--",
            *_sleeper(tmp_path),
        ]
    )
    try:
        _wait_for(lambda: len(_pids(tmp_path)) == 4, 120, "2 workers and their 2 children")
        proc.send_signal(sig)
        proc.wait(timeout=60)
        assert _orphans_after(tmp_path) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in _pids(tmp_path):
            if _running(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("exit_code", [0, 1])
def test_a_workers_background_children_end_with_the_job(tmp_path, exit_code):
    marker = tmp_path / "grandchild"
    result = run_command(
        tfpar_command(
            "launch",
            "-n",
            "1",
            "--grace",
            "2",
            "--",
            "bash",
            "-c",
            f"sleep 60 & echo $! > {marker}; exit {exit_code}",
        ),
        timeout=60,
    )
    assert result.returncode == exit_code, result.output
    grandchild = int(marker.read_text())
    deadline = time.monotonic() + 10
    while _running(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(grandchild)


def test_a_closed_output_pipe_does_not_hang_the_job(tmp_path):
    done = tmp_path / "done"
    script = f"[print(i) for i in range(200000)]; open({str(done)!r}, 'w').close()"
    pipeline = subprocess.Popen(
        f"{' '.join(tfpar_command('launch', '-n', '1', '--', PY, '-c', repr(script)))} | head -1",
        shell=True,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        output, _ = pipeline.communicate(timeout=60)
    finally:
        if pipeline.poll() is None:
            os.killpg(pipeline.pid, signal.SIGKILL)
    assert output.decode().strip() == "[worker 0] 0"
    _wait_for(done.exists, 30, "the worker to finish writing its 200000 lines")


def test_sigint_gets_the_grace_period_before_sigterm():
    proc = _start_launcher(
        [
            "-n",
            "1",
            "--grace",
            "10",
            "--",
            PY,
            "-c",
            "import signal, sys, time\n"
            "def on_int(*_):\n"
            "    print('saving', flush=True); time.sleep(2); print('saved', flush=True); "
            "sys.exit(0)\n"
            "signal.signal(signal.SIGINT, on_int)\n"
            "signal.signal(signal.SIGTERM, lambda *_: (print('got SIGTERM', flush=True), "
            "sys.exit(1)))\n"
            "print('ready', flush=True); time.sleep(120)\n",
        ]
    )
    try:
        _wait_for(lambda: b"ready" in proc.stdout.readline(), 30, "the worker")
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = output.decode()
    assert proc.returncode == 128 + signal.SIGINT
    assert text.count("[worker 0] saving") == 1 and "[worker 0] saved" in text, text
    assert "got SIGTERM" not in text


def test_a_task_that_cannot_start_stops_those_started(tmp_path, monkeypatch):
    monkeypatch.setattr(job_module, "SERVER_COMMAND", (str(tmp_path / "no-such-server"),))
    cluster = {"worker": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]}
    tasks = [
        Task(task_type="worker", task_index=0),
        Task(task_type="ps", task_index=0, serves=True),
    ]
    with pytest.raises(
        LaunchError,
        match=r"could not start ps 0 \(.*no-such-server\).*The 1 task\(s\) already "
        r"started were stopped",
    ):
        run_tasks(_sleeper(tmp_path), cluster, tasks, out=open(os.devnull, "w"), grace_seconds=2)
    assert _orphans_after(tmp_path) == []


def test_too_many_tasks_for_the_open_file_limit_are_refused_before_any_starts(tmp_path):
    limit = (
        "import resource, sys, tfpar.cli; resource.setrlimit(resource.RLIMIT_NOFILE, (32, 32)); "
    )
    result = run_command(
        [
            PY,
            "-c",
            limit + "sys.argv[0] = 'tfpar'; sys.exit(tfpar.cli.main())",
            "launch",
            "-n",
            "28",
            "--",
            *_sleeper(tmp_path),
        ],
        timeout=60,
    )
    assert result.returncode == 3, result.output
    assert (
        "28 tasks need about 116 open files in the launcher, and this shell allows 32 (ulimit -n)"
        in result.output
    )
    assert _pids(tmp_path) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name)
def test_tune_leaves_no_trial_running(tmp_path, sig):
    env = {**os.environ, "PYTHONPATH": ROOT, "TFPAR_TEST_PID_DIR": str(tmp_path)}
    proc = subprocess.Popen(
        tfpar_command(
            "tune",
            "--model",
            "tests.models:sleeping_model",
            "--space",
            '{"per_replica_batch": [8, 16]}',
            "--trial-timeout",
            "300",
        ),
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _wait_for(lambda: len(_pids(tmp_path)) == 1, 120, "the first trial")
        proc.send_signal(sig)
        output, _ = proc.communicate(timeout=60)
        assert _orphans_after(tmp_path) == []
        assert len(_pids(tmp_path)) == 1  # the second trial never started
        if sig == signal.SIGTERM:
            assert proc.returncode == 128 + signal.SIGTERM
            assert (
                b"tfpar tune: error: interrupted by SIGTERM; the running trial was stopped"
                in output
            )
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_trial_past_its_timeout_is_stopped_and_counted_as_failed(tmp_path):
    result = run_command(
        tfpar_command(
            "tune",
            "--model",
            "tests.models:sleeping_model",
            "--space",
            '{"per_replica_batch": [8]}',
            "--trial-timeout",
            "15",
        ),
        timeout=180,
        env={"PYTHONPATH": ROOT, "TFPAR_TEST_PID_DIR": str(tmp_path)},
    )
    assert result.returncode == 1, result.output
    assert "timed out after 15.0 s" in result.output
    assert len(_pids(tmp_path)) == 1 and _orphans_after(tmp_path) == []


def _signalled_launch(tmp_path, sig, grace, task_code):
    """``tfpar launch -n 2 --grace GRACE`` of ``task_code``; ``sig`` to the launcher once both tasks
    run. Returns (seconds from the signal to the launcher's exit, its exit code, output, task
    pids)."""
    code = (
        f"import os, signal, time\nopen(os.path.join({str(tmp_path)!r}, str(os.getpid())), "
        f"'w').close()\n{task_code}"
    )
    proc = _start_launcher(["-n", "2", "--grace", str(grace), "--", PY, "-c", code])
    try:
        _wait_for(lambda: len(_pids(tmp_path)) == 2, 60, "both tasks")
        sent = time.monotonic()
        proc.send_signal(sig)
        output, _ = proc.communicate(timeout=grace + 30)
        return time.monotonic() - sent, proc.returncode, output.decode(), _pids(tmp_path)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.parametrize(
    "sig", [signal.SIGHUP, signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name
)
def test_the_launcher_leaves_as_soon_as_its_tasks_have_exited(tmp_path, sig):
    """The grace period is a maximum: tasks that exit at once on the signal let the launcher go at
    once, with the exit code and message as before (here well inside a 30 s grace)."""
    waited, code, output, pids = _signalled_launch(tmp_path, sig, 30, "time.sleep(120)")
    assert code == 128 + sig, output
    assert f"tfpar launch: {sig.name} received and passed on; every task has 30 s to exit" in output
    assert waited < 10, f"the launcher waited {waited:.1f} s for tasks that had exited"
    assert not any(_running(p) for p in pids)


def test_a_task_that_ignores_sigterm_is_still_killed_after_the_grace(tmp_path):
    waited, code, output, pids = _signalled_launch(
        tmp_path,
        signal.SIGHUP,
        2,
        "signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(120)",
    )
    assert code == 128 + signal.SIGHUP, output
    assert waited >= 2  # the whole grace, then SIGKILL
    assert _orphans_after(tmp_path, timeout=5) == []


def test_when_a_task_dies_the_others_are_stopped_without_waiting_out_the_grace(tmp_path):
    """Worker 1 of 3 SIGKILLs itself 2 s after it starts; the others exit on SIGTERM: the launcher
    ends with them, not after --grace 30."""
    code = (
        "import json, os, signal, time\n"
        f"open(os.path.join({str(tmp_path)!r}, str(os.getpid())), 'w').close()\n"
        "if json.loads(os.environ['TF_CONFIG'])['task']['index'] == 1:\n"
        "    time.sleep(2); os.kill(os.getpid(), signal.SIGKILL)\n"
        "time.sleep(120)\n"
    )
    started = time.monotonic()
    result = run_command(
        tfpar_command("launch", "-n", "3", "--grace", "30", "--", PY, "-c", code), timeout=90
    )
    took = time.monotonic() - started
    assert result.returncode == 128 + signal.SIGKILL, result.output
    assert "tfpar launch: error: worker 1 was killed by SIGKILL" in result.output
    assert took < 2 + 10, f"the launcher took {took:.1f} s"
    assert _orphans_after(tmp_path, timeout=5) == []


def test_a_stopped_tasks_stacks_are_dumped_by_its_main_thread_where_it_stopped():
    """The launcher's stack request reaches the main thread (tgkill), which faulthandler then dumps
    where it stopped, with the process's other threads; a process-directed signal could run the dump
    on another thread while the main thread ran on (it crashed a frozen Horovod rank once)."""
    from tfpar._tasks.heartbeat import STACK_SIGNAL, dump_stacks

    code = (
        "import faulthandler, os, signal, threading, time\n"
        f"faulthandler.register({int(STACK_SIGNAL)}, all_threads=True)\n"
        "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "os.kill(os.getpid(), signal.SIGSTOP)\n"
        "print('resumed', flush=True)\n"
    )
    task = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 20
        while open(f"/proc/{task.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "T":
            assert time.monotonic() < deadline, "the task never stopped itself"
            time.sleep(0.05)
        dump_stacks(task.pid)
        out, err = task.communicate(timeout=20)
    finally:
        task.kill()
        task.wait(timeout=20)
    assert out == "resumed\n"
    current = err.split("Current thread", 1)[1]
    assert 'File "<string>", line 4 in <module>' in current.splitlines()[1], err
    assert err.count("Thread 0x") == 1 and "threading.py" in err.split("Current thread", 1)[0], err
    dump_stacks(task.pid)  # gone: nothing to ask, and no error
