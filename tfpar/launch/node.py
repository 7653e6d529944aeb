"""One host's share of a job: which devices each of its ``--nproc-per-node`` workers gets.

torchrun and horovodrun users start one worker per GPU; TensorFlow takes every GPU it sees, so
the launcher gives each worker its own through ``CUDA_VISIBLE_DEVICES`` (on CPU, its own virtual
device through ``TFPAR_NUM_CPU_DEVICES``), and says its place on the host in ``LOCAL_RANK`` and
``LOCAL_WORLD_SIZE`` (torchrun's names). Pure Python: the launcher never imports TensorFlow, so
it counts the GPUs from the driver.

GPU paths are unit-tested on their decisions only: no machine that runs these tests has a GPU.
"""

import glob
import os
import shutil
import subprocess
from collections.abc import Mapping

__all__ = ["CPU_DEVICES_VARIABLE", "visible_gpus", "worker_envs"]

CPU_DEVICES_VARIABLE = "TFPAR_NUM_CPU_DEVICES"
"""The virtual CPU devices `tfpar.configure_devices` makes when there is no GPU."""


def visible_gpus(
    environ: Mapping[str, str] | None = None, driver_gpus: int | None = None
) -> list[str]:
    """The GPU ids this host's workers may use: ``CUDA_VISIBLE_DEVICES`` when it is set (an empty
    value hides every GPU), else one id per GPU the NVIDIA driver lists, else none.

    ``driver_gpus`` (a count) stands in for the driver's answer (tests)."""
    env = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" in env:
        return [
            g.strip()
            for g in env["CUDA_VISIBLE_DEVICES"].split(",")
            if g.strip() and g.strip() != "-1"
        ]
    count = _driver_gpu_count() if driver_gpus is None else driver_gpus
    return [str(i) for i in range(count)]


def _driver_gpu_count():
    found = glob.glob("/proc/driver/nvidia/gpus/*")
    if found:
        return len(found)
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        listing = subprocess.run(
            [smi, "-L"], capture_output=True, text=True, timeout=30, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU ") for line in listing.splitlines())


def worker_envs(
    nproc_per_node: int, environ: Mapping[str, str] | None = None, driver_gpus: int | None = None
) -> tuple[list[dict], str | None]:
    """The environment each of this host's ``nproc_per_node`` workers gets, in local-rank order,
    and a warning (or None).

    - GPUs: worker i gets its own ``len(gpus) // nproc_per_node`` GPUs, in order (one each when
      there are as many GPUs as workers); GPUs left over are named in the warning.
    - No GPU: worker i gets ``$TFPAR_NUM_CPU_DEVICES // nproc_per_node`` virtual CPU devices (at
      least one; with the variable unset, one each), so that the workers of a host share it as
      they would share its GPUs.

    Raises:
        ValueError: fewer GPUs than workers, naming both counts and the fix.
    """
    env = os.environ if environ is None else environ
    gpus = visible_gpus(env, driver_gpus)
    local = [
        {"LOCAL_RANK": str(i), "LOCAL_WORLD_SIZE": str(nproc_per_node)}
        for i in range(nproc_per_node)
    ]
    if not gpus:
        total = env.get(CPU_DEVICES_VARIABLE, "")
        share = max(1, int(total) // nproc_per_node) if total.strip().isdigit() else 1
        return [{**e, CPU_DEVICES_VARIABLE: str(share)} for e in local], None
    if len(gpus) < nproc_per_node:
        raise ValueError(
            f"--nproc-per-node {nproc_per_node} gives each worker its own GPU, and this host has "
            f"{len(gpus)} ({','.join(gpus)}). Received: more workers than GPUs. Use "
            f"--nproc-per-node {len(gpus)}, or -n {nproc_per_node} to start workers that share "
            "every GPU."
        )
    each = len(gpus) // nproc_per_node
    warning = None
    if len(gpus) % nproc_per_node:
        unused = gpus[each * nproc_per_node :]
        warning = (
            f"warning: {len(gpus)} GPUs for {nproc_per_node} workers: {each} each, and GPU(s) "
            f"{','.join(unused)} left unused"
        )
    return [
        {**e, "CUDA_VISIBLE_DEVICES": ",".join(gpus[i * each : (i + 1) * each])}
        for i, e in enumerate(local)
    ], warning
