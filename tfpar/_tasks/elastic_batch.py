"""How an elastic job's workers keep the global batch, and the learning rate with it: what
`tfpar launch --elastic-batch` tells each worker (`ELASTIC_VARIABLE`), which `DataParallel`,
`tfpar.data` and the learning-rate callbacks read. Pure Python, no imports of the launcher."""

import dataclasses
import json
import math
import os

from tfpar._checks import check_choice, check_int
from tfpar._tasks.env import ELASTIC_VARIABLE

__all__ = ["ELASTIC_BATCHES", "SCALING_RULES", "ElasticBatch", "rule_factor"]

SCALING_RULES = ("linear", "sqrt")
"""How the learning rate follows the global batch: ``linear`` (Goyal et al. 2017: k times the batch,
k times the rate, with a warm-up) or ``sqrt`` (Krizhevsky 2014, Hoffer et al. 2017: sqrt(k) times
the rate, which keeps the noise of the update; LAMB's paper scales that way). `tfpar.callbacks`
exports it."""


def rule_factor(ratio: float, rule: str) -> float:
    """What a learning rate is multiplied by when the global batch is multiplied by ``ratio``, by
    ``rule`` (one of `SCALING_RULES`): the one formula behind `tfpar.callbacks.scaled_learning_rate`
    and `ElasticBatch.learning_rate_factor`."""
    return ratio if rule == "linear" else math.sqrt(ratio)


ELASTIC_BATCHES = ("accumulate", "grow", "scale-lr", "scale-lr-sqrt")
"""How an elastic job on fewer workers than its reference trains: "accumulate" (the default) keeps
the global batch, each replica computing its batch in micro-batches no larger than the reference's
per-replica batch and applying their accumulated gradients once (DeepSpeed's elasticity keeps its
micro-batch so too); "grow" keeps it with larger per-replica batches; "scale-lr" keeps the
per-replica batch, so the global batch follows the workers, and scales the learning rate with it by
the linear rule (Goyal et al. 2017), "scale-lr-sqrt" by the square root (`SCALING_RULES`)."""


@dataclasses.dataclass(frozen=True)
class ElasticBatch:
    """What an elastic launch tells its workers (`ELASTIC_VARIABLE`): the global batch is divided
    for ``reference_workers``; the job trains on ``min_workers`` or more."""

    reference_workers: int
    min_workers: int
    batch: str = "accumulate"

    def __post_init__(self):
        check_int("reference_workers", self.reference_workers, 1)
        check_int("min_workers", self.min_workers, 1)
        check_choice("elastic_batch", self.batch, ELASTIC_BATCHES)

    @property
    def scales_learning_rate(self) -> bool:
        """Whether the global batch follows the workers and the learning rate with it
        ("scale-lr")."""
        return self.learning_rate_rule is not None

    def microbatches(self, workers: int) -> int:
        """The micro-batches each replica's batch is computed in on ``workers`` workers: the fewest
        that keep a micro-batch within the reference's per-replica batch (1 at the reference size or
        above, or unless "accumulate")."""
        if self.batch != "accumulate" or workers >= self.reference_workers:
            return 1
        return math.ceil(self.reference_workers / workers)

    def global_batch(self, given: int, workers: int) -> int:
        """The global batch a step holds on ``workers`` workers, ``given`` the one set for the
        reference: the same, or under "scale-lr" the reference's per-replica batch on each replica
        (``given * workers / reference``; `check_global_batch` makes it whole)."""
        return given * workers // self.reference_workers if self.scales_learning_rate else given

    @property
    def learning_rate_rule(self) -> str | None:
        """The scaling rule of "scale-lr" ("linear") or "scale-lr-sqrt" ("sqrt"); None otherwise."""
        return {"scale-lr": "linear", "scale-lr-sqrt": "sqrt"}.get(self.batch)

    def learning_rate_factor(self, workers: int) -> float:
        """What the learning rate is multiplied by on ``workers`` workers: 1, or under "scale-lr"
        the scaling rule's factor for a global batch ``workers / reference`` times the
        reference's."""
        rule = self.learning_rate_rule
        return 1.0 if rule is None else rule_factor(workers / self.reference_workers, rule)

    def check_global_batch(self, global_batch_size: int, replicas_per_worker: int) -> None:
        """Refuses a global batch that one of the job's sizes (``min_workers`` to
        ``reference_workers``) cannot divide into its replicas' micro-batches (under "scale-lr":
        that the reference cannot divide, since each size keeps its per-replica batch): that resize
        would fail when it happens, so it fails now.

        Raises:
            ValueError: naming the sizes, the global batch to use instead and the other fixes.
        """
        sizes = range(self.min_workers, max(self.min_workers, self.reference_workers) + 1)
        if self.scales_learning_rate:  # each size takes the reference's per-replica batch
            parts = {w: self.reference_workers * replicas_per_worker for w in sizes}
        else:
            parts = {w: w * replicas_per_worker * self.microbatches(w) for w in sizes}
        bad = [w for w, p in parts.items() if global_batch_size % p]
        if not bad:
            return
        multiple = math.lcm(*parts.values())
        fit = max(multiple, round(global_batch_size / multiple) * multiple)
        if self.scales_learning_rate:
            how = (
                f"{self.reference_workers} workers x {replicas_per_worker} replica(s), each size "
                "keeping that per-replica batch"
            )
        else:
            how = " x ".join(
                ["workers", f"{replicas_per_worker} replica(s)"]
                + (["micro-batches"] if self.batch == "accumulate" else [])
            )
        raise ValueError(
            f"This elastic job trains on {self.min_workers} to {self.reference_workers} workers, "
            f"and its global batch does not divide into equal parts ({how}) on "
            f"{', '.join(f'{w} ({parts[w]} parts)' for w in bad)} worker(s): a resize there would "
            f"fail. Received: global_batch_size={global_batch_size}. Use a multiple of {multiple} "
            f"(e.g. {fit}), or narrow --min-workers/--max-workers."
        )

    def to_env(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_env(cls, environ=None) -> "ElasticBatch | None":
        """The setting of this worker's elastic launch, or None outside one."""
        text = (os.environ if environ is None else environ).get(ELASTIC_VARIABLE)
        return cls(**json.loads(text)) if text else None
