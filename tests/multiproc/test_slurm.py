"""Under a real SLURM (tests/slurm_cluster.py: slurmctld and slurmd on 127.0.0.1, node
"localhost"): srun's tasks joined by `tfpar launch --slurm`, by `tfpar.strategies.auto()`, and
by `HorovodStrategy` over ``srun --mpi=pmix``."""

import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import ROOT, tfpar_command
from tests.models import (
    assert_started_from_worker_0,
    assert_trained_together_like_one_device,
    load_arrays,
    one_device_weights,
)
from tests.slurm_cluster import SlurmCluster, ensure_slurm
from tfpar.cluster.addresses import free_ports

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")


def _free_consecutive_ports(count):
    """A first port whose next ``count - 1`` ports are free too, on 127.0.0.1, outside the ephemeral
    range."""
    return free_ports(count, consecutive=True)[0]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    ensure_slurm()
    ctld = _free_consecutive_ports(2)
    cluster = SlurmCluster(str(tmp_path_factory.mktemp("slurm")), ctld, ctld + 1).start()
    yield cluster
    cluster.stop()


def _job_env():
    """Each srun step's workers on free ports (TFPAR_SLURM_PORT), running this checkout's tests."""
    return {"TFPAR_SLURM_PORT": str(_free_consecutive_ports(2)), "PYTHONPATH": ROOT}


def test_launch_slurm_trains_the_tasks_together_like_one_device(slurm, tmp_path):
    """2 srun tasks, each `tfpar launch --slurm`: one multi-worker job, equal to one device."""
    script = os.path.join(SCRIPTS, "multiworker_train.py")
    result = slurm.srun(
        tfpar_command(
            "launch",
            "--slurm",
            "--",
            sys.executable,
            script,
            str(tmp_path),
            "16",
            "2",
            "padded:90:2",
        ),
        2,
        env=_job_env(),
    )
    assert result.returncode == 0, result.output[-4000:]
    assert (
        "2 (this is worker 0, chief)" in result.output
        and "2 (this is worker 1, not chief)" in result.output
    )
    assert_trained_together_like_one_device(tmp_path / "padded", 90)


@pytest.mark.parametrize(
    "mpi, picked", [("none", "MultiWorkerDataParallel"), ("pmix", "HorovodStrategy")]
)
def test_auto_under_srun_picks_a_worker_or_a_rank_per_task(slurm, mpi, picked, horovod_installed):
    result = slurm.srun(
        [sys.executable, os.path.join(SCRIPTS, "which_strategy.py")],
        2,
        mpi=mpi,
        env=_job_env(),
        timeout=200,
    )
    assert result.returncode == 0, result.output[-4000:]
    assert result.output.count(f"strategy {picked} 2") == 2, result.output[-3000:]


def test_horovod_strategy_under_srun_mpi_pmix_trains_like_one_device(
    slurm, tmp_path, horovod_installed
):
    """SLURM's PMIx server, not horovodrun, makes the two tasks one MPI (Horovod) job."""
    result = slurm.srun(
        [
            sys.executable,
            os.path.join(SCRIPTS, "horovod_train.py"),
            str(tmp_path),
            "average:16:2:96:average:none:1:2",
        ],
        2,
        mpi="pmix",
        env=_job_env(),
    )
    assert result.returncode == 0, result.output[-4000:]
    out = tmp_path / "average"
    assert "workers:    2 (this is rank 1" in (out / "describe_1.txt").read_text()
    assert_started_from_worker_0(out)
    rank0, rank1 = (load_arrays(out / f"rank_{r}.npz") for r in range(2))
    for a, b, reference in zip(rank0, rank1, one_device_weights(96, 16, 2, 0.1)):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, reference, atol=1e-5, rtol=0)


def test_horovod_strategy_under_srun_without_mpi_is_refused_clearly(slurm, horovod_installed):
    result = slurm.srun(
        [
            sys.executable,
            os.path.join(SCRIPTS, "horovod_train.py"),
            "/nonexistent",
            "average:16:1:96:average:none:1:2",
        ],
        2,
        env=_job_env(),
        timeout=200,
    )
    assert result.returncode != 0
    assert "ValueError: HorovodStrategy under srun needs SLURM's MPI plugin" in result.output, (
        result.output[-3000:]
    )
    assert "srun --mpi=pmix" in result.output


@pytest.mark.parametrize(
    "script, says",
    [
        ("data_parallel.sbatch", ("2 (this is worker 0, chief)", "loss: first epoch")),
        ("horovod.sbatch", ("workers:    2 (this is rank 0", "validation accuracy after 1 epochs")),
    ],
)
def test_the_sbatch_examples_run_under_sbatch(slurm, tmp_path, script, says, horovod_installed):
    """Each example as submitted, sized for this one node: 2 tasks, no GPU, 1 epoch."""
    with open(os.path.join(ROOT, "examples", "slurm", script)) as f:
        text = f.read()
    for directive, here in (
        ("--nodes=2", "--nodes=1"),
        ("--ntasks-per-node=4", "--ntasks-per-node=2"),
        ("--gpus-per-task=1", "--cpus-per-task=1"),
        ("--cpus-per-task=8", "--cpus-per-task=1"),
        ("--epochs 10", "--epochs 1"),
    ):
        assert directive in text
        text = text.replace(directive, here)
    job = tmp_path / script
    job.write_text(text)
    result = slurm.sbatch(str(job), output=str(tmp_path / "job.out"), env=_job_env())
    assert result.returncode == 0, result.output[-4000:]
    assert all(line in result.output for line in says), result.output[-3000:]


def test_a_pmix_step_launches_past_what_an_earlier_session_left_in_tmp(slurm):
    """A ``--mpi=pmix`` step cannot launch where its PMIx folder ``spmix_appdir_<uid>_<job>.<step>``
    is already there ("task 0 launch failed: Unspecified error"). In ``/tmp``, SLURM's default, a
    step killed in one session left it for the job of that number in every later one (each new
    cluster numbers its jobs from 1): the test cluster keeps it in its own folder (``TmpFS``)."""
    config = subprocess.run(
        ["scontrol", "show", "config"],
        env={**os.environ, **slurm.env},
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    job = re.search(r"NEXT_JOB_ID\s*=\s*(\d+)", config).group(1)
    left = f"/tmp/spmix_appdir_{os.getuid()}_{job}.0"
    ours = not os.path.exists(left)
    os.makedirs(left, exist_ok=True)
    try:
        result = slurm.srun(["/bin/echo", "launched"], 2, mpi="pmix", timeout=60)
    finally:
        if ours:
            shutil.rmtree(left, ignore_errors=True)
    assert result.returncode == 0 and result.output.count("launched") == 2, result.output[-3000:]
    assert "launch failed" not in result.output
    assert os.path.isdir(os.path.join(slurm.folder, "tmp"))
