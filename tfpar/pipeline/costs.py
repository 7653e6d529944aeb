"""Measuring what each layer of a model costs, for a pipeline balanced by time
(`Pipeline(balance="time")`): each layer's forward and backward pass timed alone on a random
batch."""

import statistics
import time
from typing import Any

from tfpar import _compat
from tfpar._keras import keras_of, tf
from tfpar.pipeline.flat import flat_graph, graph_layers, nests_a_model, step_cost

__all__ = ["measure_layer_costs"]


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
    layers = graph_layers(model)
    probe = keras_of(model).Model(model.inputs, [layer.output for layer in layers])
    outputs = dict(zip((id(layer) for layer in layers), probe(sample, training=False)))
    for tensor, value in zip(model.inputs, sample):  # the input layers "output" the sample
        outputs[id(_compat.keras_layer_of(tensor))] = value
    calls = []
    for layer in layers:
        parents = [
            outputs[id(_compat.node_layer(node))]
            for node in _compat.layer_nodes_in(model, layer)[0].parent_nodes
        ]
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
        tf.nest.map_structure(
            lambda t: None if t is None else t.numpy(), result, expand_composites=True
        )
        times.append(time.perf_counter() - start)
    return statistics.median(times)
