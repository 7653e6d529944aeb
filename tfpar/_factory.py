"""`ParallelismSpec`: a tfpar parallelism as data. It builds the parallelism in this process and
prints the Python that builds it; ``tfpar demo``, ``tfpar verify`` and ``tfpar tune`` (its trials
and the code it prints for the winner) all make theirs through it.

It knows every strategy, so it sits above them (ARCHITECTURE.md, layer 5); the strategies'
shared base (`tfpar._parallelism`) knows none of them.
"""

import dataclasses
from typing import Any

from tfpar._checks import check_choice, check_int
from tfpar.pipeline.schedule import SCHEDULES

__all__ = ["STRATEGIES", "ParallelismSpec"]

STRATEGIES = ("data_parallel", "horovod", "parameter_server", "pipeline", "tensor_parallel")
"""The parallelisms by name (``tfpar demo --strategy``, ``tfpar verify --strategy``)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ParallelismSpec:
    """Which parallelism, with which options (validated when made).

    ``devices`` is what ``tfpar.configure_devices`` gets before the parallelism is built: virtual
    CPU devices when there is no GPU (None: the default split, 2 or ``$TFPAR_NUM_CPU_DEVICES``),
    or, for "parameter_server", the local workers (default 2), or for "tensor_parallel" the degree T
    (default 2: ``plan="auto"``). With ``split_devices=False`` the devices are left
    as they are (a worker of a multi-worker job, one replica each).
    """

    kind: str = "data_parallel"
    """One of `STRATEGIES`."""
    devices: int | None = None
    split_devices: bool = True
    compression: str = "none"
    """"data_parallel" and "horovod": the gradients on the wire ("none", "bf16", "fp16")."""
    num_packs: int | None = None
    """"data_parallel" on one host: gradients packed into this many packs (hierarchical copy)."""
    bytes_per_pack: int | None = None
    """"data_parallel" across workers: the collectives' pack size."""
    replicas: int = 1
    """"pipeline": data-parallel copies of the 2-stage pipeline."""
    microbatches: int = 8
    """"pipeline": microbatches per replica and step."""
    schedule: str = "1f1b"
    """"pipeline": one of `tfpar.pipeline.schedule.SCHEDULES`."""
    virtual_stages: int | None = None
    """"pipeline": chunks per stage, for a schedule that takes them."""
    balance: str = "params"
    """"pipeline": how its 2 stages are balanced ("params" or "time")."""
    tensor_parallel: int = 1
    """"pipeline": each stage split over this many devices (``plan="auto"``)."""
    zero_stage: int = 0
    """"data_parallel" and "horovod": the optimizer state sharded over the replicas (ZeRO stage 1
    or 2)."""
    gradient_accumulation_steps: int = 1
    """"data_parallel" and "horovod": each replica's gradients summed over this many steps,
    applied once."""
    remat: Any = "none"
    """"data_parallel", "horovod" and "pipeline": the blocks that recompute their activations
    (`tfpar.remat`)."""

    def __post_init__(self):
        check_choice("strategy", self.kind, STRATEGIES)
        if self.compression != "none" and self.kind in (
            "parameter_server",
            "pipeline",
            "tensor_parallel",
        ):
            raise ValueError(
                "Gradient compression applies to data_parallel and horovod, whose replicas "
                f"all-reduce their gradients. Received: strategy {self.kind!r} with "
                f"compression={self.compression!r}. Use --strategy data_parallel or horovod, or "
                "leave compression out."
            )
        if self.zero_stage and self.kind not in ("data_parallel", "horovod"):
            raise ValueError(
                "zero_stage shards the optimizer state of data_parallel's and horovod's replicas. "
                f"Received: strategy {self.kind!r} with zero_stage={self.zero_stage}. Use "
                "--strategy data_parallel or horovod, or leave zero_stage out."
            )
        if self.remat != "none" and self.kind not in ("data_parallel", "horovod", "pipeline"):
            raise ValueError(
                "remat recomputes the blocks of data_parallel's, horovod's and pipeline's models. "
                f"Received: strategy {self.kind!r} with remat={self.remat!r}. Use one of those, "
                "or leave remat out."
            )
        if self.gradient_accumulation_steps != 1 and self.kind not in ("data_parallel", "horovod"):
            raise ValueError(
                "gradient_accumulation_steps accumulates data_parallel's and horovod's gradients. "
                f"Received: strategy {self.kind!r} with "
                f"gradient_accumulation_steps={self.gradient_accumulation_steps}. Use --strategy "
                "data_parallel or horovod, or leave it at 1."
            )
        check_int("gradient_accumulation_steps", self.gradient_accumulation_steps, 1)
        check_int("replicas", self.replicas, 1)
        check_int("microbatches", self.microbatches, 1)
        check_int("tensor_parallel", self.tensor_parallel, 1)
        check_choice("schedule", self.schedule, sorted(SCHEDULES), what="pipeline schedule")

    def _data_parallel_options(self):
        options = {"compression": self.compression} if self.compression != "none" else {}
        options.update(
            {k: getattr(self, k) for k in ("num_packs", "bytes_per_pack") if getattr(self, k)}
        )
        if self.num_packs:  # the one-host all-reduce that packs on any device
            options["all_reduce"] = "hierarchical"
        options.update({"zero_stage": self.zero_stage} if self.zero_stage else {})
        options.update({"remat": self.remat} if self.remat != "none" else {})
        if self.gradient_accumulation_steps > 1:
            name = (
                "backward_passes_per_step"
                if self.kind == "horovod"
                else "gradient_accumulation_steps"
            )
            options[name] = self.gradient_accumulation_steps
        return options

    def _pipeline_options(self):
        options = {"num_stages": 2, "num_microbatches": self.microbatches}
        options.update({"replicas": self.replicas} if self.replicas > 1 else {})
        options.update({"schedule": self.schedule} if self.schedule != "1f1b" else {})
        options.update({"virtual_stages": self.virtual_stages} if self.virtual_stages else {})
        options.update({"balance": self.balance} if self.balance != "params" else {})
        options.update({"remat": self.remat} if self.remat != "none" else {})
        options.update(
            {"tensor_parallel": self.tensor_parallel} if self.tensor_parallel > 1 else {}
        )
        return options

    def build(self):
        """The parallelism, made in this process (after splitting the devices, where it applies)."""
        from tfpar.devices import configure_devices

        if self.kind == "parameter_server":
            from tfpar.strategies.parameter_server import ParameterServer

            return ParameterServer.local(num_workers=self.devices or 2, num_ps=1)
        if self.kind == "horovod":
            from tfpar.strategies.horovod import HorovodStrategy

            return HorovodStrategy(**self._data_parallel_options())
        if self.kind == "pipeline":
            from tfpar.pipeline import Pipeline

            if self.split_devices:
                configure_devices(self.devices or 2 * self.replicas * self.tensor_parallel)
            return Pipeline(**self._pipeline_options())
        if self.kind == "tensor_parallel":
            from tfpar.tensor_parallel import TensorParallel

            if self.split_devices:
                configure_devices(self.devices or 2)
            return TensorParallel(degree=self.devices or 2)
        from tfpar.strategies.data_parallel import DataParallel

        if self.split_devices:
            configure_devices(self.devices)
        return DataParallel(**self._data_parallel_options())

    def code(self):
        """The Python expression that makes this parallelism (in a script that imported tfpar)."""

        def call(name, options):
            return f"{name}({', '.join(f'{k}={v!r}' for k, v in options.items())})"

        if self.kind == "parameter_server":
            return call(
                "tfpar.strategies.ParameterServer.local",
                {"num_workers": self.devices or 2, "num_ps": 1},
            )
        if self.kind == "horovod":
            return call("tfpar.strategies.HorovodStrategy", self._data_parallel_options())
        if self.kind == "pipeline":
            return call("tfpar.pipeline.Pipeline", self._pipeline_options())
        if self.kind == "tensor_parallel":
            return call("tfpar.tensor_parallel.TensorParallel", {"degree": self.devices or 2})
        return call("tfpar.DataParallel", self._data_parallel_options())

    def demo_flags(self):
        """The ``tfpar demo`` options that ask for this parallelism."""
        flags = ["--strategy", self.kind]
        flags += ["--devices", str(self.devices)] if self.devices else []
        flags += ["--compression", self.compression] if self.compression != "none" else []
        flags += ["--zero-stage", str(self.zero_stage)] if self.zero_stage else []
        if self.kind == "pipeline":
            flags += ["--replicas", str(self.replicas), "--microbatches", str(self.microbatches)]
        return flags
