"""Weight clustering through tensorflow-model-optimization, under any tfpar strategy.

`cluster` wraps every clusterable layer in TFMOT's ``ClusterWeights``: each kernel is drawn from
``clusters`` shared values (the centroids, trained), so that the int8 file compresses well.
With ``preserve_sparsity=True`` (after `tfpar.quantization.prune`) the zeros stay zeros:
pruning, then clustering that keeps the sparsity, then cluster-preserving QAT
(``quantize(preserve=("clusters", "sparsity"))``) is TFMOT's collaborative optimization.

Under a strategy the centroids are mirrored variables, made from the model's weights on the
first replica (worker 0's under several workers) and updated by the all-reduced gradients, and
each replica computes the same cluster indices from the same weights: every replica and worker
holds the same clusters (tested).

Examples:
    >>> with strategy.scope():  # doctest: +SKIP
    ...     clustered = tfpar.quantization.cluster(model, clusters=16)
    ...     clustered.compile(...)
    >>> clustered.fit(...)  # doctest: +SKIP
    >>> tfpar.quantization.unique_weights(tfpar.quantization.strip_clustering(clustered))  #
    doctest: +SKIP {'conv2d': 16, 'dense': 16, ...}
"""

from collections.abc import Sequence
from typing import Any

import numpy as np

from tfpar import _compat
from tfpar._checks import check_choice, check_int, check_names
from tfpar._keras import keras
from tfpar.quantization._tfmot import (
    check_excluded_names,
    check_float32,
    check_graph_model,
    fresh_copy,
    load_tfmot,
    owned,
    strip_wrappers,
)

__all__ = ["CENTROID_INITS", "cluster", "clustered_kernels", "strip_clustering", "unique_weights"]

CENTROID_INITS = ("kmeans++", "linear", "density")
"""How `cluster` places the first centroids: k-means++ over the weights (TFMOT's default),
evenly between their minimum and maximum, or by their density."""


def cluster(
    model: Any,
    clusters: int = 16,
    *,
    exclude: Sequence[str] = (),
    preserve_sparsity: bool = False,
    init: str = "kmeans++",
) -> Any:
    """Returns the clustering copy of ``model``: its clusterable kernels each drawn from
    ``clusters`` trained centroids. Train it (fine-tune: a lower learning rate than the float
    training), then `strip_clustering` it before export or QAT.

    Call it where the model was built (inside ``strategy.scope()`` or not): the centroids are
    created under the model's own strategy either way.

    Args:
        model: a built Sequential or Functional tf_keras model, float32 (a pruned one stripped
            with `strip_pruning`, or still wrapped: its pruning wrappers are stripped here).
        clusters: the number of shared values per kernel, >= 2 (>= 3 with ``preserve_sparsity``,
            one of which is kept at zero).
        exclude: names of layers to leave unclustered (layers TFMOT cannot cluster must be).
        preserve_sparsity: keep the zeros of a pruned model at zero while clustering.
        init: one of `CENTROID_INITS`.

    Raises:
        ValueError: ``clusters`` too small, a layer TFMOT cannot cluster (named, with the
            ``exclude`` that skips it), an excluded name that names no layer, a subclassed
            model, or a mixed precision policy.
    """
    check_graph_model(model, "cluster")
    check_float32("Clustering")
    check_int(
        "clusters",
        clusters,
        3 if preserve_sparsity else 2,
        " With preserve_sparsity=True one of them is the zero cluster."
        if preserve_sparsity
        else "",
    )
    check_choice("init", init, CENTROID_INITS, what="centroid initialization")
    exclude = check_names("exclude", exclude)
    tfmot = load_tfmot()
    model = strip_wrappers(model)
    check_excluded_names(model, exclude)
    refused = [
        layer
        for layer in model.layers
        if layer.name not in exclude
        and not isinstance(layer, keras.layers.InputLayer)
        and not _compat.tfmot_can_cluster(layer)
        and not isinstance(layer, tfmot.clustering.keras.ClusterableLayer)
    ]
    if refused:
        names = [layer.name for layer in refused]
        raise ValueError(
            "TFMOT cannot cluster "
            f"{', '.join(f'{layer.name!r} ({type(layer).__name__})' for layer in refused)} of "
            f"{model.name!r}. Received: exclude={list(exclude)}. Leave them in float with "
            f"exclude={sorted(set(exclude) | set(names))}, or make the layer a "
            "tfmot.clustering.keras.ClusterableLayer."
        )
    method = {"kmeans++": "KMEANS_PLUS_PLUS", "linear": "LINEAR", "density": "DENSITY_BASED"}[init]
    settings = dict(
        number_of_clusters=clusters,
        preserve_sparsity=preserve_sparsity,
        cluster_centroids_init=getattr(tfmot.clustering.keras.CentroidInitialization, method),
    )

    def wrap(layer):
        if layer.name in exclude or isinstance(layer, keras.layers.InputLayer) or not layer.weights:
            return layer
        return tfmot.clustering.keras.cluster_weights(layer, **settings)

    with model.distribute_strategy.scope():
        return owned(keras.models.clone_model(fresh_copy(model), clone_function=wrap))


def strip_clustering(model: Any) -> Any:
    """The model without clustering wrappers (the clustered weights kept), for QAT and export."""
    return load_tfmot().clustering.keras.strip_clustering(model)


def unique_weights(model: Any) -> dict[str, int]:
    """The number of distinct values in each layer's kernel (a stripped model): layer name ->
    count."""
    counts = {}
    for layer in model.layers:
        kernel = getattr(layer, "kernel", None)
        if kernel is not None:
            counts[layer.name] = int(np.unique(kernel.numpy()).size)
    return counts


def clustered_kernels(model: Any, max_unique: int = 256) -> dict[str, int]:
    """The layers whose kernel holds at most ``max_unique`` distinct values among more weights
    than that: what clustering leaves (a stripped model). Layer name -> distinct values."""
    sizes = {
        layer.name: int(np.prod(layer.kernel.shape))
        for layer in model.layers
        if getattr(layer, "kernel", None) is not None
    }
    return {
        name: unique
        for name, unique in unique_weights(model).items()
        if sizes[name] > max_unique and unique <= max_unique
    }
