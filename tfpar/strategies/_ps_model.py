"""What parameter servers mean for a model: no synchronized BatchNormalization (each worker steps
alone, on its own batch), and where its variables' shards sit (`variable_placement`)."""

from typing import Any

from tfpar._keras import all_layers, keras_of

__all__ = ["refuse_synchronized_batchnorm", "variable_placement"]


def variable_placement(model: Any) -> dict[str, list[str]]:
    """Variable name (without ``/part_N``) -> devices of its shards."""
    placement: dict = {}
    for var in model.variables:
        base = var.name.split(":")[0]
        if "/part_" in base:
            base = base.rsplit("/part_", 1)[0]
        placement.setdefault(base, []).append(var.device)
    return placement


def refuse_synchronized_batchnorm(model, arguments=None):
    """At ``compile`` of a model built under parameter servers: a synchronized BatchNormalization
    needs replicas that step together; a parameter server's workers step alone, on their own
    batches."""
    for layer in all_layers(model):
        if isinstance(layer, keras_of(model).layers.BatchNormalization) and getattr(
            layer, "synchronized", False
        ):
            raise ValueError(
                "BatchNormalization(synchronized=True) cannot run under parameter servers: its "
                "statistics are summed over replicas that step together, and each worker here "
                "steps alone, on its own batch, whenever it is free. Received: layer "
                f"{layer.name!r} of {model.name!r} under "
                f"{type(model.distribute_strategy).__name__}. Use synchronized=False (statistics "
                "per worker batch), or DataParallel / HorovodStrategy, whose replicas step "
                "together."
            )
