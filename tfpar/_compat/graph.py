"""The private parts of both Kerases' functional-graph API tfpar reads (part of `tfpar._compat`, the
one place that touches private TensorFlow/Keras APIs; it re-exports these)."""


def _keras3_graph(model):
    """A Keras 3 model's layer graph: a Functional model itself, a Sequential's inner Functional
    (built once it knows its input), else None (subclassed)."""
    from keras.src.models.functional import Functional

    graph = getattr(model, "_functional", None) or model
    return graph if isinstance(graph, Functional) else None


def is_graph_network(model):
    """Whether a model (either Keras) is Sequential/Functional (its layer graph is known), not
    subclassed: tf_keras flags it (_is_graph_network); Keras 3 builds a Functional."""
    if hasattr(model, "_is_graph_network"):  # tf_keras
        return bool(model._is_graph_network)
    return _keras3_graph(model) is not None


def layer_nodes_in(model, layer):
    """The calls (nodes) of ``layer`` that belong to ``model``'s graph: tf_keras keys them
    "<layer name>_ib-<index>" in the model's _network_nodes, Keras 3 "<id(layer)>_ib-<index>" in
    its graph's _nodes (no public query in either)."""
    if hasattr(model, "_network_nodes"):
        return [
            node
            for index, node in enumerate(layer.inbound_nodes)
            if f"{layer.name}_ib-{index}" in model._network_nodes
        ]
    nodes = _keras3_graph(model)._nodes
    return [
        node
        for index, node in enumerate(layer._inbound_nodes)
        if f"{id(layer)}_ib-{index}" in nodes
    ]


class _EachUse(dict):
    """tf_keras' Node.map_arguments pops one value per use of a tensor: a fresh list each time."""

    def __getitem__(self, key):
        return [dict.__getitem__(self, key)]


def graph_steps(model):
    """A Sequential/Functional model's graph as ``(input keys, steps, output keys)``, the steps in
    an order that computes every input first: ``(layer, input keys, output keys, fill)`` where
    ``fill(values)`` gives the layer's ``(args, kwargs)`` from the computed values by key. tf_keras
    keeps its nodes in _nodes_by_depth with _tensor ids as strings; Keras 3 in its graph's
    _nodes_by_depth with ids (no public walk in either)."""
    graph = model if hasattr(model, "_network_nodes") else _keras3_graph(model)
    nodes = [
        node
        for depth in sorted(graph._nodes_by_depth, reverse=True)
        for node in graph._nodes_by_depth[depth]
        if not node.is_input
    ]
    if hasattr(model, "_network_nodes"):  # tf_keras
        steps = [
            (
                node.layer,
                list(node.flat_input_ids),
                list(node.flat_output_ids),
                lambda values, node=node: node.map_arguments(_EachUse(values)),
            )
            for node in nodes
        ]
        return [str(id(t)) for t in graph.inputs], steps, [str(id(t)) for t in graph.outputs]
    steps = [
        (
            node.operation,
            [id(t) for t in node.input_tensors],
            [id(t) for t in node.outputs],
            lambda values, node=node: node.arguments.fill_in(values),
        )
        for node in nodes
        if node.operation
    ]
    return [id(t) for t in graph.inputs], steps, [id(t) for t in graph.outputs]


def output_structure(model):
    """A Functional model's outputs as it returns them (a tensor, a list, a dict): Keras 3 keeps
    them in _outputs_struct, tf_keras in _nested_outputs."""
    graph = model if hasattr(model, "_nested_outputs") else _keras3_graph(model)
    return graph._nested_outputs if hasattr(graph, "_nested_outputs") else graph._outputs_struct


def node_layer(node):
    """The layer a node calls (``.layer`` in tf_keras, ``.operation`` in Keras 3)."""
    return node.layer if hasattr(node, "layer") else node.operation


def keras_layer_of(tensor):
    """The layer that produced a symbolic tensor (its _keras_history: ``.layer`` in tf_keras,
    ``.operation`` in Keras 3; no public accessor in either)."""
    history = tensor._keras_history
    return history.layer if hasattr(history, "layer") else history.operation
