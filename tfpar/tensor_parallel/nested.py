"""Tensor parallelism inside layers: split the layers a model's own layers hold, wherever they sit.

A layer is named by its path in the model's layer tree, the names from the outer model down:
``"gpt2_backbone/transformer_layer_0/self_attention"`` (a top-level layer's path is its name). This
reaches layers inside subclassed layers (KerasHub's decoder and encoder blocks) and inside nested
models (a task model around its backbone), which a walk over the model's functional graph cannot.

The split model is a copy of the user's (built from its config, then given its weights). In the
copy each planned layer keeps its place, so whatever calls it (a functional graph, a subclassed
layer's ``call``, a second use such as a tied embedding's ``reverse=True``) still does: the layer
drops its own weights, holds the split layer (`layers.py`) instead, and its ``call`` goes there.
Between layers the activations are whole tensors, as the callers expect; what a split layer's call
does, and how an MLP pair still costs one reduction forward and one backward, is `calls.py`.
"""

from collections.abc import MutableMapping
from typing import Any

from tfpar._keras import tf
from tfpar.tensor_parallel.calls import split_call
from tfpar.tensor_parallel.layers import layer_class
from tfpar.tensor_parallel.rules import kind_of, split_error

__all__ = [
    "drop_state",
    "layer_tree",
    "nested_auto_plan",
    "own_variables",
    "paired",
    "plain_weights_back",
    "rebuilt",
    "split_in_place",
]


def layer_tree(model: Any) -> dict[str, Any]:
    """``{path: layer}`` of every layer ``model`` holds, at any depth, each layer once (at its first
    path), input layers left out."""
    tree: dict[str, Any] = {}
    seen = {id(model)}

    def walk(layer, prefix):
        for sub in layer._flatten_layers(include_self=False, recursive=False):
            if id(sub) in seen or type(sub).__name__ == "InputLayer":
                continue
            seen.add(id(sub))
            path = f"{prefix}{sub.name}"
            tree[path] = sub
            walk(sub, f"{path}/")

    walk(model, "")
    return tree


def nested_auto_plan(model: Any, degree: int, keras_module: Any) -> dict[str, str]:
    """Megatron's plan over ``model``'s whole layer tree: each MultiHeadAttention (and subclass) by
    heads, each Embedding (a tied ``ReversibleEmbedding`` too) by vocabulary, and each Dense or
    EinsumDense whose input the layer calling it computes from other such layers' outputs as a row
    layer after those column layers: an MLP's pair, a gated MLP's gate and up projections and its
    down projection, a custom attention's query, key and value and its output projection. The links
    are read from a trace of the model's forward pass (`_dense_links`)."""
    tree = layer_tree(model)
    plan: dict[str, str] = {}
    inside: list[str] = []  # the planned layers' own sublayers are theirs

    def fits(layer, style):
        kind = kind_of(layer, style, keras_module)
        return kind is not None and split_error(layer, style, degree, kind) is None

    for path, layer in tree.items():
        if _within(path, inside):
            continue
        for style in ("heads", "vocab"):
            if fits(layer, style):
                plan[path] = style
                inside.append(path)
                break
    dense = {}
    for path, layer in tree.items():
        if kind_of(layer, "column", keras_module) and not _within(path, inside):
            dense[path] = layer
    if not any("/" in path for path in [*plan, *dense]):
        return {}  # nothing inside another layer: the functional graph's plan (`pairs.auto_plan`)
    for row, columns in _dense_links(model, dense):
        if row in plan or any(plan.get(c) == "row" for c in columns):
            continue
        if fits(dense[row], "row") and all(fits(dense[c], "column") for c in columns):
            plan.update({c: "column" for c in columns})
            plan[row] = "row"
    return plan


def _within(path, outers):
    """Whether the layer at ``path`` is inside one of the layers at ``outers``."""
    return any(path.startswith(f"{outer}/") for outer in outers)


def _dense_links(model, dense):
    """``[(row path, [column paths])]`` in call order: each Dense layer of ``dense`` whose input is
    computed, inside the layer that calls it (its name scope), from other ``dense`` layers' outputs:
    an MLP's pair, a gated MLP's three, an attention's query, key and value and its output."""
    calls: list = []
    own = {path: vars(layer)["call"] for path, layer in dense.items() if "call" in vars(layer)}
    for path, layer in dense.items():
        original = layer.call

        def recorded(*args, _path=path, _call=original, **kwargs):
            out = _call(*args, **kwargs)
            caller = tf.get_current_name_scope().rsplit("/", 1)[0]  # this layer's own scope dropped
            x = args[0] if args else kwargs.get("inputs")
            if x is not None:
                calls.append((_path, x, out, f"{caller}/"))
            return out

        layer.call = recorded
    try:
        specs = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), model.input)
        tf.function(lambda inputs: model(inputs, training=False)).get_concrete_function(specs)
    finally:
        for path, layer in dense.items():  # as they were: a call of the instance's own is kept
            if path in own:
                layer.call = own[path]
            else:
                del layer.call
    made_by = {id(out): path for path, _, out, _ in calls}
    links = {}
    for path, x, _, scope in calls:
        columns = _sources(x, scope, made_by)
        if columns and path not in columns and path not in links:
            links[path] = columns
    return list(links.items())


def _sources(tensor, scope, made_by):
    """The paths of the layers (``made_by``: output id -> path) whose outputs ``tensor`` is computed
    from by ops inside ``scope``, in the order met."""
    found: list = []
    seen = set()
    pending = [tensor]
    while pending:
        t = pending.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        if id(t) in made_by:
            if made_by[id(t)] not in found:
                found.append(made_by[id(t)])
        elif t.op.name.startswith(scope):
            pending.extend(t.op.inputs)
    return found


def rebuilt(source: Any, keras_module: Any) -> Any:
    """``source`` built again from its config, with its weights (its layers' calls as written).
    Its own custom classes are given to Keras by name, so that a layer the user defined and did not
    register (as Keras' tutorials write them) is found.

    Raises:
        ValueError: the model cannot be built from its config.
    """
    layers = [source, *layer_tree(source).values()]
    classes = {type(layer).__name__: type(layer) for layer in layers}
    try:
        with keras_module.utils.custom_object_scope(classes):
            copy = type(source).from_config(source.get_config())
    except (TypeError, ValueError, NotImplementedError) as error:
        raise ValueError(
            f"tfpar splits {source.name!r} (inside its layers, or into the stages of a model "
            f"that nests a model) in a copy built from its get_config(), and building it failed: "
            f"{error} Give each custom "
            "layer a get_config() that returns the arguments of its __init__."
        ) from error
    copy.set_weights(source.get_weights())
    if hasattr(copy, "_compiled_trainable_state"):  # a KerasHub task compiles itself when built
        del copy._compiled_trainable_state  # {layer: trainable}: it would keep the split layers
    return copy


def paired(source: Any, copy: Any) -> dict[str, Any]:
    """``{path in source: the same layer of copy}``, ``copy`` being ``source`` built again from its
    config: the trees are walked in the same order (the names Keras gives differ by a number)."""
    ours = list(layer_tree(source).items())
    theirs = list(layer_tree(copy).values())
    if len(ours) != len(theirs) or any(type(a) is not type(b) for (_, a), b in zip(ours, theirs)):
        raise ValueError(
            f"model {source.name!r} built again from its get_config() holds other layers than the "
            "model itself, so its layers cannot be split where they sit. Make the model's "
            "get_config() (and its custom layers') return every argument of __init__."
        )
    return {path: twin for (path, _), twin in zip(ours, theirs)}


def split_in_place(twins: dict, styles: dict[str, str], devices: list, keras_module: Any) -> dict:
    """Splits the copy's planned layers (``twins``: `paired`, taken before) where they sit: each
    drops its weights (and sublayers) and calls the split layer it now holds. Returns
    ``{path: split layer}``; the dropped sublayers leave ``twins``, so that nothing holds them."""
    splits = {}
    for path, style in styles.items():
        layer = twins[path]
        kind = kind_of(layer, style, keras_module)
        split = layer_class(keras_module, kind)(layer, style, devices, keep_split=True)
        split.load(layer.get_weights())
        drop_state(layer)
        if hasattr(layer, "_tracker"):  # Keras 3 locks a built layer's state
            layer._tracker.unlock()
        layer.tp_split = split  # tracked: the layer's weights are now the split layer's
        layer.call = split_call(layer, split, kind)
        splits[path] = split
    for path in [p for p in twins if _within(p, splits)]:
        del twins[path]
    return splits


_TRACKING = (
    "_trainable_variables",
    "_non_trainable_variables",
    "_layers",  # Keras 3's
    "_trainable_weights",
    "_non_trainable_weights",
    "_self_tracked_trackables",  # tf_keras'
    "_self_unconditional_checkpoint_dependencies",
    "_self_unconditional_dependency_names",
    "_obj_reference_counts_dict",
)
"""Where a layer keeps its variables and sublayers besides its attributes."""


def drop_state(layer: Any) -> None:
    """Lets go of ``layer``'s own variables and sublayers, so that their memory is freed: its
    tracking lists (Keras 3's; tf_keras' and its checkpoint dependencies) and the attributes that
    hold them (a Dense's kernel, an attention's projections)."""
    for name in _TRACKING:
        held = getattr(layer, name, None)
        if isinstance(held, (list, MutableMapping)):
            held.clear()
    for name, value in list(vars(layer).items()):
        if _holds_state(value):
            object.__setattr__(layer, name, None)


def _holds_state(value):
    """Whether ``value`` is a variable or a layer (Keras 3's or tf_keras')."""
    if isinstance(value, tf.Variable):
        return True
    kinds = {cls.__name__ for cls in type(value).__mro__}
    return bool(kinds & {"Variable", "KerasVariable", "Layer"})


def plain_weights_back(source: Any, twins: dict[str, Any], splits: dict[str, Any]) -> None:
    """Copies the copy's weights into ``source``, layer by layer (``twins``: `paired`): a split
    layer's whole (`full_weights`), every other layer's own."""
    for path, layer in layer_tree(source).items():
        if _within(path, splits):
            continue
        if path in splits:
            layer.set_weights(splits[path].full_weights())
            continue
        own = own_variables(layer)
        for variable, value in zip(own, own_variables(twins[path])):
            variable.assign(value)


def own_variables(layer: Any) -> list:
    """``layer``'s own variables, its sublayers' left out (Keras 3's lists, else tf_keras')."""
    held = getattr(layer, "_trainable_variables", None)
    if held is None:  # tf_keras
        return list(layer._trainable_weights) + list(layer._non_trainable_weights)
    return list(held) + list(layer._non_trainable_variables)
