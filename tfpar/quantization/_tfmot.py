"""What tfpar's pruning, clustering, QAT and export share about tensorflow-model-optimization
(TFMOT): its import, the models it can rewrite, and copies and strips of its wrappers."""

from tfpar import _compat, _owned
from tfpar._keras import check_tf_keras_model, keras

__all__ = [
    "WHY_TF_KERAS",
    "check_excluded_names",
    "check_float32",
    "check_graph_model",
    "fresh_copy",
    "load_tfmot",
    "owned",
    "strip_wrappers",
]

WHY_TF_KERAS = (
    "tensorflow-model-optimization, which wraps the layers in its pruning, clustering "
    "and fake-quantization wrappers, rewrites tf_keras models only"
)


def load_tfmot():
    """tensorflow_model_optimization, imported on first use (it takes seconds)."""
    import tensorflow_model_optimization as tfmot

    return tfmot


def check_graph_model(model, what):
    feature = {"prune": "Pruning", "cluster": "Clustering"}.get(what, "Quantization-aware training")
    check_tf_keras_model(model, feature, WHY_TF_KERAS)
    if not _compat.is_graph_network(model):
        raise ValueError(
            f"Cannot {what} the subclassed model {model.name!r} ({type(model).__name__}): "
            "tensorflow-model-optimization rebuilds models layer by layer from their graph, which "
            "a subclassed model's call() does not expose. Write it as a Sequential or Functional "
            "model (a subclassed layer inside is fine with a QuantizeConfig), or annotate its "
            "layers yourself with tfmot.quantization.keras.quantize_annotate_layer."
        )


def check_float32(what):
    policy = keras.mixed_precision.global_policy().name
    if policy != "float32":
        raise ValueError(
            f"{what} runs in float32. Received: the global policy {policy!r}. "
            "TFMOT's fake-quant and clustering ops need float32, so mixed precision "
            "adds nothing here: call tfpar.precision.use('float32') before building the model, and "
            "train the float model with mixed precision before compressing it if you like."
        )


def check_excluded_names(model, exclude):
    names = {layer.name for layer in model.layers}
    unknown = sorted(set(exclude) - names)
    if unknown:
        raise ValueError(
            f"exclude names no layer of {model.name!r}: {unknown}. Received: "
            f"exclude={list(exclude)}. Layers: {sorted(names)}."
        )


def strip_wrappers(model):
    """``model`` without TFMOT's pruning and clustering wrappers (itself when it has none)."""
    tfmot = load_tfmot()
    PruneLowMagnitude, ClusterWeights = _compat.tfmot_wrapper_classes()
    with model.distribute_strategy.scope():
        if any(isinstance(layer, PruneLowMagnitude) for layer in model.layers):
            model = tfmot.sparsity.keras.strip_pruning(model)
        if any(isinstance(layer, ClusterWeights) for layer in model.layers):
            model = tfmot.clustering.keras.strip_clustering(model)
    return model


def fresh_copy(model):
    """``model`` copied, weights included, into layers and variables of its own (under its
    strategy): TFMOT's pruning and clustering wrappers change the variables of the layers they
    wrap, and the model given must keep its own."""
    with model.distribute_strategy.scope():
        copy = keras.models.clone_model(model)
        copy.set_weights(model.get_weights())
    return copy


def owned(model):
    """``model``, made by a quantization entry point, as a model tfpar owns (`tfpar._owned`): it
    runs `tfpar._parallelism.owned_model_checks` (with those of the strategy it was made under)."""
    from tfpar._parallelism import owned_model_checks

    return _owned.own(model, owned_model_checks())
