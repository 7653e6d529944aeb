"""Where a `distribute` input starts: the example a fit, or a resume in the middle of an epoch,
continues at.

Each worker's input is a stream of epochs, epoch ``e`` shuffled by a seed made of the
`InputConfig` seed, the worker and ``e`` alone, so that any epoch's order can be built again in
another process. Before each ``fit`` the stream is set to start at ``initial_epoch``; a
`tfpar.callbacks.FaultTolerance` that resumes sets it to the epoch and step its backup stands
at. The stream reads that position when ``fit`` creates its iterator, and skips only the
resumed epoch's first steps: the following epochs line up with Keras' epochs again. (The ``fit``
of a model tfpar does not own starts the input where a FaultTolerance last set it, or at epoch 0.)
"""

import dataclasses
import threading
import weakref
from typing import Any

import numpy as np

__all__ = [
    "InputPosition",
    "check_elastic_batch",
    "check_resume",
    "layout_of",
    "position_of",
    "rescaled_resume",
    "start_where_fit_starts",
]

_positions: dict = {}  # id(the DistributedDataset fit is given) -> its InputPosition
_lock = threading.Lock()


class InputPosition:
    """The global step a `distribute` input's next iterator starts at, on this worker."""

    def __init__(self, *, exact: bool) -> None:
        self.exact = exact
        """Whether each epoch's order can be built again in a new process (no unseeded shuffle)."""
        self.offset = 0
        """Global steps of the stream before the next iterator's first batch."""
        self.layout: dict = {}
        """How the steps are made (`layout_of`): what a resume in the middle of an epoch must find
        again."""
        self.plan: Any = None
        """This worker's `ShardPlan` (None until `distribute` has made it)."""
        self.num_elements: int | None = None
        """Examples in one epoch of the input (None: infinite)."""
        self.masked = 0
        """Examples of the first epoch, in the job's order, that the next iterator carries at weight
        0 (trained before a resume that changed the global batch: `rescaled_resume`)."""

    @property
    def steps(self) -> int | None:
        """Global steps in one epoch of the input (None: an infinite input, or no plan yet)."""
        return None if self.plan is None else self.plan.steps

    @property
    def replicas_per_worker(self) -> int:
        """Per-replica batches this worker's pipeline yields per global step."""
        return 1 if self.plan is None else self.plan.replicas_per_worker

    def start_at(
        self, epoch: int, step: int = 0, steps_per_epoch: int | None = None, masked: int = 0
    ) -> None:
        """Starts the next iterator at ``step`` of ``epoch``, with ``fit``'s ``steps_per_epoch``
        (default: the input's own), the epoch's first ``masked`` examples at weight 0."""
        per_epoch = steps_per_epoch or self.steps or 0
        with _lock:
            self.offset = int(epoch) * per_epoch + int(step)
            self.masked = int(masked)

    def start(self) -> tuple:
        """``(first epoch of the stream, per-replica batches to skip in it, examples of it masked,
        the example its first step ends at, the weight of that step's real examples)`` (read by the
        stream)."""
        with _lock:
            offset, masked = self.offset, self.masked
        epoch, step = divmod(offset, self.steps) if self.steps else (0, offset)
        until, weight = 0, 1.0
        # the rest of the step holding example ``masked``: its real examples weigh global / real
        if masked:
            size = self.plan.global_batch_size
            until = (step + 1) * size
            weight = size / (min(until, self.num_elements) - masked) / self.plan.step_weight(step)
        return (
            np.int64(epoch),
            np.int64(step * self.replicas_per_worker),
            np.int64(masked),
            np.int64(until),
            np.float32(weight),
        )


def layout_of(plan: Any) -> dict:
    """What a step of the input depends on, from this worker's `ShardPlan` (a backup records it)."""
    return {
        "global_batch_size": plan.global_batch_size,
        "num_workers": plan.num_workers,
        "shard_policy": plan.policy,
        "resizable": plan.resizable,
        "learning_rate_factor": 1.0,
    }


def check_resume(saved: dict, layout: dict, epoch: int, step: int) -> None:
    """Refuses a resume at ``step`` (> 0) of ``epoch`` whose steps would not hold the examples the
    backed-up run's steps held (``saved``: that run's `layout_of`): a resize under FILE sharding,
    another global batch.

    Raises:
        ValueError: naming what changed and the fix.
    """
    where = f"The backup continues epoch {epoch + 1} at step {step + 1}"
    if saved.get("global_batch_size") != layout["global_batch_size"] and not _rescalable(
        saved, layout
    ):
        raise ValueError(
            f"{where}, counted in global batches of {saved.get('global_batch_size')} examples. "
            f"Received: global_batch_size={layout['global_batch_size']}. Keep the global batch of "
            "the backed-up run (tfpar.data.distribute divides it over the replicas it now has), or "
            'resume from a backup at an epoch end (save_freq="epoch").'
        )
    if saved.get("num_workers") != layout["num_workers"] and not (
        saved.get("resizable") and layout["resizable"]
    ):
        raise ValueError(
            f"{where}, with {saved.get('num_workers')} workers reading "
            f"shard_policy={saved.get('shard_policy')!r}, and this run has {layout['num_workers']} "
            f"(shard_policy={layout['shard_policy']!r}): whole-file shards hold other examples for "
            "another number of workers, so the rest of the epoch would repeat some examples and "
            'skip others. Received: a resize in the middle of an epoch. Pass shard_policy="data" '
            "to tfpar.data.distribute (each step then holds the same examples whatever the number "
            "of workers), or resume with the backed-up number of workers."
        )


def _rescalable(saved, layout):
    """Whether a resume may continue at the same example with another global batch: an elastic job
    whose global batch follows its workers ("scale-lr"), before and now (whose steps must also be
    the job's order's: the check of the number of workers)."""
    return bool(saved.get("scale_lr") and layout.get("scale_lr"))


def rescaled_resume(saved: dict, layout: dict, step: int) -> tuple:
    """``(step, masked)``: where a resume at ``step`` of the backed-up run (``saved``, its
    `layout_of`) continues with ``layout``'s global batch: the step of this run that holds the
    backed-up run's next example, and the examples of the epoch before it (trained already: the
    stream carries them at weight 0). The same step and 0 when the global batch is the same.

    Raises:
        ValueError: as `check_resume`.
    """
    check_resume(saved, layout, saved.get("epoch", 0), step)
    if not step or saved["global_batch_size"] == layout["global_batch_size"]:
        return step, 0
    masked = step * saved["global_batch_size"]
    return masked // layout["global_batch_size"], masked


def register(dataset, position):
    """Ties ``position`` to ``dataset`` (what ``fit`` gets) for as long as ``dataset`` lives."""
    key = id(dataset)
    _positions[key] = position
    weakref.finalize(dataset, _positions.pop, key, None)


def position_of(x: Any) -> "InputPosition | None":
    """The `InputPosition` of ``fit``'s ``x`` if `distribute` made it, else None."""
    return _positions.get(id(x)) if x is not None else None


def start_where_fit_starts(model: Any, arguments: dict) -> None:
    """Before ``fit`` of a model tfpar owns: the input starts at ``initial_epoch`` (FaultTolerance
    may move it on)."""
    position = position_of(arguments.get("x"))
    if position is not None:
        position.start_at(arguments.get("initial_epoch") or 0, 0, arguments.get("steps_per_epoch"))


def check_elastic_batch(model: Any, arguments: dict) -> None:
    """Before ``fit`` in a worker of an elastic launch: a `distribute` input's global batch must
    divide over every number of workers the job may resize to
    (`tfpar._tasks.elastic_batch.ElasticBatch.check_global_batch`), in micro-batches where the
    model's strategy computes them, so that no resize fails when it happens."""
    from tfpar._tasks.elastic_batch import ElasticBatch

    setting, position = ElasticBatch.from_env(), position_of(arguments.get("x"))
    if (
        setting is None
        or position is None
        or "global_batch_size" not in position.layout
        or setting.scales_learning_rate
    ):
        # scale-lr: `distribute` checked the global batch given (its layout holds this size's)
        return
    if setting.batch == "accumulate" and not hasattr(
        getattr(model.distribute_strategy, "extended", None), "_microbatches"
    ):
        # a strategy that does not split its batch
        setting = dataclasses.replace(setting, batch="grow")
    setting.check_global_batch(position.layout["global_batch_size"], position.replicas_per_worker)
