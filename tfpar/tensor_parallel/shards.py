"""A split layer's weights (`_Shards`, the base of every split layer of `layers.py`): 1/T of each
planned weight of the source layer on each of T devices, or a weight kept whole on the home
device; made empty, loaded from the source layer's weights, and given back whole in its order.
"""

import numpy as np

from tfpar._keras import tf
from tfpar.tensor_parallel.ops import Sharded, gather_from

__all__: list[str] = []  # _Shards: the base of layers.py's split layers, for this room only


class _Shards:
    """What every split layer does with its weights: ``self._slots`` lists, in the source layer's
    weight order, (variables, axis): one variable per device split along ``axis``, or one on the
    home device (axis None)."""

    def _init_shards(self, source, devices):
        self.devices = list(devices)
        self.degree = len(devices)
        self._slots = []
        self._source_shapes = [tuple(w.shape) for w in source.weights]

    def _add(self, name, index, axis, regularizer=None):
        shape = self._source_shapes[index]
        if axis is None:
            with tf.device(self.devices[0]):
                self._slots.append(
                    (
                        [
                            self.add_weight(
                                name=name, shape=shape, initializer="zeros", regularizer=regularizer
                            )
                        ],
                        None,
                    )
                )
            return
        part = list(shape)
        part[axis] //= self.degree
        variables = []
        for i, device in enumerate(self.devices):
            with tf.device(device):
                variables.append(
                    self.add_weight(
                        name=f"{name}_{i}",
                        shape=tuple(part),
                        initializer="zeros",
                        regularizer=regularizer,
                    )
                )
        self._slots.append((variables, axis))

    def load(self, weights):
        """Takes the source layer's weights (``get_weights()`` order) and keeps this device's part
        of each."""
        for (variables, axis), full in zip(self._slots, weights):
            parts = [full] if axis is None else np.split(full, self.degree, axis=axis)
            for variable, part in zip(variables, parts):
                variable.assign(part)

    def variable_parts(self):
        """``(position of the source layer's weight, part or None, variable)`` of each variable it
        holds: a part of a weight split over the devices, or a weight whole (None)."""
        for position, (variables, axis) in enumerate(self._slots):
            for part, variable in enumerate(variables):
                yield position, None if axis is None else part, variable

    def full_weights(self):
        """The weights whole, in the source layer's order (for its ``set_weights``)."""
        out = []
        for variables, axis in self._slots:
            values = [np.asarray(v.numpy() if hasattr(v, "numpy") else v) for v in variables]
            out.append(values[0] if axis is None else np.concatenate(values, axis=axis))
        return out

    def _parts(self, slot):
        variables, _ = self._slots[slot]
        return [tf.cast(v, self.compute_dtype) for v in variables]

    def tp_call(self, *args, **kwargs):
        """The layer on its inputs, whole or `Sharded`; its output whole, or `Sharded` for a column
        layer that hands it to row layers."""
        raise NotImplementedError

    def call(self, *args, **kwargs):
        out = self.tp_call(*args, **kwargs)
        return gather_from(out) if isinstance(out, Sharded) else out
