"""Keras' own vocabulary for a plan: a ``keras.distribution.LayoutMap`` read as styles.

A ``LayoutMap`` maps variable paths (regular expressions, as Keras matches them) to
``TensorLayout``s: for each axis of the variable, the mesh axis it is sharded over, or None.
KerasHub's ``Backbone.get_layout_map(mesh)`` writes one per model. tfpar realises the mesh's
model axis and reads each layout naming it as the style of the variable's layer:

| variable | model axis on | style |
|---|---|---|
| a Dense kernel ``[in, out]`` | ``out`` / ``in`` | ``"column"`` / ``"row"`` |
| an EinsumDense kernel | an output-only / a contracted axis | ``"column:<k>"`` / ``"row:<k>"`` |
| an Embedding's table ``[vocab, dim]`` (a ReversibleEmbedding's too) | ``vocab`` | ``"vocab"`` |

The other mesh axis (the batch's) is data parallelism: each worker under ``tfpar launch`` is one
replica. A layout tfpar cannot realise (a bias or a norm's scale over the model axis, an embedding
split by its width, two axes over the model axis) is refused, naming the variable, its layout and
why.
"""

import re
from typing import Any

from tfpar.tensor_parallel.nested import layer_tree, own_variables
from tfpar.tensor_parallel.plan import STYLES
from tfpar.tensor_parallel.rules import einsum_parts

__all__ = ["is_layout_map", "model_axis_of", "styles_from_layouts"]


def is_layout_map(plan: Any) -> bool:
    """Whether ``plan`` is a ``keras.distribution.LayoutMap`` (checked without importing Keras)."""
    return type(plan).__name__ == "LayoutMap" and type(plan).__module__.startswith("keras")


def model_axis_of(mesh: Any, batch_axis: str | None = "batch") -> tuple[str, int]:
    """``(name, size)`` of ``mesh``'s model axis: its only axis, or the one that is not
    ``batch_axis``.

    Raises:
        ValueError: a mesh of the batch axis alone, of more than two axes, or of two without
            ``batch_axis``.
    """
    names = list(mesh.axis_names)
    shape = list(mesh.shape)
    if names == [batch_axis]:
        raise ValueError(
            f"The mesh has only the batch axis {batch_axis!r}: no model axis to split layers over. "
            f"Received: a DeviceMesh with axes {names} (shape {shape}). Use tfpar.DataParallel, "
            "or DeviceMesh(shape=(workers, degree), axis_names=('batch', 'model'))."
        )
    if len(names) == 1:
        return names[0], shape[0]
    others = [n for n in names if n != batch_axis]
    if len(names) != 2 or len(others) != 1:
        raise ValueError(
            "A tensor-parallel mesh has a model axis and at most a batch axis. Received: a "
            f"DeviceMesh with axes {names} (shape {shape}) and batch axis {batch_axis!r}. Use "
            "DeviceMesh(shape=(workers, degree), axis_names=('batch', 'model'))."
        )
    return others[0], shape[names.index(others[0])]


def styles_from_layouts(model: Any, layout_map: Any, model_axis: str, keras_module: Any) -> dict:
    """``{layer path: style}`` for the layers whose variables ``layout_map`` shards over
    ``model_axis``.

    Raises:
        TypeError: a model whose variables have no paths (tf_keras).
        ValueError: a key that matches no variable of the model, or a layout tfpar cannot realise.
    """
    weights = model.weights
    if not weights or not hasattr(weights[0], "path"):
        raise TypeError(
            "A LayoutMap plan names Keras 3 variables by their paths. Received: model "
            f"{model.name!r}, whose variables have no paths (a tf_keras model, or none built). "
            "Build the model with Keras 3, or give plan= a dict of layer names to styles."
        )
    keys = list(layout_map.keys())
    used: set = set()
    styles: dict[str, str] = {}
    for path, layer in layer_tree(model).items():
        for variable in own_variables(layer):
            key = _matching_key(keys, variable.path)
            if key is None:
                continue
            used.add(key)
            axes = tuple(layout_map[key].axes)
            if model_axis not in axes:
                continue
            style = _style_of(layer, variable, axes, model_axis, keras_module)
            if styles.get(path, style) != style:
                raise ValueError(
                    f"The layout map splits two weights of layer {path!r} in different ways "
                    f"({styles[path]!r} and {style!r}, from {variable.path!r}: {axes}). Give the "
                    "layer's kernel alone a layout."
                )
            styles[path] = style
    unused = [key for key in keys if key not in used]
    if unused:
        raise ValueError(
            f"The layout map names variables the model does not have: {unused}. Received: a "
            f"LayoutMap for model {model.name!r}. Its variables are named like "
            f"{[v.path for v in weights[:3]]}. Fix the patterns, or make the layout map "
            "for this model."
        )
    return styles


def _matching_key(keys, path):
    """The key of ``keys`` that names ``path`` as Keras' ``LayoutMap`` does: the same string, else
    the one regular expression found in it (more than one is ambiguous)."""
    if path in keys:
        return path
    found = [key for key in keys if re.search(key, path)]
    if len(found) > 1:
        raise ValueError(
            f"Variable {path!r} is matched by several keys of the layout map: "
            f"{found}. Make the patterns tell it apart."
        )
    return found[0] if found else None


def _style_of(layer, variable, axes, model_axis, keras_module):
    where = f"variable {variable.path!r} (layout {axes})"
    if axes.count(model_axis) > 1:
        raise ValueError(f"{where} is split over the model axis twice. tfpar splits one axis.")
    axis = axes.index(model_axis)
    layers = keras_module.layers
    if isinstance(layer, layers.Embedding):
        vocabulary_axis = 1 if variable is getattr(layer, "reverse_embeddings", None) else 0
        if axis != vocabulary_axis:
            raise ValueError(
                f"{where} splits an embedding by its width; tfpar splits a table by vocabulary "
                f"(Megatron's). Put {model_axis!r} on the vocabulary axis ({vocabulary_axis})."
            )
        return "vocab"
    if isinstance(layer, (layers.Dense, layers.EinsumDense)) and variable is layer.kernel:
        return _dense_style(layer, axis, where)
    raise ValueError(
        f"{where} belongs to {type(layer).__name__} {layer.name!r}; tfpar splits the kernels of "
        f"Dense and EinsumDense layers and embedding tables ({STYLES}), and keeps biases and "
        f"scales whole. Leave {model_axis!r} out of this layout."
    )


def _dense_style(layer, axis, where):
    equation = layer.get_config().get("equation")
    if equation is None:
        return "column" if axis == 1 else "row"
    x, kernel, out = einsum_parts(equation)
    letter = kernel[axis]
    if letter in out and letter not in x:
        return "column" if axis == len(kernel) - 1 and letter == out[-1] else f"column:{axis}"
    if letter in x and letter not in out:
        return "row" if letter == x[-1] else f"row:{axis}"
    raise ValueError(
        f"{where} splits the kernel of EinsumDense {equation!r} on an axis that is "
        "in both its input and output; tfpar splits an output axis or a contracted "
        "one."
    )
