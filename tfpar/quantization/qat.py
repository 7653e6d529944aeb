"""Quantization-aware training (TFMOT's default 8-bit scheme); int8 TFLite export is
`tfpar.quantization.export`.

`quantize` wraps a Sequential or Functional tf_keras model in fake-quant ops
(``quantize_annotate_layer`` on every layer but those excluded, then
``quantize_apply``), inside the strategy the model was built under, so that
QAT trains under DataParallel (one host or several workers) like any model.
The quantizers' ranges are moving averages that TensorFlow reduces across
replicas (``assign_moving_average`` averages the replicas' values), so they are
the same on every replica; `quantizer_ranges` reads them per replica.
Examples:
    >>> with strategy.scope():  # doctest: +SKIP
    ...     qat = tfpar.quantization.quantize(model)
    ...     qat.compile(...)
    >>> qat.fit(...)  # doctest: +SKIP
"""

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from tfpar._checks import check_choice, check_names
from tfpar._keras import keras
from tfpar.quantization import _exact_ranges
from tfpar.quantization._tfmot import (
    check_excluded_names,
    check_float32,
    check_graph_model,
    load_tfmot,
    owned,
    strip_wrappers,
)
from tfpar.quantization.clustering import clustered_kernels, unique_weights
from tfpar.quantization.pruning import sparsity

__all__ = ["PRESERVE", "RANGES", "quantize", "quantizer_ranges"]


PRESERVE = ("sparsity", "clusters")
"""What `quantize` can keep of an earlier compression: the zeros of a pruned model (PQAT), the
shared values of a clustered one (CQAT), or both (``("clusters", "sparsity")``)."""

RANGES = ("mean", "exact")
"""How `quantize`'s activation ranges combine replicas: "mean", TFMOT's moving averages of each
replica's batch min and max, averaged over replicas; "exact", of the min and max over the whole
global batch (a cross-replica MIN and MAX), so that QAT on N replicas equals QAT on one."""


def quantize(
    model: Any,
    exclude: Sequence[str] = (),
    *,
    preserve: str | Sequence[str] | None = None,
    ranges: str = "mean",
) -> Any:
    """Returns the quantization-aware copy of ``model`` (its weights, fake-quant ops added).

    Call it where the model was built (inside ``strategy.scope()`` or not): the
    new variables are created under the model's own strategy either way.

    Args:
        model: a built Sequential or Functional tf_keras model, float32. A pruned or clustered
            model may still wear its wrappers: they are stripped here.
        exclude: names of layers to leave in float.
        preserve: None (plain QAT), "sparsity" (pruning-preserving QAT: the zeros of a pruned
            model stay zero), "clusters" (cluster-preserving QAT: a clustered model keeps its
            shared values), or ``("clusters", "sparsity")`` for a model pruned then clustered
            with ``preserve_sparsity=True``.
        ranges: one of `RANGES`.

    Returns:
        The QAT model (not compiled).

    Raises:
        ValueError: a subclassed model, an excluded name that names no layer, a mixed
            precision policy (TFMOT's quantizers compute in float32: call
            ``tfpar.precision.use("float32")`` first), an unknown ``preserve`` or ``ranges``, or
            ``preserve="clusters"`` on a model that is not clustered.
    """
    check_graph_model(model, "quantize")
    check_float32("Quantization-aware training")
    exclude = check_names("exclude", exclude)
    preserved = _preserved(preserve)
    check_choice("ranges", ranges, RANGES, what="range reduction")
    model = strip_wrappers(model)
    check_excluded_names(model, exclude)
    tfmot = load_tfmot()
    scheme = tfmot.quantization.keras.default_8bit.Default8BitQuantizeScheme()
    if "clusters" in preserved:
        _check_clustered(model)
        scheme = tfmot.experimental.combine.Default8BitClusterPreserveQuantizeScheme(
            preserve_sparsity="sparsity" in preserved
        )
    elif "sparsity" in preserved:
        _warn_unless_sparse(model)
        scheme = tfmot.experimental.combine.Default8BitPrunePreserveQuantizeScheme()
    annotate = tfmot.quantization.keras.quantize_annotate_layer

    def clone(layer):
        if layer.name in exclude or isinstance(layer, keras.layers.InputLayer):
            return layer
        return annotate(layer)

    with model.distribute_strategy.scope():
        annotated = keras.models.clone_model(model, clone_function=clone)
        annotated.set_weights(model.get_weights())
        qat = tfmot.quantization.keras.quantize_apply(annotated, scheme)
    if ranges == "exact":
        _exact_ranges.enable(qat)
    return owned(qat)


def _preserved(preserve):
    """``preserve`` as a set of `PRESERVE` names."""
    if preserve is None:
        return frozenset()
    names = (preserve,) if isinstance(preserve, str) else preserve
    if (
        not isinstance(names, (tuple, list, set, frozenset))
        or not names
        or not all(isinstance(name, str) and name in PRESERVE for name in names)
    ):
        raise ValueError(
            f"Unknown preserve {preserve!r}. Received: preserve={preserve!r}. Use None, "
            "'sparsity', 'clusters' or ('clusters', 'sparsity')."
        )
    return frozenset(names)


def _check_clustered(model):
    if not clustered_kernels(model):
        counts = ", ".join(f"{name!r} {count}" for name, count in unique_weights(model).items())
        raise ValueError(
            "Cluster-preserving QAT keeps the shared weight values of a clustered model, and "
            f"{model.name!r} is not clustered: no kernel holds 256 distinct values or fewer "
            f"(distinct values per kernel: {counts}). Received: preserve='clusters'. Cluster it "
            "first: tfpar.quantization.cluster(model, clusters=16), fine-tune, then "
            "quantize(clustered, preserve='clusters'); or use preserve=None for plain QAT."
        )


SPARSE_ENOUGH = 0.1
"""`quantize(preserve="sparsity")` warns below this fraction of zeros in the prunable kernels."""


def _warn_unless_sparse(model):
    zeros = sparsity(model)
    if zeros < SPARSE_ENOUGH:
        warnings.warn(
            f"Pruning-preserving QAT keeps the zeros of a pruned model, and {model.name!r} has "
            f"only {zeros:.1%} zeros in its kernels: there is little to preserve, and QAT with "
            "preserve='sparsity' will train like plain QAT. Prune it first "
            "(tfpar.quantization.prune(model, 0.5, end_step=...)), or quantize with preserve=None.",
            stacklevel=3,
        )


def quantizer_ranges(model: Any) -> dict[str, Any]:
    """The fake-quant ranges: variable name -> one value per replica (numpy)."""
    ranges = {}
    for variable in model.non_trainable_variables:
        name = variable.name.split(":")[0]
        if name.endswith(("_min", "_max")):
            values = getattr(variable, "values", (variable,))
            ranges[name] = [np.asarray(v.numpy()) for v in values]
    return ranges
