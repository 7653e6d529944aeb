"""SLURM without SLURM: N local processes with the environment srun gives its tasks
(node list "localhost"), joined by `tfpar launch --slurm` or by `tfpar.strategies.auto()`."""

import os
import random
import signal
import socket
import subprocess
import sys

from tests.conftest import ROOT, tfpar_command
from tests.models import assert_trained_together_like_one_device

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")


def _free_consecutive_ports(count):
    """A first port whose next ``count - 1`` ports are free too, on 127.0.0.1."""
    for _ in range(50):
        base = random.randint(30000, 60000 - count)
        try:
            sockets = [socket.create_server(("127.0.0.1", base + i)) for i in range(count)]
        except OSError:
            continue
        for s in sockets:
            s.close()
        return base
    raise RuntimeError("no consecutive free ports on 127.0.0.1")


def _srun(argv, ntasks, timeout):
    """Starts ``argv`` as the ``ntasks`` tasks of one srun step on one node; returns [(code, output)]."""
    job = {"SLURM_JOB_ID": str(random.randint(1000, 99999)), "SLURM_JOB_NODELIST": "localhost",
           "SLURM_NTASKS": str(ntasks), "SLURM_TASKS_PER_NODE": str(ntasks), "SLURM_STEP_ID": "0",
           "SLURM_NODEID": "0", "TFPAR_SLURM_PORT": str(_free_consecutive_ports(ntasks)), "PYTHONPATH": ROOT}
    procs = []
    try:
        for task in range(ntasks):
            env = {**os.environ, **job, "SLURM_PROCID": str(task), "SLURM_LOCALID": str(task)}
            procs.append(subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          start_new_session=True))
        return [(proc.wait(timeout=timeout), proc.stdout.read().decode(errors="replace")) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def test_launch_slurm_trains_the_tasks_together_like_one_device(tmp_path):
    """2 srun tasks, each `tfpar launch --slurm`: one multi-worker job, equal to one device."""
    script = os.path.join(SCRIPTS, "multiworker_train.py")
    results = _srun(tfpar_command("launch", "--slurm", "--", sys.executable, script, str(tmp_path), "16", "2", "90"),
                    2, timeout=300)
    for code, output in results:
        assert code == 0, output[-4000:]
    assert "2 (this is worker 0, chief)" in results[0][1] and "2 (this is worker 1, not chief)" in results[1][1]
    assert_trained_together_like_one_device(tmp_path, 90)


def test_auto_under_srun_makes_one_worker_per_task():
    results = _srun([sys.executable, os.path.join(SCRIPTS, "which_strategy.py")], 2, timeout=200)
    for code, output in results:
        assert code == 0, output[-4000:]
        assert "strategy MultiWorkerDataParallel 2" in output, output[-3000:]
