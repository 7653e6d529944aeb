"""A real one-node SLURM cluster for the tests: Debian's slurmctld and slurmd, started by the test
session as root on 127.0.0.1 with their own configuration and state in a temporary folder, and
stopped with it. ``srun`` then starts tasks exactly as on a cluster: its own environment, its
PMIx server for ``--mpi=pmix``, its own process tracking.

The node is named ``localhost`` (``slurmd -N localhost``, address 127.0.0.1), so the node list a
job sees, and the addresses tfpar derives from it, stay on loopback. Both daemons listen on
127.0.0.1 only (``CommunicationParameters=NoInAddrAny,NoCtldInAddrAny``, and tfpar's loopback
library in their environment).

Everything a job leaves stays in the cluster's folder, ``TmpFS`` included: a ``--mpi=pmix`` step
makes ``<TmpFS>/spmix_appdir_<uid>_<job>.<step>`` and cannot launch where one is already there
("task 0 launch failed: Unspecified error"). With the default ``/tmp``, a step killed in one test
session left it for the job of the same number in every later one (each new cluster numbers its
jobs from 1).

Debian's packages are installed with apt-get when missing and this is root (as `tfpar
install-horovod` installs OpenMPI); elsewhere the tests that need SLURM skip, or fail under CI.
"""

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import Finished, run_command

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "slurm-wlm-basic-plugins")
DAEMONS = ("slurmctld", "slurmd", "srun", "sbatch", "sinfo", "scancel", "scontrol")

_CONF = """\
ClusterName=tfpar
SlurmctldHost=localhost
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
TmpFS={folder}/tmp
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=localhost NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


def ensure_slurm():
    """SLURM's commands on PATH, installing Debian's packages as root where they are missing."""
    if all(shutil.which(name) for name in DAEMONS):
        return
    if os.geteuid() == 0 and shutil.which("apt-get"):
        print(f"SLURM is missing: installing {' '.join(PACKAGES)} with apt-get", flush=True)
        env = {"DEBIAN_FRONTEND": "noninteractive"}
        for args in (
            ["apt-get", "update", "-qq"],
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES],
        ):
            result = run_command(args, timeout=600, env=env)
            assert result.returncode == 0, result.output[-3000:]
        return
    message = f"SLURM is not installed (Debian: apt-get install {' '.join(PACKAGES)})"
    if os.environ.get("CI"):
        pytest.fail(f"{message}; CI installs it as root, so its install is broken")
    pytest.skip(message)


class SlurmCluster:
    """slurmctld and one slurmd (4 CPUs, oversubscribed) on 127.0.0.1; ``srun`` runs a job step."""

    def __init__(self, folder, ctld_port, slurmd_port):
        self.folder = folder
        for sub in ("state", "spool", "tmp"):
            os.makedirs(os.path.join(folder, sub), exist_ok=True)
        self.conf = os.path.join(folder, "slurm.conf")
        with open(self.conf, "w", encoding="utf-8") as f:
            f.write(_CONF.format(folder=folder, ctld_port=ctld_port, slurmd_port=slurmd_port))
        self.env = {"SLURM_CONF": self.conf}
        self._daemons = []

    def start(self, timeout=60):
        env = {**os.environ, **self.env}
        for argv in (["slurmctld", "-D", "-i"], ["slurmd", "-D", "-N", "localhost"]):
            log = open(os.path.join(self.folder, f"{argv[0]}.log"), "wb")
            self._daemons.append(
                subprocess.Popen(
                    argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            )
            log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = subprocess.run(
                ["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True, timeout=10
            ).stdout.strip()
            if state == "idle":
                return self
            if any(d.poll() is not None for d in self._daemons):
                break
            time.sleep(0.5)
        self.stop()
        pytest.fail(f"SLURM did not come up in {timeout} s (node state {state!r}):\n{self.logs()}")

    def logs(self):
        return "\n".join(
            open(os.path.join(self.folder, f"{name}.log"), errors="replace").read()[-2000:]
            for name in ("slurmctld", "slurmd")
        )

    def srun(self, argv, ntasks, *, mpi="none", timeout=300, env=None):
        """One job step of ``ntasks`` tasks on the node (``srun --mpi=MPI``); a `Finished`."""
        return run_command(
            [
                "srun",
                f"--ntasks={ntasks}",
                f"--mpi={mpi}",
                "--kill-on-bad-exit=1",
                f"--time={max(1, timeout // 60)}",
                *argv,
            ],
            timeout=timeout,
            env={**self.env, **(env or {})},
        )

    def sbatch(self, script, output, *, timeout=300, env=None):
        """Submits ``script`` and waits for the job to end; a `Finished` with the job's exit code
        and its output. It asks slurmctld every half second: ``sbatch --wait`` polls at growing
        intervals (up to 10 s), which cost these tests more waiting than the jobs' own run."""
        submitted = run_command(
            ["sbatch", "--parsable", f"--output={output}", script],
            timeout=60,
            env={**self.env, **(env or {})},
        )
        if submitted.returncode != 0:
            return submitted
        job = submitted.output.strip().splitlines()[-1].split(";")[0]
        env = {**os.environ, **self.env}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = subprocess.run(
                ["scontrol", "show", "job", "-o", job],
                env=env,
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout
            state = re.search(r"JobState=(\S+)", info)
            if state and state.group(1) not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
                code, by_signal = map(int, re.search(r" ExitCode=(\d+):(\d+)", info).groups())
                returncode = 0 if state.group(1) == "COMPLETED" else (code or by_signal or 1)
                text = (
                    Path(output).read_text(errors="replace")
                    if os.path.exists(output)
                    else "(no output file)"
                )
                return Finished(returncode, submitted.output + text)
            time.sleep(0.5)
        subprocess.run(["scancel", job], env=env, capture_output=True, timeout=10)
        pytest.fail(f"SLURM job {job} ({script}) did not end in {timeout} s:\n{self.logs()}")

    def stop(self):
        env = {**os.environ, **self.env}
        if self._daemons and self._daemons[0].poll() is None:
            subprocess.run(
                ["scancel", "--full", "--user=root"], env=env, capture_output=True, timeout=10
            )
        for daemon in reversed(self._daemons):
            if daemon.poll() is None:
                os.killpg(daemon.pid, signal.SIGTERM)
                try:
                    daemon.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(daemon.pid, signal.SIGKILL)
                    daemon.wait()
        self._daemons = []
