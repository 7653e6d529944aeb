"""Pure planning of input sharding: which policy, how many steps. No TensorFlow.

Kept apart from the tf.data code so that the arithmetic that guarantees "every
worker runs the same number of steps" can be tested exhaustively.
"""

import dataclasses
import math
import warnings
from collections.abc import Sequence

from tfpar._checks import check_choice

__all__ = ["REMAINDERS", "SHARD_POLICIES", "ShardPlan", "plan_shard"]

SHARD_POLICIES = ("auto", "file", "data", "off")
"""How the input is split across workers: "file" gives each worker whole
files, "data" deals each global step's examples out in consecutive parts (worker w takes the
w-th part of every step, so a step holds the same examples whatever the number of workers and
`tfpar.data.distribute` keeps exactly once across a resize), "off" gives every worker
everything, "auto" picks "file" when there are at least as many files as
workers, else "data"."""

REMAINDERS = ("pad", "drop")
"""What happens to the examples that do not fill a last global batch: "pad"
fills the batch with masked examples (sample weight 0) so every example is
seen exactly once, and weighs that step's real examples global/real so that its
loss and gradient are their mean; "drop" leaves them out, as ``drop_remainder=True``."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShardPlan:
    """How one worker reads its shard of the input, decided before reading."""

    policy: str
    """The resolved policy: "file", "data" or "off"."""
    num_workers: int
    """Number of workers (input pipelines)."""
    worker_index: int
    """This worker's index in [0, num_workers)."""
    replicas_per_worker: int
    """Replicas fed by this worker's pipeline, one per-replica batch each per step."""
    per_replica_batch: int
    """Examples in each per-replica batch."""
    remainder: str
    """"pad" or "drop" (see `REMAINDERS`)."""
    steps: int | None = None
    """Global steps per epoch, the same on every worker; None for an infinite
    input (then ``fit`` needs ``steps_per_epoch``)."""
    files: tuple | None = None
    """This worker's files, for the "file" policy."""
    padded: bool = False
    """Whether some worker pads its last batches: then every worker's batches
    carry a sample-weight entry (0 for padding), so all workers agree on the
    structure; with no padding anywhere, examples pass through unchanged."""
    padded_step_weights: tuple = ()
    """The weight of a real example in each of the epoch's last steps that hold
    padding (the tail of the epoch, in order): global batch / real examples in
    that step across all workers. Keras divides a step's weighted loss sum by
    the global batch, so with it the step's loss and gradient are the mean over
    its real examples, as on one device fed a short last batch."""

    @property
    def global_batch_size(self):
        """Examples in one step across all workers."""
        return self.per_replica_batch * self.replicas_per_worker * self.num_workers

    @property
    def resizable(self):
        """Whether a step holds the same examples whatever the number of workers ("data", or one
        worker reading everything), so that a resume in the middle of an epoch may change that
        number."""
        return self.policy == "data" or self.num_workers == 1

    @property
    def first_weighted_step(self):
        """The first step of the epoch whose real examples weigh more than 1 (= ``steps`` if
        none)."""
        return (self.steps or 0) - len(self.padded_step_weights)

    def step_weight(self, step: int) -> float:
        """The weight of a real example in ``step`` (0-based, within the epoch): 1, or
        `padded_step_weights` for the trailing steps that hold padding."""
        first = self.first_weighted_step
        return self.padded_step_weights[step - first] if step >= first else 1.0


def _resolve_policy(policy, num_files, num_workers):
    if policy == "auto":
        if num_workers == 1:
            return "off"
        if num_files is not None and num_files >= num_workers:
            return "file"
        if num_files is not None:
            warnings.warn(
                f"Sharding by DATA: there are {num_files} file(s) for "
                f"{num_workers} workers, so every worker reads every file and "
                f"keeps 1/{num_workers} of the examples (slower than FILE "
                f"sharding). Split the input into at least {num_workers} files "
                "to shard by FILE.",
                stacklevel=4,
            )
        return "data"
    if policy == "file":
        if num_files is None:
            raise ValueError(
                "shard_policy='file' needs the input as a list of files. "
                "Received: a dataset. Pass the file names (with reader=) or "
                "use shard_policy='data'."
            )
        if num_files < num_workers:
            raise ValueError(
                f"shard_policy='file' needs at least one file per worker. "
                f"Received: {num_files} file(s) for {num_workers} workers. Use "
                "shard_policy='data' (or 'auto'), or split the input into "
                f"at least {num_workers} files."
            )
    return policy


def _shard_sizes(num_elements, file_sizes, policy, num_workers, per_step):
    """Every worker's shard size, or None for an infinite input."""
    if num_elements is None:
        return None
    if policy == "off":
        return [num_elements] * num_workers
    if policy == "file":
        return [sum(file_sizes[w::num_workers]) for w in range(num_workers)]
    # "data": parts of ``per_step`` examples, part c to worker c mod W; only the last part is short.
    full, rest = divmod(num_elements, per_step)
    return [
        len(range(w, full, num_workers)) * per_step + (rest if full % num_workers == w else 0)
        for w in range(num_workers)
    ]


def _padded_step_weights(shards, steps, replicas_per_worker, per_replica_batch):
    """``global / real`` for each trailing step with padding (see `ShardPlan.padded_step_weights`).

    Each worker batches its shard per replica and hands step s the batches
    s*R .. s*R+R-1 of its stream; a batch i holds min(b, shard - i*b) real examples.
    """
    global_batch = len(shards) * replicas_per_worker * per_replica_batch
    weights = []
    for step in reversed(range(steps)):
        first = step * replicas_per_worker
        real = sum(
            min(per_replica_batch, max(0, shard - (first + r) * per_replica_batch))
            for shard in shards
            for r in range(replicas_per_worker)
        )
        if real == global_batch:
            break
        weights.append(global_batch / real)
    return tuple(reversed(weights))


def plan_shard(
    *,
    num_workers: int,
    worker_index: int,
    replicas_per_worker: int,
    per_replica_batch: int,
    policy: str = "auto",
    remainder: str = "pad",
    num_elements: int | None = None,
    files: Sequence[str] | None = None,
    file_sizes: Sequence[int] | None = None,
) -> "ShardPlan":
    """Plans one worker's shard.

    Args:
        num_workers: number of workers (input pipelines), >= 1.
        worker_index: this worker, in [0, num_workers).
        replicas_per_worker: replicas this worker's pipeline feeds.
        per_replica_batch: examples per replica and step.
        policy: one of `SHARD_POLICIES`.
        remainder: one of `REMAINDERS`.
        num_elements: examples in the whole (unsharded) input; None for an
            infinite input.
        files: the input files, or None when the input is a dataset.
        file_sizes: examples in each file (needed for "file" sharding of a
            finite input).

    Returns:
        A `ShardPlan`.

    Examples:
        >>> plan = plan_shard(num_workers=2, worker_index=0, replicas_per_worker=1,
        ...                   per_replica_batch=2, policy="data", num_elements=23)
        >>> plan.steps, plan.padded, plan.padded_step_weights  # the last step: 3 real of 4
        (6, True, (1.3333333333333333,))

    Raises:
        ValueError: on an unknown policy or remainder, FILE sharding without
            files or with fewer files than workers, or an index out of range.
    """
    check_choice("shard_policy", policy, SHARD_POLICIES)
    check_choice("remainder", remainder, REMAINDERS)
    if not 0 <= worker_index < num_workers:
        raise ValueError(f"worker_index must be in [0, {num_workers}). Received: {worker_index}.")
    num_files = None if files is None else len(files)
    resolved = _resolve_policy(policy, num_files, num_workers)
    if (
        resolved == "file"
        and num_elements is not None
        and (file_sizes is None or len(file_sizes) != num_files)
    ):
        raise ValueError(
            "FILE sharding of a finite input needs the size of every file. "
            f"Received: file_sizes={file_sizes!r} for {num_files} file(s)."
        )
    per_step = replicas_per_worker * per_replica_batch
    shards = _shard_sizes(num_elements, file_sizes, resolved, num_workers, per_step)
    steps, padded, weights = None, False, ()
    if shards is not None:
        smallest, largest = min(shards), max(shards)
        steps = math.ceil(largest / per_step) if remainder == "pad" else smallest // per_step
        if steps == 0:
            raise ValueError(
                f"The input yields no step: {num_elements} example(s) with "
                f"remainder={remainder!r}, {per_step} examples per worker and "
                f"step (global batch {per_step * num_workers}). Received: "
                f"num_elements={num_elements}. Use a smaller global batch, "
                "more data, or remainder='pad'."
            )
        padded = remainder == "pad" and smallest < steps * per_step
        if padded:
            weights = _padded_step_weights(shards, steps, replicas_per_worker, per_replica_batch)
    return ShardPlan(
        policy=resolved,
        num_workers=num_workers,
        worker_index=worker_index,
        replicas_per_worker=replicas_per_worker,
        per_replica_batch=per_replica_batch,
        remainder=remainder,
        steps=steps,
        files=tuple(files[worker_index::num_workers])
        if resolved == "file" and files is not None
        else None,
        padded=padded,
        padded_step_weights=weights,
    )
