"""`PipelineConfig`: what `Pipeline` cuts and where it runs, as data (frozen), checked when made:
the counts, the schedule and its microbatches, the cut points, the devices, tensor parallelism
within each stage, and a pipeline that spans a job's workers."""

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from tfpar._checks import check_choice, check_int, check_names, check_number
from tfpar.pipeline.partition import check_cut_points
from tfpar.pipeline.schedule import SCHEDULES, make_schedule
from tfpar.remat import check_remat

__all__ = ["PipelineConfig"]

_log = logging.getLogger("tfpar.pipeline")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PipelineConfig:
    """Configuration of `Pipeline`, validated when built."""

    num_stages: int = 2
    """Stages the model is cut into, each on its own device."""
    num_microbatches: int = 4
    """Microbatches per replica and step; must divide the per-replica batch."""
    schedule: str = "1f1b"
    """"1f1b" (PipeDream-Flush: fewer activations held), "gpipe", "interleaved" (each stage runs
    ``virtual_stages`` chunks of the model: a smaller bubble) or "zb-h1" (zero bubble: the weight
    gradients fill the drain)."""
    cut_points: object = "auto"
    """"auto", or the names of the layers after which a new stage begins."""
    balance: str = "params"
    """How "auto" balances the stages: "params" or "time" (needs ``layer_costs``)."""
    layer_costs: dict | None = None
    """With ``balance="time"``: layer name -> cost (e.g. measured seconds)."""
    replicas: int = 1
    """Data-parallel copies of the pipeline (uses replicas × num_stages devices)."""
    recompute: bool = False
    """Recompute each stage's activations in the backward pass (tf.recompute_grad)."""
    remat: Any = "none"
    """Recompute the activations of the blocks inside the stages instead (`tfpar.remat`, as
    `DataParallel`'s: "blocks", or layer names and patterns): a stage keeps its blocks' inputs."""
    devices: tuple | None = None
    """Device names, replica-major (default: the GPUs, else the logical CPU devices; with
    ``span_workers``, every worker's, stage s on worker s × workers // num_stages)."""
    tensor_parallel: int = 1
    """T: each stage's layers split over T devices of its own (`tfpar.tensor_parallel`); the
    pipeline then uses replicas × num_stages × T devices."""
    tensor_plan: object = "auto"
    """With ``tensor_parallel`` > 1: the plan (`tfpar.tensor_parallel.TensorParallelConfig.plan`);
    "auto" finds each stage's splits within it."""
    tensor_batch_axis: str = "batch"
    """With a ``keras.distribution.LayoutMap`` as ``tensor_plan``: its mesh's data-parallel axis."""
    span_workers: bool = False
    """Under a job of several workers (TF_CONFIG: ``tfpar launch``, ``--hosts``, SLURM, a TFJob),
    place the stages over every worker's devices, worker by worker (`tfpar.pipeline.spanning`):
    worker 0 runs the pipeline and the others serve their devices until it ends (a pipeline longer
    than one host). Default: each worker runs the whole pipeline over its own devices, a
    data-parallel replica."""
    connect_timeout_seconds: float = 120.0
    """With ``span_workers``: how long worker 0 waits for the others to serve, and they for it."""
    virtual_stages: int | None = None
    """With a schedule that takes them ("interleaved"): chunks per stage (default 2); the model is
    cut into num_stages × virtual_stages chunks, each on the stage the schedule places it on (for
    "interleaved", chunk c on stage c mod num_stages)."""

    def __post_init__(self):
        check_int("num_stages", self.num_stages, 1)
        check_int("num_microbatches", self.num_microbatches, 1)
        check_int("replicas", self.replicas, 1)
        check_int("tensor_parallel", self.tensor_parallel, 1)
        check_cut_points(self.cut_points)
        from tfpar.tensor_parallel.layouts import is_layout_map

        named = self.tensor_plan != "auto" and not is_layout_map(self.tensor_plan)
        if self.tensor_parallel > 1 and named:
            from tfpar.tensor_parallel.plan import match_plan

            if not isinstance(self.tensor_plan, Mapping):
                raise TypeError(
                    'tensor_plan must be "auto" or a dict from layer names (or regular '
                    f"expressions) to styles. Received: tensor_plan={self.tensor_plan!r}."
                )
            match_plan(self.tensor_plan, list(self.tensor_plan))  # its types and styles
        if not isinstance(self.span_workers, bool):
            raise TypeError(
                f"span_workers must be True or False. Received: span_workers={self.span_workers!r}."
            )
        check_number("connect_timeout_seconds", self.connect_timeout_seconds, above=0)
        if self.devices is not None:
            from tfpar.devices import check_devices

            # Another worker's devices exist once worker 0 has connected: Pipeline checks them
            # then.
            object.__setattr__(
                self,
                "devices",
                check_names("devices", self.devices)
                if self.span_workers
                else check_devices("devices", self.devices),
            )
        check_choice("schedule", self.schedule, SCHEDULES, what="pipeline schedule")
        # its checks
        make_schedule(self.schedule, self.num_stages, self.num_microbatches, self.virtual_stages)
        if not isinstance(self.recompute, bool):
            raise TypeError(
                f"recompute must be True or False. Received: recompute={self.recompute!r}."
            )
        object.__setattr__(self, "remat", _checked_remat(self))
        if self.num_microbatches < self.num_stages:
            _log.warning(
                "num_microbatches=%d < num_stages=%d: the pipeline bubble (%.0f%% of the time) "
                "will dominate; use at least as many microbatches as stages (4x is a good start).",
                self.num_microbatches,
                self.num_stages,
                100 * make_schedule("1f1b", self.num_stages, self.num_microbatches).bubble_fraction,
            )


def _checked_remat(config):
    """``remat``, checked, and refused with what a pipeline does not combine it with."""
    remat = check_remat(config.remat)
    if remat != "none" and config.tensor_parallel > 1:
        raise ValueError(
            "remat recomputes whole blocks, and with tensor_parallel a stage's blocks are "
            "split over its devices: that is not supported yet. Received: remat="
            f"{remat!r} with tensor_parallel={config.tensor_parallel}. Use recompute=True "
            "(each stage), or remat without tensor_parallel."
        )
    if config.recompute and remat != "none":
        raise ValueError(
            "recompute=True recomputes each whole stage; remat the blocks inside the stages. "
            f"Received: recompute=True with remat={remat!r}. Give one of them."
        )
    return remat
