"""The split layers: each holds 1/T of a Keras layer's planned weights on each of T devices.

One class per family, written once over both Kerases (`layer_class` makes the class of a Keras):
`_Dense` (Dense and EinsumDense, by columns or by rows), `_Attention` (MultiHeadAttention by heads)
and `_Embedding` (Embedding by vocabulary). Each takes the layer it replaces and copies its weights
(`load`); `full_weights` gives them back whole, in the original layer's order (both in
`shards.py`, what every split layer does with its weights). ``tp_call`` is the
layer inside a tensor-parallel model (`model.py`): its input and output may be `Sharded`. ``call``
is the same layer on whole tensors (an all-gather after a column layer), which Keras uses to build
the model and which a user calling the layer alone gets.
"""

import functools
import math
import re
from typing import Any

from tfpar._keras import tf
from tfpar.tensor_parallel.ops import (
    Sharded,
    computing_devices,
    copy_to,
    gather_from,
    reduce_from,
    timed,
)
from tfpar.tensor_parallel.plan import parse_style
from tfpar.tensor_parallel.rules import dense_split
from tfpar.tensor_parallel.shards import _Shards

__all__ = ["layer_class"]

_LARGE_NEGATIVE = -1e9  # what both Kerases' masked softmax adds where the mask is 0 (float32)


class _Dense(_Shards):
    """Dense or EinsumDense split by columns (``keep_split``: hand the split output to a row layer)
    or by rows (its input arrives split)."""

    def __init__(self, source, style, devices, keep_split=False, **kwargs):
        super().__init__(
            name=source.name, dtype=source.dtype_policy, trainable=source.trainable, **kwargs
        )
        config = source.get_config()
        self.style = parse_style(style)[0]
        self.keep_split = keep_split
        self.equation = config.get("equation")  # None: a Dense (its kernel is [inputs, units])
        self.activation = source.activation
        self._activation_name = config.get("activation")
        self._init_shards(source, devices)
        cut = dense_split(config, style)
        self.split_axis = cut.activation_axis  # the output's (by columns) or the input's (by rows)
        self._add("kernel", 0, cut.kernel_axis, getattr(source, "kernel_regularizer", None))
        self.has_bias = len(self._source_shapes) > 1
        if self.has_bias:
            self._add("bias", 1, cut.bias_axis, getattr(source, "bias_regularizer", None))

    def tp_call(self, x, training=None):
        kernels, devices = self._parts(0), computing_devices(self.devices)
        if self.style == "column":
            if isinstance(x, Sharded):
                x = gather_from(x)
            inputs = copy_to(tf.cast(x, self.compute_dtype), devices, f"{self.name} all-reduce")
            biases = self._parts(1) if self.has_bias else [None] * self.degree
            parts = []
            for i, device in enumerate(devices):
                with tf.device(device):
                    parts.append(
                        timed(
                            i,
                            self.name,
                            inputs[i],
                            functools.partial(self._column_part, inputs[i], kernels[i], biases[i]),
                        )
                    )
            out = Sharded(parts, devices, self.split_axis)
            return out if self.keep_split else self.activation(gather_from(out))
        if not isinstance(x, Sharded) or x.axis != self.split_axis:  # each device takes its block
            whole = gather_from(x) if isinstance(x, Sharded) else x
            blocks = tf.split(whole, self.degree, axis=self.split_axis)
            x = Sharded(blocks, devices, self.split_axis)
        parts = []
        for i, device in enumerate(devices):
            with tf.device(device):
                part = tf.cast(x.parts[i], self.compute_dtype)
                parts.append(
                    timed(i, self.name, part, functools.partial(self._product, part, kernels[i]))
                )
        y = reduce_from(parts, devices, f"{self.name} all-reduce")
        with tf.device(devices[0]):
            return self.activation(y + self._parts(1)[0] if self.has_bias else y)

    def _column_part(self, x, kernel, bias):
        y = self._product(x, kernel)
        y = y if bias is None else y + bias
        return self.activation(y) if self.keep_split else y

    def _product(self, x, kernel):
        """x times a part of the kernel: EinsumDense's equation, or Dense's product over the last
        axis (a tensordot, as Dense computes it: an einsum with an ellipsis is far slower on
        CPU)."""
        if self.equation is not None:
            return tf.einsum(self.equation, x, kernel)
        return (
            tf.tensordot(x, kernel, [[x.shape.rank - 1], [0]])
            if x.shape.rank > 2
            else tf.matmul(x, kernel)
        )


_ATTENTION_WEIGHT = re.compile(r"(query|key|value|attention_output)/(kernel|bias)")


class _Attention(_Shards):
    """MultiHeadAttention split by heads: Q, K, V by columns, the output projection by rows."""

    def __init__(self, source, style, devices, keep_split=False, **kwargs):
        super().__init__(
            name=source.name, dtype=source.dtype_policy, trainable=source.trainable, **kwargs
        )
        config = source.get_config()
        self.key_dim = config["key_dim"]
        self.dropout = config.get("dropout") or 0.0
        self._init_shards(source, devices)
        self._slot_of = {}
        for index, weight in enumerate(source.weights):
            part, kind = _ATTENTION_WEIGHT.search(
                getattr(weight, "path", None) or weight.name
            ).groups()
            output = part == "attention_output"
            # Q, K, V: [model, heads, dim] and [heads, dim]; the output: [heads, dim, model] by
            # heads, its bias whole.
            axis = (
                0
                if output and kind == "kernel"
                else None
                if output
                else (1 if kind == "kernel" else 0)
            )
            self._slot_of[(part, kind)] = len(self._slots)
            self._add(f"{part}_{kind}", index, axis)

    def _project(self, inputs, part, devices):
        kernels = self._parts(self._slot_of[(part, "kernel")])
        bias = self._slot_of.get((part, "bias"))
        biases = self._parts(bias) if bias is not None else [None] * self.degree
        out = []
        for i, device in enumerate(devices):
            with tf.device(device):
                y = tf.einsum("abc,cde->abde", inputs[i], kernels[i])
                out.append(y if biases[i] is None else y + biases[i])
        return out

    def tp_call(
        self,
        query,
        value,
        key=None,
        attention_mask=None,
        use_causal_mask=False,
        training=None,
        return_attention_scores=False,
    ):
        if return_attention_scores:
            raise ValueError(
                f"layer {self.name!r} is split by heads and cannot return the attention scores. "
                "Received: return_attention_scores=True. "
                "Leave the layer out of the plan to get them."
            )
        key = value if key is None else key
        devices = computing_devices(self.devices)
        whole = {}
        # one copy (and one backward reduction) per distinct input
        for tensor in (query, value, key):
            if id(tensor) not in whole:
                t = gather_from(tensor) if isinstance(tensor, Sharded) else tensor
                whole[id(tensor)] = copy_to(
                    tf.cast(t, self.compute_dtype), devices, f"{self.name} all-reduce"
                )
        q = self._project(whole[id(query)], "query", devices)
        k = self._project(whole[id(key)], "key", devices)
        v = self._project(whole[id(value)], "value", devices)
        mask = self._mask(query, value, attention_mask, use_causal_mask)
        kernels = self._parts(self._slot_of[("attention_output", "kernel")])
        outs = []
        for i, device in enumerate(devices):
            with tf.device(device):
                outs.append(
                    timed(
                        i,
                        self.name,
                        (q[i], k[i], v[i]),
                        functools.partial(
                            self._heads, q[i], k[i], v[i], mask, kernels[i], training
                        ),
                    )
                )
        y = reduce_from(outs, devices, f"{self.name} all-reduce")
        bias = self._slot_of.get(("attention_output", "bias"))
        with tf.device(devices[0]):
            return y if bias is None else y + self._parts(bias)[0]

    def _heads(self, q, k, v, mask, kernel, training):
        """This device's heads: scaled dot-product attention and its rows of the output
        projection."""
        scores = tf.einsum(
            "aecd,abcd->acbe", k, q * tf.cast(1.0 / math.sqrt(self.key_dim), q.dtype)
        )
        if mask is not None:
            scores += (1.0 - tf.cast(mask[:, None], scores.dtype)) * _LARGE_NEGATIVE
        probs = tf.nn.softmax(scores, axis=-1)
        if training and self.dropout:
            probs = tf.nn.dropout(probs, rate=self.dropout)
        context = tf.einsum("acbe,aecd->abcd", probs, v)
        return tf.einsum("abcd,cde->abe", context, kernel)

    @staticmethod
    def _mask(query, value, attention_mask, use_causal_mask):
        mask = None if attention_mask is None else tf.cast(attention_mask, tf.bool)
        if use_causal_mask:
            q_len, v_len = tf.shape(query)[1], tf.shape(value)[1]
            causal = tf.cast(
                tf.linalg.band_part(tf.ones([1, q_len, v_len], tf.int32), -1, 0), tf.bool
            )
            mask = causal if mask is None else tf.logical_and(mask, causal)
        return mask


class _Embedding(_Shards):
    """Embedding split by vocabulary: each device looks up the ids in its rows, and the parts are
    summed."""

    def __init__(self, source, style, devices, keep_split=False, **kwargs):
        super().__init__(
            name=source.name, dtype=source.dtype_policy, trainable=source.trainable, **kwargs
        )
        self._init_shards(source, devices)
        self.rows = self._source_shapes[0][0] // self.degree
        self._add("embeddings", 0, 0, getattr(source, "embeddings_regularizer", None))
        if len(self._source_shapes) > 1:  # an untied ReversibleEmbedding's [hidden, vocab] kernel
            self._add("reverse_embeddings", 1, 1)

    def tp_call(self, ids, training=None):
        ids = tf.cast(ids, tf.int32)
        tables, devices = self._parts(0), computing_devices(self.devices)
        parts = []
        for i, device in enumerate(devices):
            with tf.device(device):
                parts.append(
                    timed(i, self.name, ids, functools.partial(self._lookup, ids, tables[i], i))
                )
        return reduce_from(parts, devices, f"{self.name} all-reduce")

    def reverse_call(self, x, dtype=None):
        """The logits over the vocabulary (a ``ReversibleEmbedding`` called with ``reverse=True``):
        each device's columns from its rows of the table, gathered."""
        dtype = dtype or self.compute_dtype
        devices = computing_devices(self.devices)
        inputs = copy_to(tf.cast(x, dtype), devices, f"{self.name} all-reduce")
        tied = len(self._slots) == 1
        variables, _ = self._slots[0 if tied else 1]
        parts = []
        for i, device in enumerate(devices):
            with tf.device(device):
                table = tf.cast(variables[i], dtype)
                axes = [[inputs[i].shape.rank - 1], [1 if tied else 0]]
                logits = functools.partial(tf.tensordot, inputs[i], table, axes)
                parts.append(timed(i, self.name, inputs[i], logits))
        return gather_from(Sharded(parts, devices))

    def _lookup(self, ids, table, i):
        """The ids in this device's rows, looked up; zeros for the others."""
        local = ids - i * self.rows
        mine = tf.logical_and(local >= 0, local < self.rows)
        found = tf.gather(table, tf.where(mine, local, tf.zeros_like(local)))
        return found * tf.cast(mine, found.dtype)[..., None]


_FAMILIES = {
    "Dense": _Dense,
    "EinsumDense": _Dense,
    "MultiHeadAttention": _Attention,
    "Embedding": _Embedding,
}


@functools.cache
def layer_class(keras_module: Any, kind: str) -> type:
    """The split layer class for a Keras layer class name ``kind``, a layer of ``keras_module``."""
    family = _FAMILIES[kind]
    return type(f"TensorParallel{kind}", (family, keras_module.layers.Layer), {})
