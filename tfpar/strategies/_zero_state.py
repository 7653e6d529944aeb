"""What a sharded optimizer (`tfpar.strategies._zero`) holds: the model's float32 variables laid
out as one flat vector of buckets (`Bucket`: consecutive whole variables, about `BUCKET_BYTES`
each, as PyTorch DDP buckets its gradients), each bucket padded to N equal pieces; a replica's
chunk is its piece of every bucket (an N-th of the model, balanced by bytes). Each of this
process's replicas keeps its own variables for its chunk, one per bucket (so that a step updates
one bucket at a time): the optimizer slots, the weight-decay mask and, under accumulation, the
gradients' buffer. A slot is also read and written whole, in its variable's shape, for checkpoints
in the unsharded layout (`tfpar.strategies._zero_checkpoint`), and ``state_bytes`` gives
``describe()`` the bytes one replica holds."""

import dataclasses
import math

from tfpar import _compat
from tfpar._keras import tf
from tfpar.strategies import _zero_rules as rules
from tfpar.strategies._windows import accumulator_of
from tfpar.strategies._zero_comms import chunks_for

__all__ = ["BUCKET_BYTES", "Bucket", "ShardedState", "buckets_of", "tf_variable", "window_of"]

BUCKET_BYTES = 25 * 2**20
"""The gradients' bytes a bucket holds at most (a larger variable is a bucket of its own), as
PyTorch DDP's ``bucket_cap_mb=25``: a step exchanges and writes back one bucket at a time, so that
it holds one bucket's flat copy and exchange buffers, not the whole model's."""


@dataclasses.dataclass(frozen=True)
class Bucket:
    """Consecutive whole variables, exchanged together: its place in the flat vector, and each
    replica's piece of it."""

    variables: range
    """The variables' indices."""
    start: int
    """Where it starts in the flat vector (the buckets before it, padded)."""
    size: int
    """Its elements, padded to a multiple of the replicas."""
    piece: int
    """Each replica's elements of it: ``size`` / N."""


def buckets_of(sizes, limit):
    """The variables of ``sizes`` (elements each) as consecutive ranges of at most ``limit``
    elements, a larger variable a range of its own."""
    ranges = []
    first = 0
    filled = 0
    for i, size in enumerate(sizes):
        if i > first and filled + size > limit:
            ranges.append(range(first, i))
            first = i
            filled = 0
        filled += size
    if sizes:
        ranges.append(range(first, len(sizes)))
    return ranges


class ShardedState:
    """What this process's replicas hold of one compiled model's sharded optimizer state."""

    def __init__(self, optimizer, variables, strategy, stage, strategy_accumulates=False):
        """``strategy_accumulates``: the gradients come summed through the strategy, which
        accumulates them itself (under a tf_keras loss-scale optimizer, which reduces them to check
        them)."""
        self.optimizer = optimizer
        self.strategy = strategy
        self.stage = stage
        self.keras_variables = list(variables)
        self.variables = [tf_variable(v) for v in variables]
        self._check_float32()
        self.comm = chunks_for(strategy)
        self.devices = self.comm.devices  # this process's replicas
        self._lay_out(self.comm.size)
        self.name = type(optimizer).__name__
        if self.name == "SGD":
            self.slot_names = ["momentum"] if optimizer.momentum else []
        else:  # Adam, AdamW
            self.slot_names = ["m", "v"] + (["v_hat"] if optimizer.amsgrad else [])
        mask = self._decay_mask(variables)
        self.window = window_of(strategy)
        self.strategy_accumulates = strategy_accumulates
        self._make_replica_variables(mask)

    def _check_float32(self):
        """Refuses a variable that is not float32, the chunks' dtype."""
        for v in self.variables:
            if tf.as_dtype(v.dtype) != tf.float32:
                raise TypeError(
                    f"zero_stage={self.stage} shards float32 variables; {v.name} is "
                    f"{tf.as_dtype(v.dtype).name}. Keep the variables float32 (a mixed policy "
                    "does), or use zero_stage=0."
                )

    def _lay_out(self, n):
        """The variables' places in one flat vector of buckets, each cut into ``n`` (all the
        replicas) equal pieces."""
        self.sizes = [int(v.shape.num_elements()) for v in self.variables]
        self.total = sum(self.sizes)
        self.offsets = [0] * len(self.sizes)
        self.buckets = []
        self.bucket_of = [0] * len(self.sizes)
        start = 0
        for variables in buckets_of(self.sizes, self._bucket_elements()):
            filled = 0
            for i in variables:
                self.offsets[i] = start + filled
                self.bucket_of[i] = len(self.buckets)
                filled += self.sizes[i]
            piece = math.ceil(filled / n)
            self.buckets.append(Bucket(variables, start, piece * n, piece))
            start += piece * n
        self.chunk = sum(bucket.piece for bucket in self.buckets)
        self.padding = self.chunk * n - self.total

    def _bucket_elements(self):
        """The elements a bucket holds at most (`BUCKET_BYTES`, read when the state is laid
        out)."""
        return BUCKET_BYTES // 4

    def _decay_mask(self, variables):
        """The flat weight decay, 1 where a variable decays and 0 where not, where only some
        variables decay; else None, and ``decay_all`` says whether all do."""
        decayed = [
            1.0
            if rules.weight_decay(self.optimizer) and self.optimizer._use_weight_decay(v)
            else 0.0
            for v in variables
        ]
        self.decay_all = bool(decayed) and min(decayed) == 1.0
        with tf.init_scope():  # some variables excluded from the decay: a mask (else a number)
            return (
                self._flat([tf.fill([size], d) for size, d in zip(self.sizes, decayed)])
                if 0.0 < sum(decayed) < len(decayed)
                else None
            )

    def _make_replica_variables(self, mask):
        """Each local replica's own variables, one per bucket (its piece of it): its accumulation
        buffer (where the strategy does not accumulate), its slots, and its decay ``mask``."""
        # each local replica's slots and its weight decay (1) or not (0), per bucket
        self.slots = []
        self.decay_masks = [None] * len(self.devices)
        # with accumulation, per bucket: stage 1 each replica's gradients, 2 its piece
        self.accumulated = []
        self.counter = None
        for k, (j, device) in enumerate(zip(self.comm.owned, self.devices)):
            if self.window > 1 and not self.strategy_accumulates:
                self._make_buffer(j, device)
            with tf.init_scope(), tf.device(device):  # this replica's own: never mirrored
                self.slots.append(
                    [
                        {
                            s: _compat.ResourceVariable(
                                tf.zeros([bucket.piece]),
                                trainable=False,
                                name=f"tfpar_zero_{s}_{j}_{b}",
                            )
                            for s in self.slot_names
                        }
                        for b, bucket in enumerate(self.buckets)
                    ]
                )
                if mask is not None:
                    self.decay_masks[k] = [
                        _compat.ResourceVariable(
                            mask[bucket.start + j * bucket.piece :][: bucket.piece],
                            trainable=False,
                            name=f"tfpar_zero_decay_{j}_{b}",
                        )
                        for b, bucket in enumerate(self.buckets)
                    ]

    def _make_buffer(self, j, device):
        """Replica ``j``'s accumulation buffers on ``device``, one per bucket (and the step
        counter, once)."""
        with tf.init_scope(), tf.device(device):
            self.accumulated.append(
                [
                    _compat.ResourceVariable(
                        tf.zeros([bucket.size if self.stage == 1 else bucket.piece]),
                        trainable=False,
                        name=f"tfpar_zero_sum_{j}_{b}",
                    )
                    for b, bucket in enumerate(self.buckets)
                ]
            )
            if self.counter is None:
                self.counter = _compat.ResourceVariable(
                    tf.constant(0, tf.int64),
                    trainable=False,
                    name="tfpar_zero_accumulated_steps",
                )

    def _local(self, value, k):
        return self.strategy.experimental_local_results(value)[k]

    def _flat(self, tensors):
        """``tensors`` (one per variable, in order) as the whole flat vector, each bucket padded."""
        return tf.concat(
            [
                self.bucket_flat([tensors[i] for i in bucket.variables], bucket)
                for bucket in self.buckets
            ],
            0,
        )

    def bucket_flat(self, tensors, bucket):
        """``bucket``'s part of `_flat` from ``tensors`` (one per variable of the bucket, in order):
        one concatenation, its padding zeros."""
        sizes = [self.sizes[i] for i in bucket.variables]
        parts = [tf.reshape(t, [size]) for t, size in zip(tensors, sizes)]
        return tf.concat([*parts, tf.zeros([bucket.size - sum(sizes)])], 0)

    def own_piece(self, k, bucket):
        """Local replica ``k``'s piece of ``bucket`` of its flat weights, made of the variables it
        overlaps only (`_pieces`; the bucket's padding zeros)."""
        parts = [
            tf.reshape(self._local(self.variables[i], k), [-1])[whole]
            for i in bucket.variables
            for replica, _, whole in self._pieces(i)
            if replica == k
        ]
        filled = sum(int(part.shape[0]) for part in parts)
        return tf.concat([*parts, tf.zeros([bucket.piece - filled])], 0)

    def slot_variables(self) -> list:
        """Every local replica's slot variables: one per bucket and slot."""
        return [v for buckets in self.slots for state in buckets for v in state.values()]

    def plain_slots(self) -> list:
        """``[(slot, variable index)]`` in the order the optimizer itself would list its slots (both
        Kerases: each variable's slots in turn, then AMSGrad's maxima), so that a checkpoint written
        sharded reads as the unsharded optimizer's, and the other way round."""
        main = [name for name in self.slot_names if name != "v_hat"]
        order = [(name, i) for i in range(len(self.variables)) for name in main]
        return order + [
            ("v_hat", i) for i in range(len(self.variables)) if "v_hat" in self.slot_names
        ]

    def _pieces(self, i):
        """``(local replica, slice of its piece of the bucket, whole-slot slice)`` of this
        process's pieces holding variable ``i``'s elements."""
        start = self.offsets[i]
        for k, j in enumerate(self.comm.owned):
            lo, hi, first = self._overlap(i, j)
            if lo < hi:
                yield k, slice(lo - first, hi - first), slice(lo - start, hi - start)

    def _overlap(self, i, j):
        """``(lo, hi, first)``: where variable ``i`` and replica ``j``'s piece of its bucket overlap
        in the flat vector (``lo >= hi``: not at all), and where that piece starts."""
        bucket = self.buckets[self.bucket_of[i]]
        first = bucket.start + j * bucket.piece
        lo = max(self.offsets[i], first)
        hi = min(self.offsets[i] + self.sizes[i], first + bucket.piece)
        return lo, hi, first

    def whole_slot(self, name, i):
        """Slot ``name`` of variable ``i``, whole, in the variable's shape (gathered from every
        replica's chunks: a collective under Horovod, which every rank runs)."""
        b = self.bucket_of[i]
        mine = {k: self.slots[k][b][name][part] for k, part, _ in self._pieces(i)}
        spans = [self._overlap(i, j) for j in range(self.comm.size)]
        lengths = [max(0, hi - lo) for lo, hi, _ in spans]
        parts = [mine.get(k, tf.zeros([0])) for k in range(len(self.devices))]
        whole = self.comm.gather(parts, lengths, f"tfpar_zero_checkpoint_{name}_{i}")
        return tf.reshape(whole, self.variables[i].shape)

    def set_whole_slot(self, name, i, value):
        """Sets slot ``name`` of variable ``i`` from its whole value (each local chunk takes its
        part)."""
        flat = tf.reshape(tf.cast(value, tf.float32), [-1])
        b = self.bucket_of[i]
        return tf.group(
            [self.slots[k][b][name][mine].assign(flat[whole]) for k, mine, whole in self._pieces(i)]
        )

    def state_bytes(self) -> dict:
        """``{what: (bytes unsharded, bytes sharded)}`` one replica holds: weights, reduced
        gradients (accumulated whole at stage 1), optimizer state (its slots; a chunk is padded to a
        whole N-th)."""
        full = 4 * self.total
        slots = len(self.slot_names)
        # a whole buffer accumulates
        whole = self.window > 1 and (self.stage == 1 or self.strategy_accumulates)
        gradients = full if whole else 4 * self.chunk
        return {
            "weights": (full, full),
            "gradients": (full, gradients),
            "optimizer state": (slots * full, slots * 4 * self.chunk),
        }


def tf_variable(variable):
    """The tf.Variable of a variable of either Keras (Keras 3 wraps one; ZeRO stage 3's
    parameters stand for themselves)."""
    if isinstance(variable, tf.Variable) or getattr(variable, "_tfpar_sharded", False):
        return variable
    return variable.value


def window_of(strategy):
    """The optimizer calls a strategy accumulates gradients over, or 1: its `GradientAccumulator`'s
    window (DataParallel's and Horovod's option, times an elastic job's micro-batches)."""
    accumulator = accumulator_of(strategy)
    return accumulator.steps if accumulator is not None else 1
