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
import statistics
import time
from collections.abc import Sequence
from typing import Any

from tfpar import _compat
from tfpar._checks import check_choice
from tfpar._keras import check_keras_model, keras_of, tf
from tfpar.pipeline.flat import (FlatChunk, flat_costs, flat_graph, named_cuts, nests_a_model,
                                 stage_parameters, step_cost)

__all__ = ["Partition", "StageInfo", "balanced_cuts", "cut_positions", "measure_layer_costs",
           "partition_model", "valid_cut_points"]


def balanced_cuts(costs: Sequence[float], num_stages: int, allowed: Sequence[int] | None = None) -> list[int]:
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
        raise ValueError(f"Cannot make {num_stages} stages: only {len(allowed)} valid cut point(s). "
                         f"Received: num_stages={num_stages}. Use at most {len(allowed) + 1} stages.")
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
            lines.append(f"  stage {stage.index}: {stage.parameters:>10,} parameters, "
                         f"{100 * stage.cost / total:5.1f}% of the cost  [{layers}]")
        return "\n".join(lines)


def _graph_layers(model):
    """The model's non-input layers in topological order, checked to be cuttable."""
    check_keras_model(model)
    if not _compat.is_graph_network(model):
        raise ValueError(
            f"Cannot cut the subclassed model {model.name!r} ({type(model).__name__}) into stages: "
            "its call() is Python code, so tfpar cannot see where one layer's output feeds the next. "
            "Write it as a Sequential or Functional model (keras.Input ... keras.Model(inputs, "
            "outputs)); a subclassed layer inside such a model is fine.")
    layers = [layer for layer in model.layers if not isinstance(layer, keras_of(model).layers.InputLayer)]
    for layer in layers:
        if len(_nodes_in(model, layer)) != 1:
            raise ValueError(f"Layer {layer.name!r} is called more than once in {model.name!r}; "
                             "tfpar cannot place a shared layer on one stage. Use separate layers.")
    return layers


def _nodes_in(model, layer):
    """The nodes (calls) of ``layer`` that belong to ``model``'s graph."""
    return _compat.layer_nodes_in(model, layer)


def valid_cut_points(model: Any) -> list[str]:
    """Names of the layers after which exactly one tensor (that layer's output) flows on."""
    layers = _graph_layers(model)
    position = {id(layer): k for k, layer in enumerate(layers)}
    # last_use[k]: the last position that consumes the output of layer k (-1: model inputs).
    last_use: dict = {}
    for k, layer in enumerate(layers):
        node = _nodes_in(model, layer)[0]
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


def measure_layer_costs(model: Any, batch_size: int = 32, repeats: int = 10) -> dict[str, float]:
    """Seconds each layer takes for a forward and backward pass on a random batch (of sequences
    of 16 where the input's length is not fixed).

    The layers' inputs come from one pass of the whole model; each layer is then
    timed alone (median of ``repeats``), in a `tf.function`, on the default device,
    less the time of calling an empty `tf.function`. A model that nests a model: the layers of
    its flattened graph (`flat.py`), a layer called twice timed in both calls.

    Returns:
        Layer name -> seconds.
    """
    sample = _sample(model, batch_size)
    if nests_a_model(model):
        calls = _flat_calls(model, sample)
    else:
        calls = _layer_calls(model, sample)
    costs: dict = {}
    for layer, args, kwargs in calls:

        @tf.function
        def step(args, layer=layer, kwargs=kwargs):
            watched = [t for t in tf.nest.flatten(args) if t.dtype.is_floating]
            with tf.GradientTape() as tape:
                tape.watch(watched)
                out = layer(*args, **kwargs)
            return tape.gradient(out, watched + layer.trainable_variables)

        costs[layer.name] = costs.get(layer.name, 0.0) + _median_seconds(step, args, repeats)
    # Less what calling any tf.function costs, which small layers would otherwise all share.
    floor = _median_seconds(tf.function(lambda args: tf.identity(args)), sample[0], repeats)
    return {name: max(cost - floor, 1e-7) for name, cost in costs.items()}


def _sample(model, batch_size, length=16):
    """A random batch for ``model``'s inputs: normal floats, zero ids and masks."""
    sample = []
    for tensor in model.inputs:
        dtype = tf.as_dtype(tensor.dtype)  # a name in Keras 3
        shape = [batch_size] + [length if d is None else d for d in tensor.shape[1:]]
        random = dtype.is_floating
        sample.append(tf.random.normal(shape, dtype=dtype) if random else tf.zeros(shape, dtype))
    return sample


def _layer_calls(model, sample):
    """(layer, args, kwargs) of each top-level layer, its inputs from one pass of the model."""
    layers = _graph_layers(model)
    probe = keras_of(model).Model(model.inputs, [layer.output for layer in layers])
    outputs = dict(zip((id(layer) for layer in layers), probe(sample, training=False)))
    for tensor, value in zip(model.inputs, sample):  # the input layers "output" the sample
        outputs[id(_compat.keras_layer_of(tensor))] = value
    calls = []
    for layer in layers:
        parents = [outputs[id(_compat.node_layer(node))] for node in _nodes_in(model, layer)[0].parent_nodes]
        calls.append((layer, (parents[0] if len(parents) == 1 else parents,), {"training": True}))
    return calls


def _flat_calls(model, sample):
    """(layer, args, kwargs) of each step with weights of the flattened graph, from one pass."""
    input_keys, steps, _ = flat_graph(model)
    values = dict(zip(input_keys, sample))
    calls = []
    for layer, _, outputs, fill in steps:
        args, kwargs = fill(values)
        values.update(zip(outputs, tf.nest.flatten(layer(*args, **kwargs))))
        if step_cost(layer):
            calls.append((layer, tuple(args), kwargs))
    return calls


def _median_seconds(fn, args, repeats):
    fn(args)  # trace
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn(args)  # an embedding's gradient is IndexedSlices: its parts, each fetched
        tf.nest.map_structure(lambda t: None if t is None else t.numpy(), result, expand_composites=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def partition_model(model: Any, num_stages: int, cut_points: Any = "auto", balance: str = "params",
                    layer_costs: dict | None = None) -> "Partition":
    """Cuts ``model`` into ``num_stages`` stages.

    Args:
        model: a built Sequential or Functional model (tf_keras or Keras 3).
        num_stages: how many stages.
        cut_points: "auto", or the names of the ``num_stages - 1`` layers after which
            a new stage begins.
        balance: "params" (parameter count) or "time" (``layer_costs``, or measured
            with `measure_layer_costs` when None).
        layer_costs: with ``balance="time"``: layer name -> cost (e.g. seconds).

    Returns:
        A `Partition`.

    Raises:
        ValueError: a subclassed model, too many stages, a cut that names no layer or
            where more than one tensor crosses.
    """
    if num_stages > 1 and nests_a_model(model):
        return _flat_partition(model, num_stages, cut_points, balance, layer_costs)
    layers = _graph_layers(model)
    names = [layer.name for layer in layers]
    if num_stages > len(layers):
        raise ValueError(f"num_stages={num_stages} is more than the {len(layers)} layers of "
                         f"{model.name!r}. Received: num_stages={num_stages}. Use at most {len(layers)}.")
    valid = valid_cut_points(model)
    if balance == "params":
        costs = [float(layer.count_params()) for layer in layers]
    elif balance == "time":
        layer_costs = layer_costs or measure_layer_costs(model)
        if set(names) - set(layer_costs):
            raise ValueError("balance='time' needs layer_costs with a cost for every layer. Received: "
                             f"missing {sorted(set(names) - set(layer_costs or {}))}.")
        costs = [float(layer_costs[name]) for name in names]
    else:
        check_choice("balance", balance, ("params", "time"))
    if cut_points == "auto":
        allowed = [names.index(name) + 1 for name in valid]
        if len(allowed) < num_stages - 1:
            raise ValueError(
                f"{model.name!r} has {len(allowed)} place(s) where a single tensor flows on "
                f"({valid}), too few for num_stages={num_stages}. Received: num_stages={num_stages}. "
                f"Use at most {len(allowed) + 1} stages.")
        cuts = balanced_cuts(costs, num_stages, allowed)
    else:
        cuts = _explicit_cuts(cut_points, names, valid, num_stages, model.name)
    bounds = [0, *cuts, len(layers)]
    stages, models = [], []
    for k in range(num_stages):
        chunk = layers[bounds[k]:bounds[k + 1]]
        models.append(_stage_model(model, layers, bounds, k))
        stages.append(StageInfo(k, tuple(layer.name for layer in chunk),
                                sum(layer.count_params() for layer in chunk), sum(costs[bounds[k]:bounds[k + 1]])))
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


def _explicit_cuts(cut_points, names, valid, num_stages, model_name):
    if isinstance(cut_points, str) or not all(isinstance(c, str) for c in cut_points):
        raise TypeError(f"cut_points must be 'auto' or a list of layer names. Received: {cut_points!r}.")
    if len(cut_points) != num_stages - 1:
        raise ValueError(f"{num_stages} stages need {num_stages - 1} cut point(s). "
                         f"Received: cut_points={list(cut_points)}.")
    cuts = []
    for name in cut_points:
        if name not in names:
            raise ValueError(f"Cut point {name!r} names no layer of {model_name!r}. Received: "
                             f"cut_points={list(cut_points)}. Layers: {names}.")
        if name not in valid:
            raise ValueError(
                f"Cannot cut {model_name!r} after {name!r}: more than one tensor crosses there (a skip "
                f"connection or a second input goes past it). Received: cut_points={list(cut_points)}. "
                f"Cut where a single tensor flows on: {valid}.")
        cuts.append(names.index(name) + 1)
    if cuts != sorted(set(cuts)):
        raise ValueError(f"Cut points must be distinct and in layer order. Received: {list(cut_points)}.")
    return cuts
