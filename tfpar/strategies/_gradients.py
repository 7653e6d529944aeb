"""What tfpar's synchronous strategies do to the optimizer's gradients on their way to the
all-reduce: compression (cast to bf16 or fp16 for the wire, back after it) and accumulation
(N steps' gradients summed locally, all-reduced and applied once: `tfpar.strategies._accumulation`).

Both apply to the optimizer's gradient reduction only, never to the strategy's other reductions
(metrics, synchronized BatchNorm's moments, the loss scale's overflow vote), which need their
full precision and every step. `gradient_variables` tells them apart: tf_keras reduces the
gradients with their variables as destinations; Keras 3 reduces them as plain values, so
tfpar marks the gradient reduction of the optimizer a Keras 3 model of a tfpar strategy is
compiled with (`mark_keras3_gradient_reduction`, on that optimizer instance).
"""

import functools
import threading

from tfpar import _compat
from tfpar._keras import is_keras3, keras_of, tf
from tfpar.strategies import _sparse as sparse
from tfpar.strategies._accumulation import AccumulatedUpdates, GradientAccumulator
from tfpar.strategies._microbatches import elastic_microbatches, split_into_microbatches
from tfpar.strategies._prebuild import build_optimizer_state
from tfpar.strategies._windows import count_updates, warn_about_remainder

__all__ = [
    "COMPRESSIONS",
    "GRADIENT_CHECKS",
    "GradientReduction",
    "check_compression",
    "compress",
    "count_updates",
    "decompress",
    "gradient_variables",
    "mark_keras3_gradient_reduction",
    "marked_variables",
]

COMPRESSIONS = ("none", "bf16", "fp16")
"""Gradient compression on the wire: "bf16" keeps float32's range with 8 bits of mantissa; "fp16"
keeps 11 bits in a range up to 65504 (loss scaling keeps scaled gradients in it). A sparse gradient
(an Embedding's) sends its rows in 16 bits and its indices as they are
(`tfpar.strategies._sparse`)."""

# The optimizer's gradient reduction in progress (Keras 3): the variables whose gradients the next
# batch reduction carries. Set by each replica's thread and read in the merge_call, which runs in
# another thread, so it is process-wide, not thread-local.
_marked = {"depth": 0, "variables": None}
_lock = threading.Lock()


def check_compression(value, op=None):
    """Raises ValueError unless ``value`` is one of `COMPRESSIONS` (and, with Horovod's ``op``,
    not Adasum, which combines gradients by their dot products: a cast would change its result)."""
    from tfpar._checks import check_choice

    check_choice("compression", value, COMPRESSIONS)
    if op == "adasum" and value != "none":
        raise ValueError(
            f"compression={value!r} cannot be combined with op='adasum': Adasum weighs each rank's "
            "gradient by dot products that a cast to 16 bits would change. Received: op='adasum', "
            f"compression={value!r}. Use compression='none' with Adasum, or op='average'."
        )
    return value


def _cast(value, dtype, compression):
    # On the value's own device: the strategy's batch reduction packs its values together only
    # when their devices match their destinations'.
    with tf.device(value.device):
        if sparse.is_sparse(value):
            if value.dtype == tf.float32:
                return sparse.to_wire(value, compression)
            return sparse.from_wire(value, compression, dtype)
        return tf.cast(value, dtype)


def compress(tensors, compression):
    """``tensors`` (dense or IndexedSlices) cast for the wire; float32 only, others as they are."""
    wire = sparse.WIRE_DTYPES.get(compression)
    if wire is None:
        return list(tensors)
    return [_cast(t, wire, compression) if t.dtype == tf.float32 else t for t in tensors]


def decompress(tensors, originals, compression):
    """``tensors``, reduced after `compress`, back in their ``originals``' dtypes."""
    return [
        t if t.dtype == o.dtype else _cast(t, o.dtype, compression)
        for t, o in zip(tensors, originals)
    ]


def gradient_variables(reduce_op, value_destination_pairs):
    """The variables whose gradients a batch reduction carries, or None if it is not the
    optimizer's gradient reduction."""
    if reduce_op != tf.distribute.ReduceOp.SUM or not value_destination_pairs:
        return None
    destinations = [d for _, d in value_destination_pairs]
    if all(isinstance(d, tf.Variable) for d in destinations):  # tf_keras
        return destinations
    return marked_variables(value_destination_pairs)


def marked_variables(values):
    """The variables of a Keras 3 gradient reduction of ``values`` (in its merge_call, or in a
    replica context, where HorovodStrategy reduces without one), or None."""
    marked = _marked["variables"]
    if _marked["depth"] and marked is not None and len(marked) == len(values):
        return list(marked)
    return None


def _marking(all_reduce_sum_gradients):
    """``all_reduce_sum_gradients`` (a Keras 3 optimizer's, bound), marking which variables'
    gradients it reduces while it runs, for the strategy's batch reduction to read (Keras 3 gives no
    destinations)."""

    @functools.wraps(all_reduce_sum_gradients)
    def marked(grads_and_vars):
        grads_and_vars = list(grads_and_vars)
        with _lock:
            _marked["depth"] += 1
            _marked["variables"] = [v for g, v in grads_and_vars if g is not None]
        try:
            return all_reduce_sum_gradients(grads_and_vars)
        finally:
            with _lock:
                _marked["depth"] -= 1
                if not _marked["depth"]:
                    _marked["variables"] = None

    marked._tfpar_marked = True
    return marked


def mark_keras3_gradient_reduction(model, arguments=None):
    """After ``compile`` of a Keras 3 model of a tfpar strategy: its optimizer (and the one a
    LossScaleOptimizer wraps) marks its gradient all-reduce, on that optimizer instance only."""
    optimizer = getattr(model, "optimizer", None)
    optimizer_class = (
        _compat.keras3_tf_optimizer_class(keras_of(model)) if is_keras3(model) else None
    )
    if optimizer_class is None:
        return
    for each in (optimizer, getattr(optimizer, "inner_optimizer", None)):
        if isinstance(each, optimizer_class) and not getattr(
            each._all_reduce_sum_gradients, "_tfpar_marked", False
        ):
            object.__setattr__(
                each, "_all_reduce_sum_gradients", _marking(each._all_reduce_sum_gradients)
            )


GRADIENT_CHECKS = (
    ("compile", "after", mark_keras3_gradient_reduction),
    ("compile", "after", count_updates),
    ("fit", "before", warn_about_remainder),
    ("fit", "before", build_optimizer_state),  # before the micro-batches' own train_step
    ("fit", "before", split_into_microbatches),
)
"""The model checks of a strategy whose replicas compress or accumulate their gradients (and
whose tf_keras step is traced once: `tfpar.strategies._prebuild`)."""


class GradientReduction(AccumulatedUpdates):
    """Mixed into a MirroredExtended (one host or several workers): compresses and accumulates
    the optimizer's gradients around the all-reduce the strategy would make anyway."""

    def __init__(self, container_strategy, config, **kwargs):
        """``config``: the strategy's `DataParallelConfig` (its compression and accumulation);
        ``kwargs``: the extended's own arguments."""
        self._compression = config.compression
        # each an accumulated step of its own
        self._microbatches = elastic_microbatches(config.cluster)
        steps = config.gradient_accumulation_steps * self._microbatches
        self._accumulator = GradientAccumulator(steps) if steps > 1 else None
        super().__init__(container_strategy, **kwargs)

    def _parts(self, value):
        """A distributed value's tensors, one per local device."""
        return self._container_strategy().experimental_local_results(value)

    def _reduce_compressed(self, reduce_op, value_destination_pairs, options):
        if self._compression == "none":
            return super()._batch_reduce_to(reduce_op, value_destination_pairs, options)
        per_replica = [self._parts(v) for v, _ in value_destination_pairs]
        wire = [
            _compat.PerReplica(tuple(compress(parts, self._compression))) for parts in per_replica
        ]
        reduced = super()._batch_reduce_to(
            reduce_op, [(w, d) for w, (_, d) in zip(wire, value_destination_pairs)], options
        )
        return [
            _compat.mirrored(tuple(decompress(self._parts(r), parts, self._compression)))
            for r, parts in zip(reduced, per_replica)
        ]

    def _batch_reduce_to(self, reduce_op, value_destination_pairs, options):
        variables = gradient_variables(reduce_op, value_destination_pairs)
        if variables is None:
            return super()._batch_reduce_to(reduce_op, value_destination_pairs, options)
        if self._accumulator is None:
            return self._reduce_compressed(reduce_op, value_destination_pairs, options)
        devices = self.worker_devices
        per_device = list(zip(*[self._parts(v) for v, _ in value_destination_pairs]))
        destinations = [d for _, d in value_destination_pairs]

        def allreduce(per_device_averages):
            pairs = [
                (_compat.PerReplica(tuple(parts)), d)
                for parts, d in zip(zip(*per_device_averages), destinations)
            ]
            reduced = self._reduce_compressed(reduce_op, pairs, options)
            return [self._parts(r)[i] for i in range(len(devices)) for r in reduced]

        flat = self._accumulator.reduce(per_device, variables, devices, allreduce)
        count = len(variables)
        return [
            _compat.mirrored(tuple(flat[i * count + j] for i in range(len(devices))))
            for j in range(count)
        ]
