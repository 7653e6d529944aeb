"""`make_parallelism`: a tfpar parallelism by name, for ``tfpar demo`` and ``tfpar verify``.

It knows every strategy, so it sits above them (ARCHITECTURE.md, layer 5); the strategies'
shared base (`tfpar._parallelism`) knows none of them.
"""

__all__ = ["STRATEGIES", "make_parallelism"]

STRATEGIES = ("data_parallel", "horovod", "ps", "pipeline")
"""The names `make_parallelism` (so ``tfpar demo`` and ``tfpar verify``) takes."""


def make_parallelism(name, num_devices=None, replicas=1, microbatches=8, compression="none"):
    """The parallelism called ``name`` (one of `STRATEGIES`), for this process.

    Args:
        name: "data_parallel" (this host's devices, or TF_CONFIG's workers), "horovod" (one
            replica per rank, started by horovodrun or ``tfpar launch --horovod``), "ps" (a local
            cluster of ``num_devices`` workers, default 2, and one ps, as child processes) or
            "pipeline" (2 stages x ``replicas`` on their own devices).
        num_devices: virtual CPU devices when there is no GPU, or the PS workers.
        replicas: "pipeline": data-parallel copies of the 2-stage pipeline.
        microbatches: "pipeline": microbatches per replica and step.
        compression: "data_parallel" and "horovod": the gradients on the wire ("none", "bf16",
            "fp16"); the others send none over a ring.

    Raises:
        ValueError: compression with "ps" or "pipeline".
    """
    from tfpar.devices import configure_devices

    if compression != "none" and name in ("ps", "pipeline"):
        raise ValueError(
            f"Gradient compression applies to data_parallel and horovod, whose replicas all-reduce "
            f"their gradients. Received: strategy {name!r} with compression={compression!r}. Use "
            "--strategy data_parallel or horovod, or leave compression out.")

    if name == "ps":
        from tfpar.strategies.parameter_server import ParameterServer

        return ParameterServer.local(num_workers=num_devices or 2, num_ps=1)
    if name == "horovod":
        from tfpar.strategies.horovod import HorovodStrategy

        return HorovodStrategy(compression=compression)
    if name == "pipeline":
        from tfpar.pipeline import Pipeline

        configure_devices(num_devices or 2 * replicas)
        return Pipeline(num_stages=2, num_microbatches=microbatches, replicas=replicas, balance="time")
    from tfpar.strategies.data_parallel import DataParallel

    configure_devices(num_devices)
    return DataParallel(compression=compression)
