"""The two pieces of `HorovodStrategy` that do the work: Horovod all-reduces as a CrossDeviceOps,
and local gradient accumulation (Horovod's ``backward_passes_per_step``)."""

from tfpar import _compat
from tfpar._keras import tf

__all__ = ["XLA_OPS_BUILT", "GradientAccumulator", "HorovodAllReduce"]

# tfpar install-horovod compiles Horovod's XLA ops only for TensorFlow
# 2.6-2.18: later wheels lack the headers they need.
XLA_OPS_BUILT = tuple(int(p) for p in tf.__version__.split(".")[:2]) < (2, 19)


class HorovodAllReduce(tf.distribute.CrossDeviceOps):
    """Cross-device ops whose reductions are Horovod all-reduces across ranks.

    The values reaching it are each rank's local contribution; Keras has
    already divided the loss by ``num_replicas_in_sync`` (= ``hvd.size()``),
    so a Sum across ranks yields the average gradient.
    """

    def __init__(self, hvd, config):
        super().__init__()
        self._hvd = hvd
        self._size = hvd.size()
        self._compression = hvd.Compression.fp16 if config.compression == "fp16" else hvd.Compression.none
        self._op = config.op

    def _local(self, value):
        if isinstance(value, tf.distribute.DistributedValues):
            (value,) = value.values
        return value

    def _reduce_args(self, reduce_op, gradients):
        hvd = self._hvd
        if self._op == "adasum" and gradients:
            # Adasum combines unscaled gradients; undo Keras' 1/size.
            return dict(op=hvd.Adasum, prescale_factor=float(self._size))
        if self._op == "sum" and gradients:
            return dict(op=hvd.Sum, prescale_factor=float(self._size))
        return dict(op=hvd.Average if reduce_op == tf.distribute.ReduceOp.MEAN else hvd.Sum)

    def allreduce(self, reduce_op, tensors, gradients=False):
        """All-reduces a list of local tensors (dense or IndexedSlices) across ranks."""
        if not XLA_OPS_BUILT and _compat.in_xla_context():
            raise ValueError(
                "HorovodStrategy cannot run in an XLA-compiled function: Horovod's XLA "
                f"ops are not built for TensorFlow {tf.__version__} (its wheels lack the "
                "headers they need). Received: jit_compile=True. Compile the model with "
                "jit_compile=False (the default).")
        if self._size == 1:
            return list(tensors)
        hvd, args = self._hvd, self._reduce_args(reduce_op, gradients)
        out = list(tensors)
        grouped = []
        for i, t in enumerate(tensors):
            if isinstance(t, tf.IndexedSlices) and "prescale_factor" in args:
                t = tf.convert_to_tensor(t)  # Horovod scales dense tensors only
            if isinstance(t, tf.IndexedSlices) or args["op"] == hvd.Adasum:
                # hvd.grouped_allreduce fails for Adasum in 0.28.1 (it reads an
                # unbound name on that path); one allreduce per tensor works.
                out[i] = hvd.allreduce(t, compression=self._compression, **args)
            elif t.dtype.is_floating:
                grouped.append(i)
            else:  # integers: no compression, no scaling
                out[i] = hvd.allreduce(t, op=hvd.Average if args["op"] == hvd.Average else hvd.Sum)
        if grouped:
            reduced = hvd.grouped_allreduce([tensors[i] for i in grouped], compression=self._compression, **args)
            for i, r in zip(grouped, reduced):
                out[i] = r
        return out

    def reduce_implementation(self, reduce_op, per_replica_value, destinations, options):
        return self.allreduce(reduce_op, [self._local(per_replica_value)])[0]

    def batch_reduce_implementation(self, reduce_op, value_destination_pairs, options):
        return self.allreduce(reduce_op, [self._local(v) for v, _ in value_destination_pairs], gradients=True)

    def broadcast_implementation(self, tensor, destinations):
        return tensor

    def _gather(self, per_replica_value, destinations, axis, options=None):
        return self._hvd.allgather(self._local(per_replica_value))


class GradientAccumulator:
    """Local gradient accumulation over N steps, as Horovod's backward_passes_per_step.

    Every step adds this rank's gradients to local buffers; every N-th step the
    buffers' average is all-reduced, the optimizer applies it, and the buffers
    are cleared. On the other steps the optimizer's variable updates are
    skipped (its ``iterations`` still counts every step, as in Horovod).
    """

    def __init__(self, steps):
        self.steps = steps
        self._buffers = {}
        self._counter = None
        self.boundary = None  # the current step's "apply now" flag, while tracing it
        self.targets = set()  # refs of the variables that flag governs

    def _buffer(self, var, device):
        key = var.ref()
        if key not in self._buffers:
            # ResourceVariable(...) bypasses the strategy's variable creator:
            # these buffers are this rank's own, never mirrored or broadcast.
            with tf.init_scope(), tf.device(device):
                self._buffers[key] = _compat.ResourceVariable(
                    tf.zeros(var.shape, var.dtype), trainable=False, name="tfpar_grad_accumulator")
                if self._counter is None:
                    self._counter = _compat.ResourceVariable(
                        tf.constant(0, tf.int64), trainable=False, name="tfpar_accumulation_step")
        return self._buffers[key]

    def reduce(self, grads_and_vars, device, allreduce):
        """Accumulates; returns the averaged, all-reduced gradients (zeros between boundaries)."""
        buffers = [self._buffer(v, device) for _, v in grads_and_vars]
        added = [b.assign_add(tf.convert_to_tensor(g)) for b, (g, _) in zip(buffers, grads_and_vars)]
        with tf.control_dependencies(added):
            step = self._counter.assign_add(1)
        boundary = tf.equal(step % self.steps, 0)

        def reduce_and_clear():
            reduced = allreduce([b.read_value() / self.steps for b in buffers])
            with tf.control_dependencies(reduced):
                cleared = [b.assign(tf.zeros_like(b)) for b in buffers]
            with tf.control_dependencies(cleared):
                return [tf.identity(r) for r in reduced]

        self.boundary = boundary
        self.targets = {v.ref() for _, v in grads_and_vars}
        return tf.cond(boundary, reduce_and_clear, lambda: [tf.zeros_like(b) for b in buffers])
