"""The pieces of `HorovodStrategy` that do the work: Horovod all-reduces as a CrossDeviceOps, and
ZeRO's reduce-scatter and all-gather over the ranks (gradient accumulation, shared with
`DataParallel`, is in `tfpar.strategies._gradients`)."""

import weakref

from tfpar import _compat
from tfpar._keras import tf
from tfpar.strategies import _sparse as sparse

__all__ = ["XLA_OPS_BUILT", "HorovodAllReduce", "HorovodChunks", "uses_nccl_reducescatter"]

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
        self._compression = (
            hvd.Compression.fp16 if config.compression == "fp16" else hvd.Compression.none
        )
        self._bf16 = config.compression == "bf16"
        self._wire = None if config.compression == "none" else config.compression
        self._op = config.op
        # graph -> the names of its gradients' ops (names: an op would keep its graph alive)
        self._gradient_ops = weakref.WeakKeyDictionary()

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

    def _allgather_bf16(self, tensors, args):
        """The float tensors' all-reduce in bf16 on the wire: Horovod 0.28's all-reduce takes no
        bf16, its allgather takes the bits (as int16). One allgather for all of them; each rank
        sums the ranks' parts in float32."""
        hvd = self._hvd
        flat = tf.concat([tf.reshape(tf.cast(t, tf.bfloat16), [-1]) for t in tensors], axis=0)
        gathered = hvd.allgather(tf.bitcast(flat, tf.int16), name="tfpar_bf16_gradients")
        parts = tf.cast(tf.bitcast(tf.reshape(gathered, [self._size, -1]), tf.bfloat16), tf.float32)
        total = tf.reduce_sum(parts, axis=0) * args.get("prescale_factor", 1.0)
        if args["op"] == hvd.Average:
            total = total / self._size
        sizes = [t.shape.num_elements() for t in tensors]
        return [
            tf.cast(tf.reshape(part, t.shape), t.dtype)
            for part, t in zip(tf.split(total, sizes), tensors)
        ]

    def _allgather_sparse(self, slices, args):
        """A sparse gradient's all-reduce with compression: every rank's rows in 16 bits (bf16 as
        its bits: Horovod takes no bf16) and their indices, gathered; the rows back in float32,
        where the optimizer sums them."""
        hvd = self._hvd
        wire = sparse.to_wire(slices, self._wire, carrier=tf.int16)
        values = hvd.allgather(wire.values)
        indices = hvd.allgather(wire.indices)
        gathered = sparse.from_wire(
            tf.IndexedSlices(values, indices, slices.dense_shape), self._wire, slices.dtype
        )
        if args["op"] == hvd.Average:
            return tf.IndexedSlices(
                gathered.values / self._size, gathered.indices, gathered.dense_shape
            )
        return gathered

    def allreduce(self, reduce_op, tensors, gradients=False):
        """All-reduces a list of local tensors (dense or IndexedSlices) across ranks; ``gradients``:
        they are the optimizer's gradients (scaled for Sum and Adasum, and compressed)."""
        if not XLA_OPS_BUILT and _compat.in_xla_context():
            raise ValueError(
                "HorovodStrategy cannot run in an XLA-compiled function: Horovod's XLA "
                f"ops are not built for TensorFlow {tf.__version__} (its wheels lack the "
                "headers they need). Received: jit_compile=True. Compile the model with "
                "jit_compile=False (the default)."
            )
        if self._size == 1:
            return list(tensors)
        graph = tf.compat.v1.get_default_graph()
        if gradients and graph.building_function:  # a traced step (not eager, not a TF1 graph)
            self._gradient_ops[graph] = [t.op.name for t in tensors if t.graph is graph]
        hvd, args = self._hvd, self._reduce_args(reduce_op, gradients)
        compression = self._compression if gradients else hvd.Compression.none
        tensors = list(tensors)
        out = list(tensors)
        grouped = []
        for i, t in enumerate(tensors):
            if isinstance(t, tf.IndexedSlices) and "prescale_factor" in args:
                tensors[i] = tf.convert_to_tensor(t)  # Horovod scales dense tensors only
                t = tensors[i]
            if isinstance(t, tf.IndexedSlices) and gradients and self._wire is not None:
                out[i] = self._allgather_sparse(t, args)
            elif isinstance(t, tf.IndexedSlices) or args["op"] == hvd.Adasum:
                # hvd.grouped_allreduce fails for Adasum in 0.28.1 (it reads an
                # unbound name on that path); one allreduce per tensor works.
                out[i] = hvd.allreduce(t, compression=compression, **args)
            elif t.dtype.is_floating:
                grouped.append(i)
            else:  # integers: no compression, no scaling
                out[i] = hvd.allreduce(t, op=hvd.Average if args["op"] == hvd.Average else hvd.Sum)
        if grouped and gradients and self._bf16:
            reduced = self._allgather_bf16([tensors[i] for i in grouped], args)
        elif grouped:
            reduced = hvd.grouped_allreduce(
                [tensors[i] for i in grouped], compression=compression, **args
            )
        if grouped:
            for i, r in zip(grouped, reduced):
                out[i] = r
        return out

    def reduce_implementation(self, reduce_op, per_replica_value, destinations, options):
        """One value all-reduced over the ranks. Horovod adds no booleans (Keras 3's ``fit``
        reduces a KerasHub model's first batch, its ``padding_mask`` too, to read its shapes):
        they are counted as integers, true where any rank's is, under SUM and MEAN alike. A
        string is this rank's: no reduction adds strings."""
        local = self._local(per_replica_value)
        dtype = tf.as_dtype(getattr(local, "dtype", tf.float32))
        if dtype == tf.string:
            return local
        with tf.control_dependencies(self._after_gradients()):
            if dtype == tf.bool:
                counted = self.allreduce(tf.distribute.ReduceOp.SUM, [tf.cast(local, tf.int32)])
                return counted[0] > 0
            return self.allreduce(reduce_op, [local])[0]

    def _after_gradients(self):
        """The ops of the gradients this traced function all-reduces (none elsewhere, or before).

        A value reduced later in the same function (the metrics tf_keras' ``fit`` reads after each
        step) then reaches Horovod with the gradients and shares their cycle. Sent as soon as it
        exists (after the forward pass), it took a cycle of its own amid the backward pass.
        Where the gradients are all-reduced in a branch of their own (gradient accumulation,
        Keras 3's loss scaling), the value is not held back. The gradients were built first, so
        they cannot depend on the value: no cycle in the graph."""
        graph = tf.compat.v1.get_default_graph()
        names = self._gradient_ops.get(graph, [])
        return [graph.get_operation_by_name(name) for name in names]

    def batch_reduce_implementation(self, reduce_op, value_destination_pairs, options):
        return self.allreduce(reduce_op, [self._local(v) for v, _ in value_destination_pairs])

    def broadcast_implementation(self, tensor, destinations):
        return tensor

    def _gather(self, per_replica_value, destinations, axis, options=None):
        return self._hvd.allgather(self._local(per_replica_value))


class HorovodChunks:
    """ZeRO's collectives over Horovod's ranks (`tfpar.strategies._zero`), one replica a rank.

    The reduce-scatter: on GPUs with NCCL, ``hvd.reducescatter`` (untested on hardware); elsewhere
    an ``hvd.alltoall`` that sends each chunk of the flat gradients to its owner, which sums the
    ranks' chunks in float32. Each rank sends the same (N-1)/N of the gradients' bytes either way,
    but Horovod 0.28's Gloo reducescatter copies its whole input and ran 3x slower than this
    alltoall here (10.3 M parameters, 2 ranks: 108 ms against 32 ms). With compression the chunks
    travel in fp16, or in bf16 (as its bits: Horovod takes no bf16). The updated chunks come back
    by ``hvd.allgather``."""

    def __init__(self, ops, device):
        self.ops, self.devices = ops, [device]
        self.size, self.owned = ops._size, [ops._hvd.rank()]
        self.nccl = uses_nccl_reducescatter(device, ops._hvd.nccl_built())
        # op="sum" undoes Keras' 1/N (as the reduce-scatter's prescale does)
        self.gradient_scale = ops._reduce_args(tf.distribute.ReduceOp.SUM, True).get(
            "prescale_factor", 1.0
        )

    def reduce_scatter(self, flat, c, summed, full=False, index=0):
        """This rank's flat gradients of bucket ``index`` ->
        ``([its piece of their sum over the ranks], [bytes sent])``; already summed ones are only
        cut (``full``: sent in float32 whatever the compression)."""
        hvd, (j,) = self.ops._hvd, self.owned
        if summed or self.size == 1:
            return [flat[0][j * c : (j + 1) * c]], [0]
        args = self.ops._reduce_args(tf.distribute.ReduceOp.SUM, gradients=True)
        fp16 = not full and self.ops._compression is hvd.Compression.fp16
        bf16 = not full and self.ops._bf16
        width = 2 if fp16 or bf16 else 4
        if self.nccl and not bf16:
            compression = hvd.Compression.fp16 if fp16 else hvd.Compression.none
            mine = hvd.reducescatter(
                flat[0], compression=compression, name=f"tfpar_zero_gradients_{index}", **args
            )
            return [mine], [width * c * (self.size - 1)]
        sent = tf.cast(flat[0], tf.float16 if fp16 else tf.bfloat16 if bf16 else tf.float32)
        wire = tf.bitcast(sent, tf.int16) if bf16 else sent
        got = hvd.alltoall(wire, name=f"tfpar_zero_gradients_{index}")
        got = tf.bitcast(got, tf.bfloat16) if bf16 else got
        mine = tf.reduce_sum(tf.cast(tf.reshape(got, [self.size, c]), tf.float32), 0)
        return [mine * args.get("prescale_factor", 1.0)], [width * c * (self.size - 1)]

    def all_gather(self, updated, index=0):
        """This rank's updated piece of bucket ``index`` ->
        ``([every rank's, in rank order], [bytes sent])``."""
        whole = self.ops._hvd.allgather(updated[0], name=f"tfpar_zero_parameters_{index}")
        return [whole], [4 * updated[0].shape.num_elements() * (self.size - 1)]

    def total(self, values):
        """The sum over the ranks of this rank's values."""
        return self.ops._hvd.allreduce(
            tf.add_n(values), op=self.ops._hvd.Sum, name="tfpar_zero_norm"
        )

    def gather(self, pieces, lengths, name):
        """Every rank's piece (``lengths[j]`` elements for rank j, none included), in rank order."""
        return self.ops._hvd.allgather(tf.concat(pieces, 0), name=name)


def uses_nccl_reducescatter(device: str, nccl_built: bool) -> bool:
    """Whether ZeRO's reduce-scatter is NCCL's (a rank on a GPU of a Horovod built with NCCL)."""
    return bool(nccl_built) and "GPU" in device.upper()
