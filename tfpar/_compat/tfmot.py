"""tensorflow-model-optimization's private internals (imported when first asked: TFMOT loads
slowly): its wrapper classes, its clustering registry and its quantizers' range updates."""

__all__ = [
    "tfmot_can_cluster",
    "tfmot_quant_ops",
    "tfmot_wrapper_classes",
]


def tfmot_wrapper_classes():
    """``(PruneLowMagnitude, ClusterWeights)``: the layers TFMOT's pruning and clustering wrap a
    layer in, to see whether a model still wears them (TFMOT exports only the functions that add and
    strip them)."""
    from tensorflow_model_optimization.python.core.clustering.keras.cluster_wrapper import (
        ClusterWeights,
    )
    from tensorflow_model_optimization.python.core.sparsity.keras.pruning_wrapper import (
        PruneLowMagnitude,
    )

    return PruneLowMagnitude, ClusterWeights


def tfmot_can_cluster(layer):
    """Whether TFMOT's registry knows how to cluster a built-in ``layer`` (``cluster_weights`` fails
    deep inside otherwise; TFMOT has no public query)."""
    from tensorflow_model_optimization.python.core.clustering.keras.clustering_registry import (
        ClusteringRegistry,
    )

    return ClusteringRegistry.supports(layer)


def tfmot_quant_ops():
    """TFMOT's quant_ops module, whose ``tf.__internal__.train.assign_moving_average`` and
    ``tf_compat.assign`` calls update the activation ranges: ``quantize(ranges="exact")`` gives it
    views of both (TFMOT has no hook on how a range is updated)."""
    from tensorflow_model_optimization.python.core.quantization.keras import quant_ops

    return quant_ops
