"""Which layers of a model recompute their activations (`tfpar.remat`): the blocks a ``remat``
option names, and those kept with the reason.

Recomputing each small layer saves nothing: its output is kept as the next one's input anyway.
A block saves what its sublayers hold between its input and its output, so ``"blocks"`` takes the
layers that have sublayers of their own (a KerasHub backbone's transformer layers, a tutorial's
``TransformerBlock``) in the model and in the models nested in it.
"""

import dataclasses
import fnmatch
import math
from typing import Any

__all__ = ["RematPlan", "check_remat", "plan_remat", "why_kept"]

CHOICES = ("none", "blocks")


def check_remat(value: Any) -> Any:
    """Raises TypeError/ValueError unless ``value`` is a ``remat`` option: "none", "blocks" or a
    list of layer names and fnmatch patterns; returns it (a list as a tuple)."""
    if isinstance(value, str):
        if value not in CHOICES:
            raise ValueError(
                f'remat takes "none", "blocks" or a list of layer names or patterns. Received: '
                f"remat={value!r}. Give a list for one layer: remat=[{value!r}]."
            )
        return value
    if not isinstance(value, (list, tuple)) or not value:
        raise TypeError(
            'remat takes "none", "blocks" or a non-empty list of layer names or patterns '
            f'(fnmatch, e.g. ["transformer_layer_*"]). Received: remat={value!r}.'
        )
    for name in value:
        if not isinstance(name, str) or not name:
            raise TypeError(
                f"remat's list holds layer names or patterns (non-empty strings). Received: "
                f"{name!r} in remat={list(value)!r}."
            )
    return tuple(value)


@dataclasses.dataclass(frozen=True)
class RematPlan:
    """The blocks that recompute their activations and those kept, each with why."""

    recomputed: tuple = ()
    """The layers whose calls recompute their activations in the backward pass."""
    kept: tuple = ()
    """(layer name, why) of each block ``remat`` chose whose activations stay."""
    scoped: tuple = ()
    """The names of the recomputed blocks a Keras 3 `RematScope` chose."""
    taken: tuple = ()
    """The kept blocks and the models: tfpar stops Keras' own RematScope recomputation of each
    (not inside: a model's blocks are tfpar's, a kept block's layers stay as the user made them;
    `tfpar.remat.apply_remat`)."""

    def lines(self) -> list[str]:
        """The ``describe()`` lines."""
        if not self.recomputed and not self.kept:
            return []
        names = [layer.name for layer in self.recomputed]
        if len(names) > 4:
            names = [*names[:2], "...", names[-1]]
        lines = [
            f"  remat:      {len(self.recomputed)} block(s) recompute their activations in the "
            f"backward pass (one more forward each): {', '.join(names) or 'none'}"
        ]
        if self.scoped:
            lines.append(
                f"  remat scope: {len(self.scoped)} of them chosen by Keras' RematScope, "
                "recomputed by tfpar with the state their forward read"
            )
        lines += [f"  remat kept: {name}: {why}" for name, why in self.kept]
        return lines


def plan_remat(model: Any, remat: Any) -> "RematPlan":
    """The `RematPlan` of ``remat`` on ``model``, with the layers a Keras 3 `RematScope` chose
    (whatever ``remat``: a scope the user set is honoured).

    Raises:
        ValueError: a name or pattern of ``remat`` matches no layer of the model.
    """
    if remat == "none":
        chosen = []
    else:
        chosen = _blocks(model) if remat == "blocks" else _named(model, remat)
    by_scope = _scoped(model)
    scoped = {id(layer) for layer in by_scope} - {id(layer) for layer in chosen}
    recomputed = []
    kept = []
    for layer in _outermost(chosen + by_scope):
        why = why_kept(layer)
        if why:
            kept.append((layer, why))
        else:
            recomputed.append(layer)
    from tfpar import _compat

    models = [layer for layer in _compat.flatten_layers(model) if _is_model(layer)]
    return RematPlan(
        tuple(recomputed),
        tuple((layer.name, why) for layer, why in kept),
        tuple(layer.name for layer in recomputed if id(layer) in scoped),
        tuple([layer for layer, _ in kept] + models),
    )


def _sublayers(layer):
    from tfpar import _compat

    return _compat.flatten_layers(layer, include_self=False, recursive=False)


def _is_model(layer):
    return hasattr(layer, "fit") and hasattr(layer, "compile")


def _blocks(container):
    """The layers with sublayers of ``container`` and of the models nested in it, each once (a
    layer two models share, a task model's and its backbone's embedding, is one)."""
    found = []
    for layer in _sublayers(container):
        if _is_model(layer):
            found += [block for block in _blocks(layer) if block not in found]
        elif _sublayers(layer) and layer not in found:
            found.append(layer)
    return found


def _named(model, patterns):
    from tfpar import _compat

    layers = [layer for layer in _compat.flatten_layers(model) if layer is not model]
    chosen = []
    for pattern in patterns:
        matched = [layer for layer in layers if fnmatch.fnmatchcase(layer.name, pattern)]
        if not matched:
            raise ValueError(
                f"remat names layers of the model, and {pattern!r} matches none of "
                f"{model.name!r}'s. Received: remat={list(patterns)!r}. Its layers: "
                f"{', '.join(layer.name for layer in layers[:12])}"
                + (", ..." if len(layers) > 12 else "")
                + '. Name some of them, or give remat="blocks".'
            )
        chosen += [layer for layer in matched if layer not in chosen]
    # a model named: its blocks
    return [
        block for layer in chosen for block in (_blocks(layer) if _is_model(layer) else [layer])
    ]


def _outermost(layers):
    """``layers`` once each, but those inside another of them (recomputed with it)."""
    from tfpar import _compat

    unique = list({id(layer): layer for layer in layers}.values())
    inside = {
        id(sub) for layer in unique for sub in _compat.flatten_layers(layer, include_self=False)
    }
    return [layer for layer in unique if id(layer) not in inside]


def _scoped(model):
    """The layers of ``model`` a Keras 3 `RematScope` would recompute, by its mode: every layer
    made in a "full" scope, those named in a "list_of_layers" one, and those of a "larger_than" one
    whose output at its first call in the model's graph, the batch counted as 1, is larger than its
    threshold (Keras sizes each call's output, its batch included, and may choose more: those stay
    Keras'); a model chosen stands for its blocks. An "activations" scope recomputes activation
    functions only, which hold no state: Keras' own recomputation is right there, and stays."""
    from tfpar import _compat

    chosen = []
    for layer in _compat.flatten_layers(model):
        if _scope_chooses(layer):
            chosen += _blocks(layer) if _is_model(layer) else [layer]
    return chosen


def _scope_chooses(layer):
    from tfpar import _compat
    from tfpar._keras import keras_of

    scope = _compat.keras3_remat_mode(layer)
    if scope is None or isinstance(layer, keras_of(layer).layers.InputLayer):
        return False
    if scope.mode == "full":
        return True
    if scope.mode == "list_of_layers":
        return layer.name in scope.layer_names
    if scope.mode == "larger_than":
        return _output_size(layer) > scope.output_size_threshold
    return False


def _output_size(layer):
    """The number of values of ``layer``'s output at its first call, the batch counted as 1; 0
    where it is not known (a layer called outside a graph)."""
    from tfpar._keras import tf

    try:
        outputs = layer.output
    except (AttributeError, ValueError):
        return 0
    leaves = tf.nest.flatten(outputs)  # a None among them too
    return sum(math.prod(d or 1 for d in leaf.shape) for leaf in leaves if hasattr(leaf, "shape"))


def why_kept(block):
    """Why ``block`` keeps its activations, or None: recomputing it would train another model."""
    from tfpar import _compat
    from tfpar._keras import is_keras3, keras_of

    embedding = keras_of(block).layers.Embedding
    layers = _compat.flatten_layers(block)
    for layer in layers:
        if isinstance(layer, embedding):
            return (
                f"holds the Embedding {layer.name!r}: recomputed, its gradient (the rows looked "
                "up) would be the whole table, held and all-reduced whole"
            )
        if getattr(layer, "activity_regularizer", None) is not None:
            return (
                f"{layer.name!r} adds an activity regularization loss in its forward, which a "
                "recomputed block would leave without a gradient"
            )
    if is_keras3(block):
        return None  # its state is read as the forward read it (tfpar.remat._recompute)
    for layer in layers:
        if _compat.random_generator_type(layer) is not None and _draws(layer):
            return (
                f"tf_keras' {layer.name!r} draws new random numbers when recomputed (Keras 3 "
                "reads the forward's seed again)"
            )
        if layer.trainable and layer.non_trainable_weights and not _sublayers(layer):
            return (
                f"tf_keras' {layer.name!r} updates its non-trainable weights in training, and a "
                "recomputation would update them twice (Keras 3 drops its updates)"
            )
    return None


def _draws(layer):
    """Whether a tf_keras random layer draws in training: a dropout at a rate above 0 (``rate``,
    or a recurrent cell's ``dropout`` and ``recurrent_dropout``); any other one (noise,
    augmentation)."""
    rates = [getattr(layer, name, None) for name in ("rate", "dropout", "recurrent_dropout")]
    rates = [rate for rate in rates if isinstance(rate, (int, float))]
    return not rates or any(rates)
