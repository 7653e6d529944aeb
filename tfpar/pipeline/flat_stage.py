"""A stage of a model that nests a model (`flat.py`): a copy of the whole model that runs its
chunk of the flattened graph.

Each stage runs its steps in a model of its own (`FlatStage`), built from a copy of the whole
model made from its config on the stage's device (`tfpar.tensor_parallel.nested.rebuilt`: a layer
is never rebuilt alone, so layers whose own config does not round-trip, as Llama's decoder, are
staged as they are); the copy's layers that the stage does not run let go of their weights. A
layer used by two stages (a tied embedding: the first stage looks tokens up, the last computes
the logits with it) has a copy on each; their gradients are summed and both apply the sum, so they
stay equal, as Megatron-LM keeps its first and last stages' embeddings. Under tensor parallelism
the stage's planned layers are split where they sit (`chunk_styles`, `StageCopy.splits`).
"""

import dataclasses
from typing import Any

from tfpar import _compat
from tfpar._keras import tf
from tfpar.pipeline.flat import FlatChunk, crossing, flat_graph
from tfpar.tensor_parallel.calls import keeping_split
from tfpar.tensor_parallel.nested import (
    drop_state,
    layer_tree,
    own_variables,
    paired,
    rebuilt,
    split_in_place,
)

__all__ = ["FlatStage", "StageCopy", "chunk_styles", "staged_copy"]


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
