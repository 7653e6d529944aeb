"""SLURM without SLURM: the node-list syntax, the task layout srun gives, and what `auto()`
picks."""

import pytest

from tfpar.cluster import ClusterInfo, expand_hostlist, slurm_gpu_env, slurm_port, started_by_srun
from tfpar.strategies._auto import choose


@pytest.mark.parametrize(
    "text, nodes",
    [
        ("localhost", ["localhost"]),
        ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
        ("a[1-2],b3", ["a1", "a2", "b3"]),
        ("n[8-11]", ["n8", "n9", "n10", "n11"]),
        ("gpu-[001-002]-ib", ["gpu-001-ib", "gpu-002-ib"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("c1,c[3,5],d", ["c1", "c3", "c5", "d"]),
    ],
)
def test_node_lists_expand_as_slurm_writes_them(text, nodes):
    assert expand_hostlist(text) == nodes


@pytest.mark.parametrize("text", ["", "n[1-", "n1]", "n[3-1]", "a,,b", "n[a-b]", "n[[1]]"])
def test_a_node_list_that_cannot_be_parsed_is_refused(text):
    with pytest.raises(ValueError, match=r"node list.*Received: node list"):
        expand_hostlist(text)


def _srun(procid, **env):
    return {"SLURM_JOB_ID": "4321", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(procid), **env}


def test_tasks_are_laid_out_block_by_block_with_a_port_per_local_task():
    env = dict(SLURM_JOB_NODELIST="n[1-3]", SLURM_NTASKS="5", SLURM_TASKS_PER_NODE="2(x2),1")
    infos = [ClusterInfo.from_slurm(_srun(p, **env)) for p in range(5)]
    port = 20000 + 4321
    assert infos[0].cluster == {
        "worker": [f"n1:{port}", f"n1:{port + 1}", f"n2:{port}", f"n2:{port + 1}", f"n3:{port}"]
    }
    assert [(i.task_type, i.task_index, i.address) for i in infos[2:4]] == [
        ("worker", 2, f"n2:{port}"),
        ("worker", 3, f"n2:{port + 1}"),
    ]
    assert infos[0].is_chief and not infos[1].is_chief
    # Without SLURM_TASKS_PER_NODE the tasks spread evenly; SLURM_LOCALID and SLURM_NODEID agree.
    even = ClusterInfo.from_slurm(
        _srun(
            3, SLURM_JOB_NODELIST="a[1-2]", SLURM_NTASKS="4", SLURM_LOCALID="1", SLURM_NODEID="1"
        ),
        port=3000,
    )
    assert (
        even.cluster["worker"] == ["a1:3000", "a1:3001", "a2:3000", "a2:3001"]
        and even.task_index == 3
    )


def test_the_port_comes_from_the_job_id_unless_set():
    assert slurm_port({"SLURM_JOB_ID": "123456"}) == 20000 + 123456 % 12000
    # not ephemeral
    assert max(slurm_port({"SLURM_JOB_ID": str(job)}) for job in range(24000)) + 64 < 32768
    assert slurm_port({"SLURM_JOB_ID": "1", "TFPAR_SLURM_PORT": "5555"}) == 5555


@pytest.mark.parametrize(
    "env, message",
    [
        (
            dict(SLURM_JOB_NODELIST="n[1-2]", SLURM_NTASKS="3", SLURM_TASKS_PER_NODE="2(x2)"),
            r"SLURM_NTASKS=3 disagrees with the node list: .*'n\[1-2\]' has 2 node\(s\)",
        ),
        (
            dict(SLURM_JOB_NODELIST="n[1-3]", SLURM_NTASKS="2", SLURM_TASKS_PER_NODE="1(x2)"),
            r"SLURM_NTASKS=2 disagrees with the node list",
        ),
        (
            dict(SLURM_JOB_NODELIST="n[1-2]", SLURM_NTASKS="3"),
            r"SLURM_NTASKS=3 does not spread evenly over the 2 nodes",
        ),
        (
            dict(SLURM_JOB_NODELIST="n[1-2]", SLURM_NTASKS="2", SLURM_LOCALID="1"),
            r"SLURM_LOCALID=1 disagrees",
        ),
        (
            dict(SLURM_JOB_NODELIST="n[1-2", SLURM_NTASKS="2"),
            r"a '\[' is not closed. Received: node list 'n\[1-2'",
        ),
        (
            dict(SLURM_JOB_NODELIST="n1", SLURM_NTASKS="two"),
            r"SLURM_NTASKS must be an integer >= 1. Received: "
            r"SLURM_NTASKS='two'",
        ),
        (dict(SLURM_NTASKS="2"), r"needs SLURM_JOB_NODELIST, which srun sets"),
        (
            dict(SLURM_JOB_NODELIST="n1", SLURM_NTASKS="2", SLURM_TASKS_PER_NODE="2(y1)"),
            r"SLURM_TASKS_PER_NODE must read like '2\(x3\),1'",
        ),
    ],
)
def test_slurm_variables_that_disagree_are_refused(env, message):
    with pytest.raises(ValueError, match=message):
        ClusterInfo.from_slurm(_srun(1, **env))


def test_procid_beyond_the_tasks_is_refused():
    with pytest.raises(
        ValueError, match=r"SLURM_PROCID must be below SLURM_NTASKS. Received: SLURM_PROCID=2"
    ):
        ClusterInfo.from_slurm(_srun(2, SLURM_JOB_NODELIST="n1", SLURM_NTASKS="2"))


def test_each_local_task_gets_its_own_gpu_when_slurm_shows_them_all():
    assert slurm_gpu_env({"CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_LOCALID": "2"}) == {
        "CUDA_VISIBLE_DEVICES": "2"
    }
    assert slurm_gpu_env({"CUDA_VISIBLE_DEVICES": "5", "SLURM_LOCALID": "0"}) == {}  # bound already
    assert slurm_gpu_env({"SLURM_LOCALID": "1"}) == {}  # no GPUs listed
    with pytest.raises(ValueError, match=r"SLURM_LOCALID=2 has no GPU of its own"):
        slurm_gpu_env({"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_LOCALID": "2"})


@pytest.mark.parametrize(
    "env, picked",
    [
        ({}, "data_parallel"),
        ({"TF_CONFIG": "{}"}, "data_parallel"),
        ({"HOROVOD_RANK": "0"}, "horovod"),  # horovodrun
        ({"OMPI_COMM_WORLD_RANK": "0"}, "horovod"),  # mpirun
        ({"PMI_RANK": "0"}, "horovod"),  # MPICH's mpiexec
        (_srun(0), "slurm"),  # srun
        (_srun(0, PMI_RANK="0"), "horovod"),  # srun --mpi=pmi2
        (_srun(0, PMIX_RANK="0"), "horovod"),  # srun --mpi=pmix
        (_srun(0, TF_CONFIG='{"cluster": {}}'), "data_parallel"),  # srun, TF_CONFIG given
        ({"SLURM_JOB_ID": "1", "SLURM_PROCID": "0"}, "data_parallel"),  # the batch script itself
    ],
)
def test_auto_recognizes_slurm_before_the_mpi_launchers(env, picked):
    assert choose(env) == picked
    assert started_by_srun(env) == ("SLURM_STEP_ID" in env)


@pytest.mark.parametrize(
    "script, launches",
    [
        (
            "data_parallel.sbatch",
            "srun tfpar launch --slurm -- python examples/train_data_parallel.py",
        ),
        ("horovod.sbatch", "srun --mpi=pmix python examples/train_horovod.py"),
    ],
)
def test_the_sbatch_examples_are_valid_bash_and_start_the_job_with_srun(script, launches):
    import os
    import subprocess

    from tests.conftest import ROOT

    path = os.path.join(ROOT, "examples", "slurm", script)
    assert subprocess.run(["bash", "-n", path], capture_output=True, timeout=30).returncode == 0
    with open(path) as f:
        text = f.read()
    assert text.startswith("#!/bin/bash\n") and "#SBATCH --nodes=2" in text and launches in text
    assert os.path.exists(os.path.join(ROOT, launches.split("python ")[1].split()[0]))


class _Built:
    """What `_check_srun_step` asks of Horovod: whether it was built with MPI (a Gloo-only build
    cannot be made beside the MPI one this suite installs)."""

    def __init__(self, mpi):
        self.mpi = mpi

    def mpi_built(self):
        return self.mpi


@pytest.mark.parametrize(
    "env, mpi, refused",
    [
        (_srun(0, SLURM_NTASKS="2"), True, "needs SLURM's MPI plugin"),  # plain srun, 2 tasks
        # --mpi=pmix, Gloo-only Horovod
        (_srun(0, SLURM_NTASKS="2", PMIX_RANK="0"), False, "needs a Horovod built with MPI"),
        (_srun(0, SLURM_NTASKS="2", PMIX_RANK="0"), True, None),  # --mpi=pmix, MPI Horovod
        # horovodrun inside an allocation
        (_srun(0, SLURM_NTASKS="2", HOROVOD_RANK="0"), False, None),
        ({**_srun(0), "SLURM_NTASKS": "1"}, False, None),  # one task: one rank
        ({}, False, None),  # not under SLURM
    ],
)
def test_horovod_under_srun_needs_slurms_mpi_and_an_mpi_build(env, mpi, refused):
    from tfpar.strategies._horovod_init import _check_srun_step

    if refused is None:
        _check_srun_step(_Built(mpi), env)
    else:
        with pytest.raises(ValueError, match=refused):
            _check_srun_step(_Built(mpi), env)
