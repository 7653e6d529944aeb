"""Cutting a Sequential or Functional model (tf_keras or Keras 3) into pipeline stages.

`balanced_cuts` is the pure part: contiguous stages of a layer sequence that
minimise the largest stage cost. `partition_model` works on a Keras model:
it finds where a single tensor flows from one layer to the rest (a valid cut
point), takes the cuts given by layer name or chooses them ("auto"), and
builds each stage as a functional sub-model that shares the original layers.

Examples:
    >>> balanced_cuts([4, 1, 1, 1, 1], 2)  # stage 0 = layer 0, stage 1 = the rest
    [1]
"""

import dataclasses
from collections.abc import Sequence
from typing import Any

from tfpar import _compat
from tfpar._checks import check_choice
from tfpar._keras import keras_of, tf
from tfpar.pipeline.costs import measure_layer_costs
from tfpar.pipeline.flat import (
    FlatChunk,
    flat_costs,
    graph_layers,
    named_cuts,
    nests_a_model,
    stage_parameters,
)

__all__ = [
    "Partition",
    "StageInfo",
    "balanced_cuts",
    "check_cut_points",
    "cut_positions",
    "measure_layer_costs",
    "partition_model",
    "valid_cut_points",
]


def balanced_cuts(
    costs: Sequence[float], num_stages: int, allowed: Sequence[int] | None = None
) -> list[int]:
    """Cut positions (stage k starts at layer ``cuts[k-1]``) minimising the largest stage cost.

    Args:
        costs: cost of each layer, in order.
        num_stages: number of contiguous, non-empty stages.
        allowed: positions where a stage may start (default: all of 1..n-1).

    Returns:
        ``num_stages - 1`` increasing positions.

    Raises:
        ValueError: fewer allowed cut positions than ``num_stages - 1``.
    """
    n = len(costs)
    allowed = sorted(set(range(1, n)) if allowed is None else set(allowed))
    if len(allowed) < num_stages - 1:
        raise ValueError(
            f"Cannot make {num_stages} stages: only {len(allowed)} valid cut point(s). "
            f"Received: num_stages={num_stages}. Use at most {len(allowed) + 1} stages."
        )
    prefix = [0.0]
    for cost in costs:
        prefix.append(prefix[-1] + cost)
    bounds = [0] + allowed + [n]
    # best[k][j]: the smallest largest-stage cost of splitting layers [0, bounds[j]) into k stages.
    inf = float("inf")
    best = [[inf] * len(bounds) for _ in range(num_stages + 1)]
    choice: list[list[Any]] = [[None] * len(bounds) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for k in range(1, num_stages + 1):
        for j in range(1, len(bounds)):
            for i in range(j):
                if best[k - 1][i] == inf:
                    continue
                value = max(best[k - 1][i], prefix[bounds[j]] - prefix[bounds[i]])
                if value < best[k][j]:
                    best[k][j], choice[k][j] = value, i
    cuts, j = [], len(bounds) - 1
    for k in range(num_stages, 1, -1):
        j = choice[k][j]
        cuts.append(bounds[j])
    return sorted(cuts)


@dataclasses.dataclass(frozen=True)
class StageInfo:
    """One stage of a `Partition`."""

    index: int
    layers: tuple
    """Names of its layers, in order."""
    parameters: int
    cost: float
    """Estimated cost (parameters, or measured seconds with ``balance="time"``)."""


@dataclasses.dataclass(frozen=True)
class Partition:
    """How a model is cut into stages, and the stage sub-models."""

    stages: tuple
    """`StageInfo` per stage."""
    models: tuple
    """Per stage, a functional model (of the original's Keras) sharing the original layers (with
    one stage, the original model); for a model that nests a model, a `flat.FlatChunk` each."""
    balance: str

    def describe(self) -> str:
        """A table: the layers, parameters and estimated cost of each stage."""
        total = sum(s.cost for s in self.stages) or 1.0
        lines = [f"pipeline partition ({len(self.stages)} stages, balanced by {self.balance}):"]
        for stage in self.stages:
            layers = ", ".join(stage.layers)
            lines.append(
                f"  stage {stage.index}: {stage.parameters:>10,} parameters, "
                f"{100 * stage.cost / total:5.1f}% of the cost  [{layers}]"
            )
        return "\n".join(lines)


def valid_cut_points(model: Any) -> list[str]:
    """Names of the layers after which exactly one tensor (that layer's output) flows on."""
    layers = graph_layers(model)
    position = {id(layer): k for k, layer in enumerate(layers)}
    # last_use[k]: the last position that consumes the output of layer k (-1: model inputs).
    last_use: dict = {}
    for k, layer in enumerate(layers):
        node = _compat.layer_nodes_in(model, layer)[0]
        for inbound in node.parent_nodes:
            source = position.get(id(_compat.node_layer(inbound)), -1)
            last_use[source] = max(last_use.get(source, -1), k)
    valid = []
    for k, layer in enumerate(layers[:-1]):
        crossing = [j for j, last in last_use.items() if j != k and j <= k and last > k]
        if not crossing and len(tf.nest.flatten(layer.output)) == 1 and last_use.get(k, -1) > k:
            valid.append(layer.name)
    return valid


def cut_positions(model: Any) -> list:
    """Where "auto" may cut ``model``: the layers of `valid_cut_points`, or, for a model that nests
    a model, the positions of its flattened graph before each step with weights."""
    if nests_a_model(model):
        return flat_costs(model, "params", None)[2]
    return valid_cut_points(model)


def partition_model(
    model: Any,
    num_stages: int,
    cut_points: Any = "auto",
    balance: str = "params",
    layer_costs: dict | None = None,
) -> "Partition":
    """Cuts ``model`` into ``num_stages`` stages.

    Args:
        model: a built Sequential or Functional model (tf_keras or Keras 3).
        num_stages: how many stages.
        cut_points: "auto", or the names of the ``num_stages - 1`` layers after which
            a new stage begins.
        balance: "params" (parameter count) or "time" (``layer_costs``, or measured
            with `tfpar.pipeline.costs.measure_layer_costs` when None).
        layer_costs: with ``balance="time"``: layer name -> cost (e.g. seconds).

    Returns:
        A `Partition`.

    Raises:
        TypeError: ``cut_points`` is neither "auto" nor a list of names.
        ValueError: a subclassed model, too many stages, a cut that names no layer or
            where more than one tensor crosses.
    """
    check_cut_points(cut_points)
    if num_stages > 1 and nests_a_model(model):
        return _flat_partition(model, num_stages, cut_points, balance, layer_costs)
    layers = graph_layers(model)
    names = [layer.name for layer in layers]
    if num_stages > len(layers):
        raise ValueError(
            f"num_stages={num_stages} is more than the {len(layers)} layers of "
            f"{model.name!r}. Received: num_stages={num_stages}. Use at most {len(layers)}."
        )
    valid = valid_cut_points(model)
    if balance == "params":
        costs = [float(layer.count_params()) for layer in layers]
    elif balance == "time":
        layer_costs = layer_costs or measure_layer_costs(model)
        if set(names) - set(layer_costs):
            raise ValueError(
                "balance='time' needs layer_costs with a cost for every layer. Received: "
                f"missing {sorted(set(names) - set(layer_costs or {}))}."
            )
        costs = [float(layer_costs[name]) for name in names]
    else:
        check_choice("balance", balance, ("params", "time"))
    if cut_points == "auto":
        allowed = [names.index(name) + 1 for name in valid]
        if len(allowed) < num_stages - 1:
            raise ValueError(
                f"{model.name!r} has {len(allowed)} place(s) where a single tensor flows on "
                f"({valid}), too few for num_stages={num_stages}. "
                f"Received: num_stages={num_stages}. Use at most {len(allowed) + 1} stages."
            )
        cuts = balanced_cuts(costs, num_stages, allowed)
    else:
        cuts = _explicit_cuts(cut_points, names, valid, num_stages, model.name)
    bounds = [0, *cuts, len(layers)]
    stages, models = [], []
    for k in range(num_stages):
        chunk = layers[bounds[k] : bounds[k + 1]]
        models.append(_stage_model(model, layers, bounds, k))
        stages.append(
            StageInfo(
                k,
                tuple(layer.name for layer in chunk),
                sum(layer.count_params() for layer in chunk),
                sum(costs[bounds[k] : bounds[k + 1]]),
            )
        )
    return Partition(tuple(stages), tuple(models), balance)


def _flat_partition(model, num_stages, cut_points, balance, layer_costs):
    """A model that nests a model, cut between the steps of its flattened graph (`flat.py`)."""
    check_choice("balance", balance, ("params", "time"))
    if balance == "time" and layer_costs is None:
        layer_costs = measure_layer_costs(model)
    names, costs, allowed = flat_costs(model, balance, layer_costs)
    if cut_points == "auto":
        cuts = balanced_cuts(costs, num_stages, allowed)
    else:
        cuts = named_cuts(names, cut_points, num_stages, model.name)
    bounds = [0, *cuts, len(names)]
    parameters = stage_parameters(model, bounds)
    stages, chunks = [], []
    for k in range(num_stages):
        start, end = bounds[k], bounds[k + 1]
        taken = tuple(name for name, cost in zip(names[start:end], costs[start:end]) if cost)
        chunks.append(FlatChunk(start, end, k == 0, k == num_stages - 1))
        stages.append(StageInfo(k, taken, parameters[k], sum(costs[start:end])))
    return Partition(tuple(stages), tuple(chunks), balance)


def _stage_model(model, layers, bounds, k):
    """Stage ``k``'s functional model, sharing ``model``'s layers. One stage is the model itself:
    its last layer's first output need not be the model's (a task model ends in a layer its backbone
    also calls, as GPT-2's tied embedding)."""
    if len(bounds) == 2:
        return model
    inputs = model.inputs if k == 0 else layers[bounds[k] - 1].output
    outputs = layers[bounds[k + 1] - 1].output
    return keras_of(model).Model(inputs, outputs, name=f"{model.name}_stage{k}")


def check_cut_points(cut_points: Any) -> None:
    """Raises TypeError unless ``cut_points`` is "auto" or a list (or tuple) of layer names."""
    if cut_points == "auto":
        return
    names = isinstance(cut_points, (list, tuple)) and all(isinstance(c, str) for c in cut_points)
    if not names:
        raise TypeError(
            "cut_points must be 'auto' or a list of layer names. "
            f"Received: cut_points={cut_points!r}."
        )


def _explicit_cuts(cut_points, names, valid, num_stages, model_name):
    if len(cut_points) != num_stages - 1:
        raise ValueError(
            f"{num_stages} stages need {num_stages - 1} cut point(s). "
            f"Received: cut_points={list(cut_points)}."
        )
    cuts = []
    for name in cut_points:
        if name not in names:
            raise ValueError(
                f"Cut point {name!r} names no layer of {model_name!r}. Received: "
                f"cut_points={list(cut_points)}. Layers: {names}."
            )
        if name not in valid:
            raise ValueError(
                f"Cannot cut {model_name!r} after {name!r}: more than one tensor crosses there "
                "(a skip connection or a second input goes past it). "
                f"Received: cut_points={list(cut_points)}. "
                f"Cut where a single tensor flows on: {valid}."
            )
        cuts.append(names.index(name) + 1)
    if cuts != sorted(set(cuts)):
        raise ValueError(
            f"Cut points must be distinct and in layer order. Received: {list(cut_points)}."
        )
    return cuts
