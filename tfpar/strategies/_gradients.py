"""What tfpar's synchronous strategies do to the optimizer's gradients on their way to the
all-reduce: compression (cast to bf16 or fp16 for the wire, back after it) and accumulation
(N steps' gradients summed locally, all-reduced and applied once).

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
from tfpar.strategies._microbatches import elastic_microbatches, split_into_microbatches
from tfpar.strategies._windows import count_updates, warn_about_remainder

__all__ = [
    "COMPRESSIONS",
    "GRADIENT_CHECKS",
    "AccumulatedUpdates",
    "GradientAccumulator",
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
    ("fit", "before", split_into_microbatches),
)
"""The model checks of a strategy whose replicas compress or accumulate their gradients."""


class GradientAccumulator:
    """Local gradient accumulation over N steps, as Horovod's backward_passes_per_step.

    Every step adds each replica's gradients to buffers on its device; every N-th step the
    buffers' averages are all-reduced, the optimizer applies them, and the buffers are cleared.
    On the other steps nothing is sent and the optimizer's variable updates are skipped, its
    ``iterations`` included (`count_updates`): it counts updates, as Keras 3's own accumulation's
    ``iterations``, PyTorch's and DeepSpeed's optimizer steps do, so that Adam's bias correction and
    a learning-rate schedule see one step of N times the batch. (Horovod's backward_passes_per_step
    counts every step: Adam then trains otherwise than on the N-times batch.)
    """

    def __init__(self, steps):
        self.steps = steps
        self._buffers = {}
        self._counter = self._start = None
        self.boundary = None  # the current step's "apply now" flag, while tracing it
        self.targets = set()  # refs of the variables that flag governs
        self.counters = set()  # refs of the optimizers' step counters, which it governs too

    def _buffer(self, var, device):
        key = (var.ref(), device)
        if key not in self._buffers:
            # ResourceVariable(...) bypasses the strategy's variable creator: these buffers are this
            # replica's own, never mirrored or broadcast.
            with tf.init_scope(), tf.device(device):
                self._buffers[key] = _compat.ResourceVariable(
                    tf.zeros(var.shape, var.dtype), trainable=False, name="tfpar_grad_accumulator"
                )
        return self._buffers[key]

    def counter(self):
        """The calls counted so far (a variable, made at the first use)."""
        if self._counter is None:
            with tf.init_scope():
                self._counter = _compat.ResourceVariable(
                    tf.constant(0, tf.int64), trainable=False, name="tfpar_accumulation_step"
                )
                self._start = _compat.ResourceVariable(
                    tf.constant(0, tf.int64), trainable=False, name="tfpar_accumulation_step_start"
                )
        return self._counter

    def begin_step(self):
        """Cross-replica, before a step of several calls (an elastic job's micro-batches): notes the
        count."""
        counter = self.counter()
        return self._start.assign(counter)

    def settle(self, calls):
        """Cross-replica, after that step: a loss scale that skipped one of its calls (Keras 3 does
        not reduce the gradients it finds non-finite) left the count short, which would shift every
        later boundary, so the window is dropped (its buffers cleared, the count back to its start)
        as a skipped update is. A count that did not move at all is left: no call reduced here (ZeRO
        accumulates in its own buffers), or the loss scale skipped every call. Returns whether it
        was dropped."""
        counter = self.counter()
        counted = counter - self._start

        def drop():
            cleared = [b.assign(tf.zeros_like(b)) for b in self._buffers.values()]
            with tf.control_dependencies(
                cleared + [counter.assign(self._start - self._start % self.steps)]
            ):
                return tf.constant(True)

        short = tf.logical_and(counted > 0, counted < calls)
        return tf.cond(short, drop, lambda: tf.constant(False))

    def reduce(self, per_device_grads, variables, devices, allreduce):
        """Accumulates ``per_device_grads`` (one list per device, in ``variables``' order).

        ``allreduce(per_device_averages)`` reduces the averaged buffers (one list per device) and
        returns the reduced tensors flat, device-major. Returns those tensors at a boundary, zeros
        of the same structure on the other steps.
        """
        buffers = [[self._buffer(v, d) for v in variables] for d in devices]
        added = []
        for device, device_buffers, grads in zip(devices, buffers, per_device_grads):
            with tf.device(device):
                added += [
                    b.assign_add(tf.convert_to_tensor(g)) for b, g in zip(device_buffers, grads)
                ]
        with tf.control_dependencies(added):
            step = self.counter().assign_add(1)
        boundary = tf.equal(step % self.steps, 0)
        flat = [b for device_buffers in buffers for b in device_buffers]

        def reduce_and_clear():
            averages = []
            for device, device_buffers in zip(devices, buffers):
                with tf.device(device):
                    averages.append([b.read_value() / self.steps for b in device_buffers])
            reduced = allreduce(averages)
            with tf.control_dependencies(reduced):
                cleared = [b.assign(tf.zeros_like(b)) for b in flat]
            with tf.control_dependencies(cleared):
                return [tf.identity(r) for r in reduced]

        self.boundary = boundary
        self.targets = {v.ref() for v in variables}
        return tf.cond(boundary, reduce_and_clear, lambda: [tf.zeros_like(b) for b in flat])

    def count_updates(self, optimizer):
        """``optimizer``'s ``iterations`` (those of the one a loss-scale optimizer wraps, which both
        Kerases' ``iterations`` name and which counts where the gradients are reduced) move at the
        boundaries only."""
        counter = getattr(optimizer, "inner_optimizer", optimizer).iterations
        if not isinstance(counter, tf.Variable):
            counter = counter.value  # Keras 3 wraps a tf.Variable
        self.counters.add(counter.ref())

    def governs(self, var):
        """Whether the update of ``var`` is skipped between boundaries: in the step that set the
        boundary only (not in a function traced later, a checkpoint's restore, nor in an
        assignment after an eager step)."""
        if self.boundary is None:
            return False
        if tf.is_symbolic_tensor(self.boundary):
            within = _traced_within(self.boundary.graph)
        else:  # an eager step (run_eagerly): until its last update (`step_done`)
            within = tf.executing_eagerly()
        return within and (var.ref() in self.targets or var.ref() in self.counters)

    def step_done(self, var):
        """After the update of ``var``: in an eager step the optimizer's step counter is the
        step's last update, so the step's boundary is let go."""
        if var.ref() in self.counters and not tf.is_symbolic_tensor(self.boundary):
            self.boundary = None


def _traced_within(graph):
    """Whether the function being traced is ``graph`` or one nested in it (a branch of a cond)."""
    current = tf.compat.v1.get_default_graph()
    while current is not None and current is not graph:
        current = getattr(current, "outer_graph", None)
    return current is graph


class AccumulatedUpdates:
    """Mixed into a MirroredExtended with an ``_accumulator`` (a `GradientAccumulator` or None):
    the optimizer's updates of the variables it governs run at its boundaries only."""

    def _update(self, var, fn, args, kwargs, group):
        accumulator = self._accumulator
        if accumulator is None or not accumulator.governs(var):
            return super()._update(var, fn, args, kwargs, group)

        def apply():
            super(AccumulatedUpdates, self)._update(var, fn, args, kwargs, group=True)
            return tf.constant(True)

        applied = tf.cond(accumulator.boundary, apply, lambda: tf.constant(False))
        accumulator.step_done(var)
        return applied


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
