"""`TensorParallelModel`: a Keras model whose planned layers are split over T devices.

It is built from the user's model by `tfpar.tensor_parallel.TensorParallel.shard` in one of two
ways. When every planned layer is a top-level layer of a functional model: a copy of the model
(Keras' ``clone_model``) in which each planned layer is replaced by its split layer (`layers.py`)
and every other layer is a copy on the home device, all with the model's weights; its ``call``
walks the copy's layer graph itself, so that a column layer's split output reaches the row layer
after it (through element-wise layers, run on each device) without being gathered (`pairs.py`
finds those pairs). When a planned
layer sits inside another layer or a nested model (a path with "/"), or a style names a kernel
axis: a copy built from the model's config whose planned layers are split where they sit
(`nested.py`, `calls.py`). Either way an MLP pair costs one reduction forward and one backward, as
in Megatron-LM. Training is Keras' own ``train_step``: the conjugate operators (`ops.py`) carry
the gradients.
"""

import functools
from typing import Any

from tfpar import _compat
from tfpar._keras import all_layers, inner_optimizer, is_keras3, keras, keras3, tf
from tfpar.optimizers import LAMB, LARS
from tfpar.tensor_parallel.accounting import bytes_by_device
from tfpar.tensor_parallel.calls import keeping_split
from tfpar.tensor_parallel.layers import layer_class
from tfpar.tensor_parallel.nested import paired, plain_weights_back, rebuilt, split_in_place
from tfpar.tensor_parallel.ops import Sharded, gather_from, recording
from tfpar.tensor_parallel.pairs import is_elementwise, split_outputs
from tfpar.tensor_parallel.rules import kind_of
from tfpar.tensor_parallel.shards import _Shards

__all__ = ["TensorParallelModel", "build_optimizer_beside_variables"]


def build_optimizer_beside_variables(model: Any) -> None:
    """Makes ``model``'s optimizer slots now, outside any function: each is created next to its
    variable then. (Keras 3 makes them in the first step's trace otherwise, all on one device.)"""
    optimizer = getattr(model, "optimizer", None)
    inner = inner_optimizer(optimizer)
    if isinstance(inner, (LARS, LAMB)) and any(
        isinstance(layer, _Shards) for layer in all_layers(model)
    ):
        raise ValueError(
            f"{type(inner).__name__} scales each layer's step by the norms of its whole weights "
            "and update (its trust ratio), and tensor parallelism holds a split layer as one "
            "variable per device, each of which would get its own ratio. "
            f"Received: optimizer={type(inner).__name__} for model {model.name!r}, whose planned "
            "layers are split. Use another optimizer with tensor parallelism (Adam, SGD...), or "
            "LARS/LAMB with data parallelism or an unsplit pipeline."
        )
    if (
        optimizer is not None
        and hasattr(optimizer, "build")
        and not getattr(optimizer, "built", False)
    ):
        optimizer.build(model.trainable_variables)


class TensorParallelModel:
    """A model whose planned layers are split over devices; build it with
    `tfpar.tensor_parallel.TensorParallel.shard`. It is a ``keras.Model`` of the Keras its source
    model was written in; ``compile``/``fit``/``evaluate``/``predict`` work as usual, and
    `plain_model` returns the original model with the trained weights."""

    _keras = None
    _source: Any  # the model it was split from (set untracked in __init__)
    _graph: Any  # its copy's layer graph (_compat.graph_steps), untracked
    _splits: dict | None  # {path: split layer} where split in place, untracked
    _twins: dict | None  # {path in the source: its copy's layer} where split in place, untracked
    _trace_labels: list  # (device index, label) per row of device_trace, untracked
    _gathers: list  # (layer name, shape) of each column output a traced call reads whole
    weights: list  # Keras' (the concrete class is a keras.Model)

    def __new__(cls, source=None, *args, **kwargs):
        if cls is TensorParallelModel:
            cls = _keras3_model() if is_keras3(source) else _TfKerasTensorParallelModel
        return super().__new__(cls)

    def __init__(self, source, styles, devices):
        super().__init__(name=f"{source.name}_tensor_parallel")
        # A layer inside another, or a kernel axis named: split where it sits (`nested.py`).
        nested = any("/" in path or ":" in style for path, style in styles.items())
        with tf.device(devices[0]):  # the replicated layers live on the home device
            if nested:
                inner = rebuilt(source, self._keras)
            else:
                inner = _clone_split(source, styles, devices, self._keras)
        twins = paired(source, inner) if nested else None
        splits = split_in_place(twins, styles, devices, self._keras) if nested else None
        self.inner = inner
        self.devices = list(devices)
        self.styles = dict(styles)
        self.__dict__["_source"] = source  # not tracked: its weights are copied, not shared
        self.__dict__["_splits"] = splits  # {path: split layer} where split in place, else None
        self.__dict__["_twins"] = twins  # {path in source: its copy's layer}
        self.__dict__["_graph"] = None if nested else _compat.graph_steps(inner)
        self.__dict__["_gathers"] = []  # (layer, shape) of each gather the traced call reads
        # (device index, label) of each row of device_trace, set when traced
        self.__dict__["_trace_labels"] = []
        with tf.device("/cpu:0"):
            # The last training step's work on each device, a row per layer part and all-reduce:
            # (start, end).
            self.device_trace = tf.Variable(
                tf.zeros([0, 2], tf.float64),
                trainable=False,
                name="device_trace",
                shape=tf.TensorShape([None, 2]),
            )

    @tf.autograph.experimental.do_not_convert  # a plain walk over the layer graph, built as it is
    def call(self, inputs: Any, training: bool | None = None) -> Any:
        if self._graph is None:  # split in place: the copy calls its split layers itself
            with keeping_split(self._gathers):
                return self.inner(inputs, training=training)
        input_keys, steps, output_keys = self._graph
        values = dict(zip(input_keys, tf.nest.flatten(inputs)))
        for layer, in_keys, out_keys, fill in steps:
            args, kwargs = fill(values)
            if isinstance(layer, _Shards):
                out = layer.tp_call(
                    *args, **dict(kwargs, training=kwargs.get("training", training))
                )
            elif any(isinstance(a, Sharded) for a in args):
                if len(args) == 1 and is_elementwise(layer, self._keras):
                    out = args[0].map(lambda t: layer(t, **kwargs))
                else:
                    out = layer(
                        *[gather_from(a) if isinstance(a, Sharded) else a for a in args], **kwargs
                    )
            else:
                out = layer(*args, **kwargs)
            for key, value in zip(
                out_keys, [out] if isinstance(out, Sharded) else tf.nest.flatten(out)
            ):
                values[key] = value
        outputs = [
            gather_from(values[key]) if isinstance(values[key], Sharded) else values[key]
            for key in output_keys
        ]
        return outputs[0] if len(outputs) == 1 else outputs

    @tf.autograph.experimental.do_not_convert
    def train_step(self, data: Any) -> Any:
        """Keras' ``train_step``, its devices' work recorded into ``device_trace``: each split
        layer's part, each all-reduce forward and backward."""
        events: list = []
        with recording(events):
            logs = super().train_step(data)  # type: ignore[misc]  # keras.Model's, after this mixin
        if events:
            self._trace_labels[:] = [(device, label) for device, label, _, _ in events]
            self.device_trace.assign(
                tf.stack([tf.stack([start, end]) for _, _, start, end in events])
            )
        return logs

    def device_track_names(self) -> list[str]:
        """The Timeline's tracks: one per device."""
        return [f"device {i} ({device})" for i, device in enumerate(self.devices)]

    def device_trace_labels(self) -> list:
        """Per row of ``device_trace``: (its track, its label: the layer, or the layer's
        all-reduce); known once the training step is traced."""
        return list(self._trace_labels)

    def compile(self, *args: Any, **kwargs: Any) -> None:
        """Keras' ``compile``; then the optimizer's slots are made next to their variables, each
        device's on that device."""
        super().compile(*args, **kwargs)  # type: ignore[misc]  # keras.Model's, after this mixin
        build_optimizer_beside_variables(self)

    def plain_model(self) -> Any:
        """The original model with this model's current weights; save or use it as usual."""
        if self._twins is not None and self._splits is not None:
            plain_weights_back(self._source, self._twins, self._splits)
            return self._source
        for layer in self._source.layers:
            if layer.weights:
                copy = self.inner.get_layer(layer.name)
                layer.set_weights(
                    copy.full_weights() if isinstance(copy, _Shards) else copy.get_weights()
                )
        return self._source

    def gathers(self) -> list[tuple[str, tuple]]:
        """``(layer name, shape)`` of each split column layer's output that the traced step reads
        whole (a custom layer's code between projections, not a row layer): each costs an
        all-gather. Known once the model is traced (after ``fit`` starts, or a ``predict``)."""
        return list(self._gathers)

    def device_bytes(self) -> dict[str, dict[str, int]]:
        """Bytes each device holds: ``{device: {"weights": ..., "optimizer": ...}}``, from where
        each variable lives."""
        # not its step trace
        return bytes_by_device(self.inner.weights, getattr(self, "optimizer", None))

    def get_config(self) -> dict:
        raise NotImplementedError(
            "Save plain_model() instead: a TensorParallelModel is rebuilt with "
            "TensorParallel.shard(model)."
        )


def _clone_split(source, styles, devices, k):
    """A clone of the functional ``source`` whose planned top-level layers are split layers."""
    kept = split_outputs(source, styles, k)

    def clone(layer):
        if layer.name in styles:
            style = styles[layer.name]
            cls = layer_class(k, kind_of(layer, style, k))
            return cls(layer, style, devices, keep_split=layer.name in kept)
        return layer.__class__.from_config(layer.get_config())

    inner = k.models.clone_model(source, clone_function=clone)
    for layer in source.layers:
        if layer.weights:
            copy = inner.get_layer(layer.name)
            (copy.load if isinstance(copy, _Shards) else copy.set_weights)(layer.get_weights())
    return inner


class _TfKerasTensorParallelModel(TensorParallelModel, keras.Model):
    """A `TensorParallelModel` of a tf_keras model."""

    _keras = keras


@functools.cache
def _keras3_model():
    """The `TensorParallelModel` class of Keras 3 models (made when first needed)."""
    k3 = keras3()

    class _Keras3TensorParallelModel(TensorParallelModel, k3.Model):
        """A `TensorParallelModel` of a Keras 3 model."""

        _keras = k3

    return _Keras3TensorParallelModel
