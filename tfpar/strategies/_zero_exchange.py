"""A ZeRO step's exchange (`tfpar.strategies._zero`), bucket by bucket (`Bucket`): each bucket's
gradients reduce-scattered; then each replica's piece of each bucket's sum updated and the updated
pieces all-gathered into every replica's weights. A bucket's reduce-scatter starts once the one
before it is done, and its update once the one before it is written, so that a step holds one
bucket's flat copy, update and collective buffers at a time, not the whole model's: PyTorch DDP's
buckets, for memory here (Keras hands the optimizer every gradient at once, so there is no
backward to overlap).

A sparse gradient's sums of squared rows (`tfpar.strategies._sparse`) travel with its bucket's
gradients in the same collective (so that every engine runs a step's collectives in one order),
which then sends twice the bucket's bytes; the other buckets' squares are -1 (dense), made on the
owner. fp16's range would flush those squares (1e-8 and less) to zero, so under fp16 compression
such a bucket, gradients included, travels in float32.

Each step records when each bucket's reduce-scatter, update and all-gather ran (``device_trace``:
the `tfpar.callbacks.Timeline`'s ``ZeRO exchange`` track)."""

from tfpar._keras import tf
from tfpar._timing import timed, trace_variable
from tfpar.strategies import _sparse as sparse
from tfpar.strategies._zero_state import ShardedState

__all__ = ["BucketExchange"]


class BucketExchange(ShardedState):
    """The sharded state (`ShardedState`) and a step's exchanges over its buckets."""

    def __init__(self, optimizer, variables, strategy, stage, strategy_accumulates=False):
        """`ShardedState`'s, and the wire of a sparse gradient's squares."""
        super().__init__(optimizer, variables, strategy, stage, strategy_accumulates)
        # fp16 would flush squared rows to zero: their reduce-scatter travels in float32 there
        compression = getattr(getattr(strategy, "config", None), "compression", "none")
        self.squares_in_float32 = compression == "fp16"
        with tf.init_scope(), tf.device(self.devices[0]):
            # the last step's exchange, a row per event: (start, end)
            self.device_trace = trace_variable("tfpar_zero_trace")
        self._trace_labels = []  # of device_trace's rows, once the step is traced
        self._events = []  # (label, start, end) of the step being traced

    def device_track_names(self):
        """The Timeline's tracks: one."""
        return ["ZeRO exchange"]

    def device_trace_labels(self):
        """Per row of ``device_trace``: (its track, its label); known once the step is traced."""
        return [(0, label) for label in self._trace_labels]

    def _step_events(self):
        """The events of the step being traced that ran before its update: none here (stage 3's
        gathers and reduce-scatters run in the forward and backward passes)."""
        return []

    def _timed(self, label, inputs, compute, events=None):
        """``compute()``, its start (once ``inputs`` exist) and end recorded as event ``label`` (in
        ``events``, default the step's)."""
        return timed(self._events if events is None else events, (label,), inputs, compute)

    def _trace(self, recorded=None, rows=None):
        """The write of the step's events into ``device_trace`` (the first ``recorded`` of them
        where a branch ran only those, the rest NaN up to ``rows``); the labels are those of all."""
        events = self._events[:recorded]
        self._trace_labels[:] = [label for label, _, _ in self._events]
        stamps = [tf.stack([start, end]) for _, start, end in events]
        missing = (rows or len(events)) - len(events)
        table = tf.concat(
            [
                tf.zeros([0, 2], tf.float64),
                *[tf.reshape(row, [1, 2]) for row in stamps],
                tf.fill([missing, 2], tf.constant(float("nan"), tf.float64)),
            ],
            0,
        )
        return self.device_trace.assign(table)

    def _bucket_gradients(self, grads, bucket, k, of=sparse.dense):
        """Local replica ``k``'s flat gradients of ``bucket`` (``of`` each: summed rows, or their
        squares)."""
        return self.bucket_flat(
            [
                tf.zeros(self.variables[i].shape)
                if grads[i] is None
                else of(self._local(grads[i], k), self.variables[i].shape)
                for i in bucket.variables
            ],
            bucket,
        )

    def _squares_of(self, grads):
        """The sums of squared sparse rows of ``grads``' buckets that hold a sparse gradient, as
        `_exchange` takes them (None for the other buckets)."""

        def squares(bucket, k):
            held = [grads[i] for i in bucket.variables if grads[i] is not None]
            if not any(sparse.is_sparse(self._local(g, 0)) for g in held):
                return None
            return self._bucket_gradients(grads, bucket, k, sparse.row_squares)

        return squares

    def _exchange(self, flat_of, summed, squares_of=None):
        """Bucket by bucket, each after the one before (a step holds one bucket's flat copy and
        buffers at a time): every local replica's flat values of the bucket (``flat_of(bucket,
        k)``), reduce-scattered. Returns each local replica's pieces of the sums (one per bucket),
        the bytes each sent, and its pieces of the sums of squared sparse rows (``squares_of``;
        negative where dense) or None."""
        pieces = [[] for _ in self.devices]
        square_pieces = [[] for _ in self.devices]
        sent = [0] * len(self.devices)
        after = []
        for index, bucket in enumerate(self.buckets):
            with tf.control_dependencies(after):
                reduced, squares, sent_now = self._reduce_bucket(
                    flat_of, squares_of, bucket, index, summed
                )
            after = reduced + squares
            for k in range(len(self.devices)):
                pieces[k].append(reduced[k])
                square_pieces[k] += squares[k : k + 1]
                sent[k] += sent_now[k]
        return pieces, sent, square_pieces if squares_of is not None else None

    def _reduce_bucket(self, flat_of, squares_of, bucket, index, summed):
        """One bucket's reduce-scatter: ``(pieces, squares' pieces or [], bytes sent)``, one per
        local replica. Its squares travel with its gradients where it holds a sparse one; where not
        (or where only some bucket does), its squares' pieces are -1 (dense), made from them."""
        flat = []
        squares = []
        for k, device in enumerate(self.devices):
            with tf.device(device):
                flat.append(flat_of(bucket, k))
                square = squares_of(bucket, k) if squares_of else None
                squares += [] if square is None else [square]
        if squares:
            return self._timed(
                f"reduce-scatter {index}",
                flat + squares,
                lambda: self._reduce_scatter_with_squares(flat, squares, summed, bucket, index),
            )
        reduced, sent = self._timed(
            f"reduce-scatter {index}",
            flat,
            lambda: self.comm.reduce_scatter(flat, bucket.piece, summed, index=index),
        )
        if squares_of is None:
            return reduced, [], sent
        dense = []
        for device, r in zip(self.devices, reduced):
            with tf.device(device):
                dense.append(sparse.row_squares(r, r.shape))  # -1: dense
        return reduced, dense, sent

    def _reduce_scatter_with_squares(self, flat, squares, summed, bucket, index):
        """Each replica's flat gradients and sums of squared sparse rows of ``bucket``,
        reduce-scattered as one: piece j of both travels together (one collective, so every engine
        runs them in one order)."""
        c = bucket.piece
        n = self.comm.size
        both = []
        for device, g, sq in zip(self.devices, flat, squares):
            with tf.device(device):
                both.append(
                    tf.reshape(tf.concat([tf.reshape(g, [n, c]), tf.reshape(sq, [n, c])], 1), [-1])
                )
        reduced, sent = self.comm.reduce_scatter(
            both, 2 * c, summed, full=self.squares_in_float32, index=index
        )
        return [r[:c] for r in reduced], [r[c:] for r in reduced], sent

    def _write_back(self, pieces, update):
        """Bucket by bucket, each once the one before is written: each local replica's reduced
        ``pieces`` of the bucket updated (``update(index, bucket)``: the updated piece of each
        local replica), all-gathered and written into every local copy of the weights (a step
        holds one bucket's update and buffers at a time). Returns the writes and the bytes each
        replica sent."""
        writes = []
        gathered = [0] * len(self.devices)
        after = []
        for index, bucket in enumerate(self.buckets):
            with tf.control_dependencies(after):
                own = self._timed(
                    f"update {index}",
                    [p[index] for p in pieces],
                    lambda: update(index, bucket),
                )
                after, sent = self._timed(
                    f"all-gather {index}", own, lambda: self._gather_bucket(own, bucket, index)
                )
            gathered = [a + b for a, b in zip(gathered, sent)]
            writes += after
        return writes, gathered

    def _gather_bucket(self, own, bucket, index):
        """Each local replica's updated piece ``own`` of ``bucket`` all-gathered and written into
        its copy of the bucket's variables: (the writes, the bytes each replica sent)."""
        wholes, sent = self.comm.all_gather(own, index=index)
        sizes = [self.sizes[i] for i in bucket.variables]
        writes = []
        for k, device in enumerate(self.devices):
            with tf.device(device):
                parts = tf.split(wholes[k][: sum(sizes)], sizes)
                for i, part in zip(bucket.variables, parts):
                    variable = self._local(self.variables[i], k)
                    writes.append(variable.assign(tf.reshape(part, variable.shape)))
        return writes, sent
