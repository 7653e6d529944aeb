"""A pipeline longer than one host (``Pipeline(span_workers=True)``): its stages on the devices of
every worker of the job.

Worker 0 connects to the job's cluster (TensorFlow's remote devices, as the parameter-server
coordinator reaches its workers) and runs the pipeline as one program. TensorFlow's runtime cuts
each step's graph by task and sends each activation and gradient from the worker that computes it
to the worker that needs it (gRPC Send/Recv between them, not through worker 0). The other workers
serve their devices while worker 0 answers, then end (the script goes no further there, as a
parameter-server task's does).
"""

import json
from typing import Any

from tfpar._keras import tf

__all__ = ["cluster_devices", "join_spanning", "spread"]


def _training_tasks(cluster):
    """``(job, task index, address)`` of the tasks that train, in worker-index order (a chief
    first)."""
    return [
        (job, i, address)
        for job in ("chief", "worker")
        for i, address in enumerate(cluster.get(job, ()))
    ]


def join_spanning(timeout_seconds: float) -> Any:
    """Worker 0: connects to the job's cluster and returns its `ClusterInfo`. Any other worker:
    serves its devices until worker 0 is gone, then exits (never returns).

    Raises:
        ValueError: no job of several workers (TF_CONFIG), or a horovodrun job.
        ClusterUnreachableError: a worker that does not serve within ``timeout_seconds``.
    """
    from tfpar.cluster import ClusterInfo
    from tfpar.strategies._started_by import started_by_horovod

    if started_by_horovod():
        raise ValueError(
            "span_workers=True places the stages on the devices of TensorFlow servers, and "
            "horovodrun starts none. Received: span_workers=True under horovodrun. Run the script "
            "with tfpar launch -n N (or --hosts, SLURM, a TFJob), or leave span_workers False "
            "(each rank then runs the whole pipeline, a data-parallel replica)."
        )
    info = ClusterInfo.from_tf_config()
    if info is None or info.num_workers < 2:
        raise ValueError(
            "span_workers=True places the stages over the devices of a job's workers, and this "
            "process is in no job of several workers. Received: span_workers=True with TF_CONFIG="
            f"{json.dumps(info.cluster) if info else 'unset'}. "
            "Start the script with tfpar launch -n N "
            "(or --hosts, SLURM, a TFJob), or leave span_workers False."
        )
    workers = [address for _, _, address in _training_tasks(info.training_cluster)]
    if info.worker_index != 0:
        from tfpar._local.server import serve

        cpu = tf.config.list_physical_devices("CPU")[0]
        # tfpar.configure_devices(N)
        count = len(tf.config.get_logical_device_configuration(cpu) or [None])
        serve(
            info,
            device_count={"CPU": count},
            while_answers=workers[0],
            wait_seconds=timeout_seconds,
        )
        raise SystemExit(0)
    from tfpar.strategies._ps_failures import wait_for_addresses

    wait_for_addresses(workers[1:], timeout_seconds)
    tf.config.experimental_connect_to_cluster(
        tf.train.ClusterSpec(info.training_cluster),
        job_name=info.task_type,
        task_index=info.task_index,
    )
    return info


def cluster_devices(info: Any) -> list[list[str]]:
    """Each worker's compute devices (GPUs where worker 0 has them, else CPUs), worker by worker."""
    kind = "GPU" if tf.config.list_logical_devices("GPU") else "CPU"
    tasks = [(job, i) for job, i, _ in _training_tasks(info.cluster)]
    by_task: dict = {task: [] for task in tasks}
    for device in tf.config.list_logical_devices(kind):
        spec = tf.DeviceSpec.from_string(device.name)
        by_task.get((spec.job, spec.task or 0), []).append((spec.device_index or 0, device.name))
    return [[name for _, name in sorted(by_task[task])] for task in tasks]


def spread(workers: list[list[str]], replicas: int, num_stages: int, tensor: int) -> list[str]:
    """Device names, replica-major (as `Pipeline.devices` reads them), with stage s of every replica
    on worker s × W // num_stages of the W workers (consecutive stages together, neighbours on one
    worker where they can be), and a stage's ``tensor`` devices inside one worker.

    Raises:
        ValueError: fewer stages than workers, or a worker with too few devices for its stages.
    """
    w = len(workers)
    if num_stages < w:
        raise ValueError(
            f"span_workers=True puts at least one stage on each of the {w} workers, and the "
            f"pipeline has num_stages={num_stages}. "
            f"Received: num_stages={num_stages} over {w} workers. Use num_stages >= {w}, "
            "or leave span_workers False (each worker then runs the whole pipeline, a "
            "data-parallel replica)."
        )
    owner = [s * w // num_stages for s in range(num_stages)]
    for index, devices in enumerate(workers):
        needed = replicas * owner.count(index) * tensor
        if len(devices) < needed:
            stages = [s for s in range(num_stages) if owner[s] == index]
            raise ValueError(
                f"Worker {index} holds stages {stages} of each of the {replicas} replica(s), "
                f"{tensor} device(s) a stage: {needed} devices, and it has {len(devices)} "
                f"({devices}). Received: replicas={replicas}, num_stages={num_stages}, "
                f"tensor_parallel={tensor} over {w} workers. "
                f"Call tfpar.configure_devices({needed}) on every worker, or use fewer replicas."
            )
    free = [list(devices) for devices in workers]
    names = []
    for _ in range(replicas):
        for stage in range(num_stages):
            names += free[owner[stage]][:tensor]
            del free[owner[stage]][:tensor]
    return names
