"""Pipelines of models that nest a model: a task model around its backbone (KerasHub's
``GPT2CausalLM``, ``BertTextClassifier``, ``LlamaCausalLM``, ...).

Such a model's own graph has one step for the whole backbone, so `partition.py`'s cuts (where a
single tensor flows between top-level layers) find nothing worth cutting. Here the graph is
flattened: each nested Functional model's graph is inlined into its caller's (`flat_graph`), so
the steps are the blocks themselves, and a stage may start at any step. What crosses a cut is
every tensor made before it and read after it (`crossing`): the hidden state with the padding
mask, position ids, a second output.

Each stage runs its steps in a model of its own (`flat_stage.py`), built from a copy of the whole
model.
"""

import dataclasses
from typing import Any

from tfpar import _compat
from tfpar._keras import check_keras_model, is_keras3, keras_of, tf

__all__ = [
    "FlatChunk",
    "crossing",
    "flat_costs",
    "flat_graph",
    "graph_layers",
    "named_cuts",
    "nests_a_model",
    "stage_parameters",
    "step_cost",
]


def nests_a_model(model: Any) -> bool:
    """Whether ``model`` is a Sequential or Functional model whose graph calls another (a
    backbone)."""
    if not _compat.is_graph_network(model):
        return False
    _, steps, _ = _compat.graph_steps(model)
    return any(_is_model(layer) for layer, _, _, _ in steps)


def _is_model(layer):
    return hasattr(layer, "layers") and _compat.is_graph_network(layer)


class _Bind:
    """An inlined model's call: its argument's tensors, flattened as its inputs are."""

    name = "inputs"

    def __call__(self, inputs, *args, **kwargs):
        return tuple(tf.nest.flatten(inputs))


class _Alias:
    """An inlined model's outputs, handed on as its call's outputs."""

    name = "outputs"

    def __call__(self, *tensors):
        return tensors


def graph_layers(model: Any) -> list:
    """The model's non-input layers in topological order, checked to be cuttable."""
    check_keras_model(model)
    if not _compat.is_graph_network(model):
        raise ValueError(
            f"Cannot cut the subclassed model {model.name!r} ({type(model).__name__}) into stages: "
            "its call() is Python code, so tfpar cannot see where one layer's output feeds the "
            "next. Write it as a Sequential or Functional model (keras.Input ... "
            "keras.Model(inputs, outputs)); a subclassed layer inside such a model is fine."
        )
    layers = [
        layer for layer in model.layers if not isinstance(layer, keras_of(model).layers.InputLayer)
    ]
    for layer in layers:
        if len(_compat.layer_nodes_in(model, layer)) != 1:
            raise ValueError(
                f"Layer {layer.name!r} is called more than once in {model.name!r}; "
                "tfpar cannot place a shared layer on one stage. Use separate layers."
            )
    return layers


def flat_graph(model: Any) -> tuple[list, list, list]:
    """``model``'s graph (`tfpar._compat.graph_steps`) with every nested Sequential or Functional
    model's own graph inlined, recursively.

    Raises:
        ValueError: a nested model called more than once.
    """
    input_keys, steps, output_keys = _compat.graph_steps(model)
    flat = []
    called: set = set()
    for layer, inputs, outputs, fill in steps:
        if not _is_model(layer):
            flat.append((layer, inputs, outputs, fill))
            continue
        if id(layer) in called:
            raise ValueError(
                f"{model.name!r} calls the model {layer.name!r} more than once; a pipeline cuts "
                "a model called once. Received: a shared nested model. Call it once, or stage "
                f"{layer.name!r} alone."
            )
        called.add(id(layer))
        _check_training(model, layer, fill, inputs)
        inner_inputs, inner_steps, inner_outputs = flat_graph(layer)
        flat.append((_Bind(), inputs, inner_inputs, fill))
        flat.extend(inner_steps)
        flat.append((_Alias(), inner_outputs, outputs, _reader(inner_outputs)))
    return input_keys, flat, output_keys


def _check_training(model, nested, fill, inputs):
    """tf_keras keeps a nested model's recorded ``training=`` (Keras' fine-tuning recipe:
    BatchNormalization in inference mode); the flattened stages run in training mode: refused.
    (Keras 3 passes the outer call's ``training`` on, as the stages do.)"""
    _, kwargs = fill({key: None for key in inputs})
    if kwargs.get("training") is not None and not is_keras3(model):
        raise ValueError(
            f"{model.name!r} calls its nested model {nested.name!r} with "
            f"training={kwargs['training']!r}, which tf_keras keeps, and a pipeline's stages run "
            "its layers in training mode. Received: a nested call with training set. Call it "
            "without training= (freeze its layers with trainable=False), or build the model with "
            "Keras 3."
        )


def _reader(keys):
    return lambda values: ([values[key] for key in keys], {})


def crossing(steps: list, position: int, input_keys: list, output_keys: list) -> list:
    """The keys of the tensors made before step ``position`` (or given to the model) that a step
    from ``position`` on reads, or that the model returns: what a cut there hands on."""
    made = list(input_keys)
    for _, _, outputs, _ in steps[:position]:
        made.extend(outputs)
    read = set(output_keys)
    for _, inputs, _, _ in steps[position:]:
        read.update(inputs)
    seen: set = set()
    kept = []
    for key in made:
        if key in read and key not in seen:
            seen.add(key)
            kept.append(key)
    return kept


def step_cost(layer: Any) -> float:
    """A step's parameter count (0 for an inlined model's own steps and Keras operations)."""
    return float(layer.count_params()) if hasattr(layer, "count_params") and layer.built else 0.0


def flat_costs(model: Any, balance: str, layer_costs: dict | None) -> tuple[list, list, list]:
    """``(names, costs, allowed)`` of the flattened ``model``'s steps: each step's layer name and
    cost (its parameters, or ``layer_costs`` by layer name with ``balance="time"``, shared between
    a layer's calls), and where a stage may start: before a step with weights, so that each stage
    holds some.

    Raises:
        ValueError: ``balance="time"`` without a cost for each layer with weights.
    """
    _, steps, _ = flat_graph(model)
    names = [layer.name if hasattr(layer, "count_params") else "" for layer, _, _, _ in steps]
    weighted = [bool(step_cost(layer)) for layer, _, _, _ in steps]
    if balance == "time":
        missing = sorted({n for n, w in zip(names, weighted) if w} - set(layer_costs or {}))
        if missing:
            raise ValueError(
                f"balance='time' on {model.name!r}, which nests a model, needs layer_costs with "
                f"a cost for each layer its stages run. Received: missing {missing}. Give "
                "layer_costs for those layers, or use balance='params'."
            )
        given = layer_costs or {}
        # A layer called twice (a tied embedding) has its cost shared between its calls.
        costs = [
            float(given.get(n, 0.0)) / names.count(n) if w else 0.0 for n, w in zip(names, weighted)
        ]
    else:
        costs = [step_cost(layer) for layer, _, _, _ in steps]
    return names, costs, [i for i in range(1, len(steps)) if weighted[i]]


def named_cuts(names: list, cut_points: Any, num_stages: int, model_name: str) -> list:
    """Where stages start when ``cut_points`` names the layers after which they begin.

    Raises:
        ValueError: a name that is no step's layer, or more than one step's; not
            ``num_stages - 1`` names.
    """
    cuts = []
    for name in cut_points:
        if names.count(name) != 1:
            raise ValueError(
                f"cut point {name!r} names {'no' if name not in names else 'more than one'} call "
                f"of a layer in {model_name!r} (its nested models included). Received: "
                f"cut_points={list(cut_points)!r}. Name layers among {sorted(set(names) - {''})}."
            )
        cuts.append(names.index(name) + 1)
    if len(set(cuts)) != len(cuts) or max(cuts, default=0) >= len(names):
        raise ValueError(
            f"cut_points must name distinct layers before the last, each stage "
            f"non-empty. Received: cut_points={list(cut_points)!r}."
        )
    if len(cuts) != num_stages - 1:
        raise ValueError(
            f"num_stages={num_stages} needs {num_stages - 1} cut point(s). "
            f"Received: cut_points={list(cut_points)!r}."
        )
    return sorted(cuts)


def stage_parameters(model: Any, bounds: list) -> list:
    """Each flattened stage's parameters, a layer used by two stages counted in each."""
    _, steps, _ = flat_graph(model)
    counts = []
    for start, end in zip(bounds, bounds[1:]):
        layers = {id(layer): layer for layer, _, _, _ in steps[start:end]}
        counts.append(int(sum(step_cost(layer) for layer in layers.values())))
    return counts


@dataclasses.dataclass(frozen=True)
class FlatChunk:
    """A stage of a flattened model: its steps ``start`` to ``end`` (`flat_graph`'s order)."""

    start: int
    end: int
    first: bool
    last: bool
