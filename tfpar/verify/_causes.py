"""What `tfpar.verify` can see of why a variable differs from one replica: per-replica or per-step
BatchNormalization statistics, random layers, per-replica QAT ranges, asynchronous workers, and
loss-scale skips on one side only."""

import numpy as np

from tfpar import _compat
from tfpar.quantization import _exact_ranges as exact_ranges

__all__ = ["causes", "loss_scale_finding"]

_RANDOM_LAYERS = (
    "Dropout",
    "SpatialDropout1D",
    "SpatialDropout2D",
    "SpatialDropout3D",
    "GaussianDropout",
    "GaussianNoise",
    "AlphaDropout",
    "RandomFlip",
    "RandomRotation",
    "RandomZoom",
    "RandomTranslation",
    "RandomCrop",
    "RandomContrast",
    "RandomBrightness",
)


def causes(model, parallelism, batch, padded, accumulation=1):
    """{id(variable): [causes of its own layer]} and the model's causes for every variable, for
    ``model`` trained on one replica and under ``parallelism`` (its global ``batch``, ``padded``
    real examples in a padded last step, ``accumulation`` steps a update)."""
    from tfpar._keras import all_layers, keras_of

    k = keras_of(model)
    replicas = parallelism.num_replicas_in_sync
    microbatches = getattr(getattr(parallelism, "config", None), "num_microbatches", 1)
    split = replicas > 1 or microbatches > 1
    per = "microbatch" if microbatches > 1 else "replica"
    own = {}
    anywhere = _asynchronous_causes(parallelism)
    for layer in all_layers(model):
        cause = None
        kind = type(layer).__name__
        if isinstance(layer, k.layers.BatchNormalization):
            cause = _batch_norm_cause(layer, model, split, per, batch, padded, accumulation)
        elif kind in _RANDOM_LAYERS:
            cause = _random_layer_cause(layer, split, per)
        elif (
            kind.startswith("QuantizeWrapper") and replicas > 1 and not exact_ranges.enabled(layer)
        ):
            cause = (
                f"QAT ranges taken per replica (layer {layer.name!r}): each replica's "
                "fake-quant min/max follow its own examples and are averaged over the "
                "replicas; tfpar.quantization.quantize(model, ranges='exact') takes them over "
                "the global batch"
            )
        if cause:
            anywhere.append(cause)
            for variable in layer.weights:
                own[id(variable)] = [cause]
    return own, anywhere


def _asynchronous_causes(parallelism):
    """[the cause every variable shares under parameter servers with several workers], else []."""
    from tfpar._topology import topology_of

    topology = topology_of(parallelism.input_strategy)
    if topology.coordinator and topology.num_workers > 1:
        return [
            f"asynchronous training: the parameter servers apply each of the "
            f"{topology.num_workers} workers' steps as it comes, computed from stale "
            "weights, and the workers take their batches in the order they finish; "
            "with one worker (--replicas 1) it must match"
        ]
    return []


def _batch_norm_cause(layer, model, split, per, batch, padded, accumulation):
    """Why a BatchNormalization layer's statistics differ from one replica's, or None."""
    from tfpar._keras import is_keras3

    if split and not getattr(layer, "synchronized", False):
        fix = (
            "a pipeline cannot share them"
            if per == "microbatch"
            else "use BatchNormalization(synchronized=True)"
        )
        return (
            f"BatchNormalization statistics taken per {per} (layer {layer.name!r}): "
            f"each {per} normalizes its own examples; {fix}"
        )
    if padded:
        return (
            f"BatchNormalization statistics count padding (layer {layer.name!r}): the "
            f"last step holds {padded} examples padded to {batch}, and sample weights do "
            "not reach batch statistics; feed whole batches "
            "(tfpar.data.distribute(..., remainder='drop'))"
        )
    if accumulation > 1 and not is_keras3(model):
        return (
            "BatchNormalization statistics taken per accumulated step "
            f"(layer {layer.name!r}): each of the {accumulation} steps normalizes its own "
            f"global batch, the one-replica step all {accumulation} (tf_keras has no "
            "accumulation of its own to compare with)"
        )
    return None


def _random_layer_cause(layer, split, per):
    seed = getattr(layer, "seed", None)
    if seed is None:
        return (
            f"random layer {layer.name!r} ({type(layer).__name__}) draws without a fixed "
            f"seed, so the two runs draw different numbers: give it seed=..., or leave it out "
            "to verify"
        )
    noise_shape = getattr(layer, "noise_shape", None)
    shared = (
        noise_shape is not None
        and noise_shape[0] == 1
        and _compat.random_generator_type(layer) == "stateless"
    )
    if split and not shared:
        return (
            f"random layer {layer.name!r} ({type(layer).__name__}) draws per {per}: a {per} "
            "of B examples draws what one device draws for the first B of the whole batch; use "
            "a mask shared across the batch (noise_shape=(1, ...), rng_type='stateless'), or "
            "leave it out to verify"
        )
    return None


def loss_scale_finding(reference, distributed):
    """A finding when the two optimizers' loss scales disagree (a skip on one side only), else
    []."""
    from tfpar.precision import loss_scale_of

    mine, theirs = loss_scale_of(reference), loss_scale_of(distributed)
    if mine is None or theirs is None:
        return []
    mine, theirs = float(np.asarray(mine)), float(np.asarray(theirs))
    if mine == theirs:
        return []
    return [
        f"DIFF loss-scale skips differ: one replica ended with loss scale {mine:g}, the "
        f"distribution with {theirs:g} (a step was skipped on one side only: an overflow in "
        "one replica's gradients)"
    ]
