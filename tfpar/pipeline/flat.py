"""Pipelines of models that nest a model: a task model around its backbone (KerasHub's
``GPT2CausalLM``, ``BertTextClassifier``, ``LlamaCausalLM``, ...).

Such a model's own graph has one step for the whole backbone, so `partition.py`'s cuts (where a
single tensor flows between top-level layers) find nothing worth cutting. Here the graph is
flattened: each nested Functional model's graph is inlined into its caller's (`flat_graph`), so
the steps are the blocks themselves, and a stage may start at any step. What crosses a cut is
every tensor made before it and read after it (`crossing`): the hidden state with the padding
mask, position ids, a second output.

Each stage runs its steps in a model of its own (`FlatStage`), built from a copy of the whole
model made from its config on the stage's device (`tfpar.tensor_parallel.nested.rebuilt`: a layer
is never rebuilt alone, so layers whose own config does not round-trip, as Llama's decoder, are
staged as they are); the copy's layers that the stage does not run let go of their weights. A
layer used by two stages (a tied embedding: the first stage looks tokens up, the last computes
the logits with it) has a copy on each; their gradients are summed and both apply the sum, so they
stay equal, as Megatron-LM keeps its first and last stages' embeddings.
"""

import dataclasses
from typing import Any

from tfpar import _compat
from tfpar._keras import check_keras_model, is_keras3, keras_of, tf
from tfpar.tensor_parallel.calls import keeping_split
from tfpar.tensor_parallel.nested import (
    drop_state,
    layer_tree,
    own_variables,
    paired,
    rebuilt,
    split_in_place,
)

__all__ = [
    "FlatChunk",
    "FlatStage",
    "StageCopy",
    "chunk_styles",
    "crossing",
    "flat_costs",
    "flat_graph",
    "graph_layers",
    "named_cuts",
    "nests_a_model",
    "stage_parameters",
    "staged_copy",
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


def chunk_styles(model: Any, chunk: "FlatChunk", styles: dict) -> dict:
    """The part of ``styles`` ({layer path: style}, over the whole ``model``) that the layers a
    flattened stage calls hold (a tied embedding's style goes to each stage that calls it)."""
    _, steps, _ = flat_graph(model)
    held = _held(
        [
            layer
            for layer, _, _, _ in steps[chunk.start : chunk.end]
            if hasattr(layer, "_flatten_layers")
        ]
    )
    tree = layer_tree(model)
    return {path: style for path, style in styles.items() if id(tree[path]) in held}


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


def staged_copy(
    source: Any,
    chunk: FlatChunk,
    keras_module: Any,
    styles: dict | None = None,
    devices: list | None = None,
) -> "StageCopy":
    """A `StageCopy` whose stage runs ``chunk`` of ``source`` on the current device (call it under
    ``tf.device``), its layers planned in ``styles`` ({path in source: style}) split over
    ``devices`` where they sit (`tfpar.tensor_parallel.nested.split_in_place`).

    Raises:
        ValueError: ``source`` cannot be built again from its config.
    """
    copy = rebuilt(source, keras_module)
    index = {id(variable): j for j, variable in enumerate(copy.weights)}
    twins = paired(source, copy)
    input_keys, steps, output_keys = flat_graph(copy)
    taken = steps[chunk.start : chunk.end]
    inputs = input_keys if chunk.first else crossing(steps, chunk.start, input_keys, output_keys)
    outputs = output_keys if chunk.last else crossing(steps, chunk.end, input_keys, output_keys)
    used: list = []
    for layer, _, _, _ in taken:
        if hasattr(layer, "trainable_variables") and all(layer is not u for u in used):
            used.append(layer)
    keys = {}
    splits = {}
    if styles:
        positions = {path: [index[id(v)] for v in twins[path].weights] for path in styles}
        splits = split_in_place(twins, styles, list(devices or ()), keras_module)
        for path, split in splits.items():
            for position, part, variable in split.variable_parts():
                keys[id(variable)] = (positions[path][position], part)
    _release_others(copy, used)
    structure = _compat.output_structure(copy) if chunk.last else None
    stage = _stage_class(keras_module)(
        taken,
        inputs,
        outputs,
        used,
        structure,
        name=f"{source.name}_stage_{chunk.start}_{chunk.end}",
    )
    for variable in stage.weights:
        keys.setdefault(id(variable), (index.get(id(variable)), None))
    return StageCopy(stage, keys, twins, splits)


@dataclasses.dataclass
class StageCopy:
    """A flattened stage and what ties it to the source model: ``keys`` maps each of its
    variables (by id) to (the index of the source weight it holds, the part it holds or None for
    the whole); ``twins`` and ``splits`` as `tfpar.tensor_parallel.nested` makes them."""

    stage: Any
    keys: dict
    twins: dict
    splits: dict


def _release_others(copy, used):
    """Lets the copy's layers that no step of the stage calls, nor holds at any depth (a head that
    holds the backbone's embedding), free their weights."""
    kept = _held(used)
    for layer in layer_tree(copy).values():
        if id(layer) not in kept and own_variables(layer):
            drop_state(layer)


def _held(layers):
    """The ids of ``layers`` and of every layer they hold, at any depth."""
    return {id(sub) for layer in layers for sub in layer._flatten_layers(include_self=True)}


class FlatStage:
    """A stage of a flattened model: runs its steps on the tensors that cross into it and returns
    those that cross out (a tuple), or, in the last stage, the model's outputs."""

    _steps: list  # (layer, input keys, output keys, fill) as `flat_graph` gives them, untracked
    _input_keys: list
    _output_keys: list
    _structure: Any  # the model's outputs' structure (the last stage), else None

    def __init__(self, steps, input_keys, output_keys, used, structure, name):
        super().__init__(name=name)
        self.parts = list(used)  # tracked: the stage's variables are its layers'
        self.__dict__["_steps"] = list(steps)
        self.__dict__["_input_keys"] = list(input_keys)
        self.__dict__["_output_keys"] = list(output_keys)
        self.__dict__["_structure"] = structure

    def call(self, inputs: Any, training: bool | None = None) -> Any:
        values = dict(zip(self._input_keys, tf.nest.flatten(inputs)))
        with keeping_split():  # a split column layer's output reaches its row layer in parts
            for layer, _, outputs, fill in self._steps:
                args, kwargs = fill(values)
                result = layer(*args, **kwargs)
                values.update(zip(outputs, tf.nest.flatten(result)))
        out = [values[key] for key in self._output_keys]
        if self._structure is None:
            return tuple(out)
        return tf.nest.pack_sequence_as(self._structure, out)


_CLASSES: dict = {}


def _stage_class(keras_module):
    """`FlatStage` as a model of ``keras_module`` (tf_keras or Keras 3)."""
    if keras_module not in _CLASSES:
        _CLASSES[keras_module] = type("FlatStage", (FlatStage, keras_module.Model), {})
    return _CLASSES[keras_module]
