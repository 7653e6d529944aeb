"""Ray Train's private internals: what it places per worker."""

__all__ = [
    "ray_resources_per_worker",
]


def ray_resources_per_worker(scaling_config):
    """What Ray places per worker of ``scaling_config``, its defaults included (a private property
    of ``ScalingConfig``), or None where Ray no longer has it."""
    return getattr(scaling_config, "_resources_per_worker_not_none", None)
