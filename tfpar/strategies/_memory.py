"""What each replica of a data-parallel strategy holds (`DataParallel`, `HorovodStrategy`): ZeRO's
sharded optimizer state and gradients, and remat's recomputed blocks; the model checks that set
them up and the ``describe()`` lines that show them."""

from tfpar.remat import remat_check, remat_lines
from tfpar.strategies._gradients import GRADIENT_CHECKS
from tfpar.strategies._zero import shard_optimizer_state
from tfpar.strategies._zero3 import shard_parameters

__all__ = ["memory_checks", "memory_lines"]


def memory_checks(config) -> tuple:
    """The model checks (`tfpar._owned`) of a data-parallel config: its gradients' (compression,
    accumulation), ZeRO's sharding after compile, remat's blocks before fit."""
    return (
        *GRADIENT_CHECKS,
        ("compile", "after", shard_optimizer_state),
        ("compile", "after", shard_parameters),
        *remat_check(config.remat),
    )


def memory_lines(config, num_replicas: int, model=None) -> list[str]:
    """The ``describe()`` lines of ZeRO and remat (the blocks only with a model)."""
    return zero_lines(config.zero_stage, num_replicas, model) + remat_lines(config.remat, model)


def zero_lines(stage: int, num_replicas: int, model=None) -> list[str]:
    """The ``describe()`` lines of ZeRO: the stage, and with a compiled model the bytes one replica
    holds, sharded against unsharded."""
    if not stage:
        return []
    held = {
        1: "the optimizer state (reduce-scatter + all-gather)",
        2: "the optimizer state and of the reduced gradients (reduce-scatter + all-gather)",
        3: "the parameters, their gradients and the optimizer state (each parameter all-gathered "
        "where a layer reads it, its gradient reduce-scattered)",
    }
    lines = [
        f"  zero:       stage {stage}: each replica keeps and updates 1/{num_replicas} of "
        + held[stage]
    ]
    sharded = getattr(model, "_tfpar_zero", None)
    if sharded is not None:
        held = sharded.state_bytes()
        lines.append(
            "  per replica: "
            + ", ".join(
                f"{name} {unsharded:,} B -> {mine:,} B" for name, (unsharded, mine) in held.items()
            )
        )
        largest = max([4 * bucket.size for bucket in sharded.buckets], default=0)
        if stage == 3:
            return lines
        lines.append(
            f"  buckets:    {len(sharded.buckets)}, exchanged and updated in turn (the largest "
            f"{largest:,} B)"
        )
    return lines
