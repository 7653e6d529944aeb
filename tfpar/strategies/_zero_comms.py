"""ZeRO's collectives (`tfpar.strategies._zero`), one class per engine, each with the same four
methods over this process's replicas (lists, one entry per local replica):

- ``reduce_scatter(flat, c, summed, full=False, index=0)``: each replica's flat gradients of one
  bucket (N pieces of ``c``) -> piece j of their sum on the replica that owns it, and the bytes
  each sent (``full``: in float32 whatever the compression; ``index``: the bucket's, which names
  the collective where an engine names them);
- ``all_gather(updated, index=0)``: the updated pieces of one bucket -> every piece, in order, on
  each replica;
- ``total(values)``: the sum over all replicas of one value each;
- ``gather(pieces, lengths, name)``: every replica's piece (of ``lengths[j]`` elements for replica
  j, none included), in replica order: a whole optimizer slot for a checkpoint;

and ``gradient_scale``, the factor of a sum the engine's reduce-scatter applies to gradients (a
sum made otherwise, of gathered rows, applies it too).

`OneHostChunks`: the replicas are this process's devices (`DataParallel` on one host).
`CollectiveChunks`: TensorFlow's collectives across workers (`DataParallel` under ``tfpar launch``).
Horovod's ranks: `tfpar.strategies._horovod_ops.HorovodChunks`.
"""

import itertools

from tfpar import _compat
from tfpar._keras import tf
from tfpar.strategies._horovod_ops import HorovodChunks
from tfpar.strategies._sparse import WIRE_DTYPES

__all__ = ["GROUP_KEY", "CollectiveChunks", "OneHostChunks", "chunks_for"]

GROUP_KEY = 0x7F5B
"""ZeRO's collective group across workers: apart from the groups TensorFlow's strategies number
from 1 and from the pipeline's workers (`tfpar.pipeline.workers.GROUP_KEY`)."""

_KEYS = itertools.count(1)
"""The group's instance keys, one per collective built in this process (a key names one collective
for the process's life): the same on every worker, which build the same ops in the same order."""


def chunks_for(strategy):
    """The collectives of ``strategy``'s engine: Horovod's ranks, TensorFlow's workers, or one
    host's devices."""
    ops = getattr(strategy.extended, "_horovod_ops", None)
    if ops is not None:
        return HorovodChunks(ops, strategy.extended.worker_devices[0])
    config = getattr(strategy, "config", None)
    compression = getattr(config, "compression", "none")
    if getattr(config, "multi_worker", False):
        return CollectiveChunks(
            strategy, config.cluster.worker_index, compression, config.timeout_seconds
        )
    return OneHostChunks(strategy.extended.worker_devices, compression)


class OneHostChunks:
    """The replicas are this process's devices: chunk j of the sum is made on device j from the
    others' chunk j (cast to the wire's dtype where it is sent from, summed in float32), and each
    device concatenates the updated chunks."""

    gradient_scale = 1.0  # the gradients come scaled for a sum over the replicas

    def __init__(self, devices, compression="none"):
        self.devices = list(devices)
        self.size, self.owned = len(self.devices), list(range(len(self.devices)))
        self.wire = WIRE_DTYPES.get(compression)

    def reduce_scatter(self, flat, c, summed, full=False, index=0):
        chunks, sent = [], [0] * self.size
        wire = None if full else self.wire
        for j, device in enumerate(self.devices):
            parts = []
            for k in range(self.size) if not summed else [j]:
                with tf.device(self.devices[k]):
                    part = flat[k][j * c : (j + 1) * c]
                    parts.append(tf.cast(part, wire) if wire is not None and k != j else part)
                sent[k] += 0 if k == j else parts[-1].dtype.size * parts[-1].shape.num_elements()
            with tf.device(device):
                chunks.append(tf.add_n([tf.cast(part, tf.float32) for part in parts]))
        return chunks, sent

    def all_gather(self, updated, index=0):
        wholes = []
        for device in self.devices:
            with tf.device(device):
                wholes.append(tf.concat(updated, 0))
        return wholes, [4 * u.shape.num_elements() * (self.size - 1) for u in updated]

    def total(self, values):
        return tf.add_n(values)

    def gather(self, pieces, lengths, name):
        return tf.concat(pieces, 0)


class CollectiveChunks:
    """The replicas span workers (MultiWorkerMirroredStrategy): TensorFlow's collective ops in a
    group of every replica, ranked as the strategy ranks its replicas (worker, then local device).

    The reduce-scatter is an all-to-all (TensorFlow has no reduce-scatter kernel for CPUs): each
    replica sends chunk j of its flat gradients to replica j (in the wire's dtype with compression),
    which sums the N chunks in float32; each replica sends (N-1)/N of the gradients' bytes, as a
    ring reduce-scatter does. The updated chunks come back by an all-gather. The collectives of a
    step are chained, so that every worker runs them in the same order."""

    gradient_scale = 1.0  # the gradients come scaled for a sum over the replicas

    def __init__(self, strategy, worker_index, compression="none", timeout=None):
        self.devices = list(strategy.extended.worker_devices)
        self.size = strategy.num_replicas_in_sync
        self.owned = [worker_index * len(self.devices) + k for k in range(len(self.devices))]
        self.wire = WIRE_DTYPES.get(compression)
        self.timeout = timeout or 0
        self._previous: tuple = (None, [])  # the last collective's graph and outputs

    def _each(self, op, values):
        """``op`` of each local replica's value, as one collective of the group (one instance
        key)."""
        key, out = next(_KEYS), []
        graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
        with tf.control_dependencies(
            self._previous[1] if self._previous[0] is graph and graph else []
        ):
            for device, value in zip(self.devices, values):
                with tf.device(device):
                    out.append(
                        op(
                            value,
                            group_size=self.size,
                            group_key=GROUP_KEY,
                            instance_key=key,
                            timeout=self.timeout,
                        )
                    )
        self._previous = (graph, out)
        return out

    def reduce_scatter(self, flat, c, summed, full=False, index=0):
        if summed:
            return [f[j * c : (j + 1) * c] for f, j in zip(flat, self.owned)], [0] * len(flat)
        wire = tf.float32 if full or self.wire is None else self.wire
        got = self._each(
            _compat.collective_all_to_all,
            [tf.reshape(tf.cast(f, wire), [self.size, c]) for f in flat],
        )
        chunks = []
        for device, received in zip(self.devices, got):
            with tf.device(device):
                chunks.append(tf.reduce_sum(tf.cast(received, tf.float32), 0))
        return chunks, [wire.size * c * (self.size - 1)] * len(flat)

    def all_gather(self, updated, index=0):
        wholes = self._each(_compat.collective_all_gather, updated)
        return wholes, [4 * u.shape.num_elements() * (self.size - 1) for u in updated]

    def total(self, values):
        return self._each(_compat.collective_all_reduce, values)[0]

    def gather(self, pieces, lengths, name):
        """Each piece padded to the longest, all-gathered, and cut back (in a function of its own
        when called eagerly, as at a checkpoint, so that this worker's replicas join the collective
        together)."""
        longest = max(lengths)

        def gathered():
            padded = [tf.pad(p, [[0, longest - p.shape[0]]]) for p in pieces]
            whole = self._each(_compat.collective_all_gather, padded)[0]
            return tf.concat(
                [whole[j * longest : j * longest + n] for j, n in enumerate(lengths)], 0
            )

        return tf.function(gathered)() if tf.executing_eagerly() else gathered()
