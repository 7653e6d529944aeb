"""What a layer split in place does when called (`nested.split_in_place` gives it these calls).

A Dense or EinsumDense split by columns returns its output gathered, and the gathered tensor is
remembered with its parts (`keeping_split`): a row layer called on exactly that tensor takes the
parts instead, so nothing reads the gather and TensorFlow never runs it. A gather something else
reads (a custom attention's code between its projections) runs: `keeping_split` reports it, for
`describe()`, and times it for the Timeline. A MultiHeadAttention split by heads and an Embedding
split by vocabulary (in both uses of a tied one) call their split layer.
"""

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from tfpar._keras import tf
from tfpar._timing import now_after
from tfpar.tensor_parallel.ops import GATHER, recording_events

__all__ = ["keeping_split", "split_call"]

_KEPT = threading.local()


@contextlib.contextmanager
def keeping_split(read: list | None = None) -> Iterator[None]:
    """Inside it, a column layer's gathered output is remembered with its parts, for a row layer.
    At its end, in a traced graph, each gather something read (a custom layer's code that needs the
    whole activation) is appended to ``read`` as ``(layer name, shape)`` and timed for the Timeline
    (`ops.recording`); the gathers nothing read are left for TensorFlow to prune."""
    previous = getattr(_KEPT, "tensors", None)
    _KEPT.tensors = {}
    try:
        yield
        for whole, sharded, name in _KEPT.tensors.values():
            if _is_read(whole):
                _time_after(sharded, whole, name)
                if read is not None and (name, tuple(whole.shape)) not in read:
                    read.append((name, tuple(whole.shape)))
    finally:
        _KEPT.tensors = previous


def _is_read(tensor):
    """Whether an op of the graph being built reads ``tensor`` (never known eagerly)."""
    consumers = getattr(tensor, "consumers", None)
    return not tf.executing_eagerly() and consumers is not None and bool(consumers())


def _time_after(sharded, whole, name):
    """The gather's start and end for the Timeline, taken only once it is known to run."""
    events = recording_events()
    if events is None:
        return
    with tf.device(sharded.devices[0]):
        start = now_after(sharded.parts)
        events.append((0, f"{name} all-gather", start, now_after(whole)))


def _gathered(sharded, name):
    """The parts side by side, remembered: unread, TensorFlow prunes the gather."""
    with tf.device(sharded.devices[0]):
        whole = tf.concat(sharded.parts, axis=sharded.axis, name=GATHER)
    kept = getattr(_KEPT, "tensors", None)
    if kept is not None:
        kept[id(whole)] = (whole, sharded, name)
    return whole


def _split_input(x):
    kept = getattr(_KEPT, "tensors", None) or {}
    entry = kept.get(id(x))
    return entry[1] if entry is not None and entry[0] is x else x


def _dense_call(split):
    def call(inputs, training=None, **kwargs):
        if split.style == "column":
            return _gathered(split.tp_call(inputs, training=training), split.name)
        return split.tp_call(_split_input(inputs), training=training)  # whole: each its block

    return call


def _attention_call(layer, split):
    def call(
        query,
        value,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        use_causal_mask=False,
        cache=None,
        cache_update_index=None,
    ):
        if cache is not None or cache_update_index is not None:
            raise ValueError(
                f"layer {layer.name!r} is split by heads, and generating with a key/value cache is "
                f"not split. Received: cache={'a tensor' if cache is not None else None}, "
                f"cache_update_index={cache_update_index!r}. Generate with the trained model's "
                "plain_model()."
            )
        if any(m is not None for m in (query_mask, value_mask, key_mask)):  # Keras' own rule
            attention_mask = layer._compute_attention_mask(
                query,
                value,
                query_mask=query_mask,
                value_mask=value_mask,
                key_mask=key_mask,
                attention_mask=attention_mask,
                use_causal_mask=use_causal_mask,
            )
            use_causal_mask = False
        return split.tp_call(
            query,
            value,
            key=key,
            attention_mask=attention_mask,
            use_causal_mask=use_causal_mask,
            training=training,
            return_attention_scores=return_attention_scores,
        )

    return call


def _embedding_call(layer, split):
    def call(inputs, reverse=False, **kwargs):
        if not reverse:
            return split.tp_call(inputs)
        logits = split.reverse_call(inputs, getattr(layer, "reverse_dtype", None))
        cap = getattr(layer, "logit_soft_cap", None)
        return logits if cap is None else tf.tanh(logits / cap) * cap

    return call


def split_call(layer: Any, split: Any, kind: str | None) -> Any:
    """The ``call`` that ``layer`` (of Keras class ``kind``), split in place, takes: its split
    layer's."""
    if kind in ("Dense", "EinsumDense"):
        return _dense_call(split)
    if kind == "MultiHeadAttention":
        return _attention_call(layer, split)
    return _embedding_call(layer, split)
