"""Global batch vs per-replica batch: the one rule, checked in one place."""

from tfpar._checks import check_int

__all__ = ["per_replica_batch_size"]


def per_replica_batch_size(global_batch_size: int, num_replicas: int) -> int:
    """Returns ``global_batch_size // num_replicas``, checking it divides.

    Examples:
        >>> per_replica_batch_size(64, 2)
        32

    Raises:
        TypeError: if ``global_batch_size`` is not an int.
        ValueError: if it is below 1 or not divisible by ``num_replicas``.
    """
    check_int("global_batch_size", global_batch_size, 1)
    if global_batch_size % num_replicas:
        lower = global_batch_size - global_batch_size % num_replicas
        upper = lower + num_replicas
        options = f"{lower} or {upper}" if lower else f"{upper}"
        raise ValueError(
            f"The global batch size must be divisible by the number of "
            f"replicas so that every replica gets the same batch. Received: "
            f"global_batch_size={global_batch_size} with {num_replicas} "
            f"replicas. Use e.g. {options}."
        )
    return global_batch_size // num_replicas
