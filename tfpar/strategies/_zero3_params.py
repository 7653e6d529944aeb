"""ZeRO stage 3's parameters (`tfpar.strategies._zero3`): a trainable variable whose storage is
cut into N pieces, one per replica, each replica holding only its own (FSDP2's per-parameter
sharding: variable i flattened and padded to N pieces of ``ceil(size_i / N)`` elements).

A `ShardedParameter` takes the place of a Keras 3 variable's storage (its ``_value``), so the
variable object, its path, its checkpoint key and the user's references to it stay as they were.
Reading it where a layer computes (a replica's step) all-gathers the whole value from every
replica's piece, and the gradient of that read reduce-scatters the whole value's gradient back to
the pieces (each replica gets its piece of the sum over replicas, as an all-reduce would give it
whole). A gradient tape differentiates to the local replica's piece (its ``handle``), so Keras'
own train step hands the optimizer each replica's piece of the summed gradient. Where no replica
computes (``get_weights``, a checkpoint), it reads the whole value from this process's pieces and
writes each piece its part.

A sparse gradient (an ``Embedding``'s lookup) is summed into the piece's elements before its
reduce-scatter; its sums of squared rows, which Keras 3's Adam and a global norm take
(`tfpar.strategies._sparse`), travel with it and are kept for the update of the same step
(``squares_of``)."""

import weakref

from tfpar._keras import tf
from tfpar.strategies import _sparse as sparse
from tfpar.strategies._zero3_units import unit_inputs

__all__ = ["ShardedParameter"]


class ShardedParameter:
    """One trainable variable's N pieces: this process's replicas' own ``pieces`` (a
    ResourceVariable on each one's device), gathered whole where they are read."""

    _should_act_as_resource_variable = True  # a gradient tape differentiates to ``handle``

    def __init__(self, variable, state, index, pieces):
        """``variable``'s storage cut by ``state`` (the `tfpar.strategies._zero3.ShardedParameters`
        that laid it out as its bucket ``index``) into this process's ``pieces``."""
        self.shape = variable.shape
        self.dtype = tf.as_dtype(variable.dtype)
        self.name = variable.name
        self.trainable = True
        self.size = int(variable.shape.num_elements())
        self.pieces = pieces
        self.piece = int(pieces[0].shape[0])
        self.index = index
        self._state = weakref.ref(state)
        # per traced graph: each read's (sparse or not, its squares' pieces per local replica)
        self._reads = weakref.WeakKeyDictionary()

    def shard_of(self, state):
        """Its pieces now laid out and updated by ``state`` (the same layout: a model compiled
        again)."""
        self._state = weakref.ref(state)

    @property
    def device(self):
        return self.pieces[0].device

    @property
    def handle(self):
        """The local replica's piece, what a tape in a replica's step differentiates to."""
        return self._own().handle

    def _own(self):
        context = tf.distribute.get_replica_context()
        if context is None or tf.distribute.in_cross_replica_context():
            return self.pieces[0]
        replica = tf.get_static_value(context.replica_id_in_sync_group)
        state = self._state()
        return self.pieces[state.local_index(int(replica))]

    def read_value(self):
        return self.value()

    def value(self):
        """The whole value: gathered from every replica in a replica's step (differentiable to the
        local piece; once the inputs of the layer reading it exist, `unit_inputs`), else from this
        process's pieces."""
        context = tf.distribute.get_replica_context()
        if context is None or tf.distribute.in_cross_replica_context():
            return self.whole()
        with tf.control_dependencies(unit_inputs()):  # gathered once its layer's inputs exist
            own = tf.identity(self._own().read_value())
        return _gathered(self, own)

    def whole(self):
        """The whole value from the replicas' pieces, outside a step."""
        state = self._state()
        pieces = [piece.read_value() for piece in self.pieces]
        lengths = [self.piece] * state.comm.size
        flat = state.comm.gather(pieces, lengths, f"tfpar_zero3_read_{self.index}")
        return tf.reshape(flat[: self.size], self.shape)

    def numpy(self):
        return self.whole().numpy()

    def __array__(self, dtype=None, copy=None):
        return self.numpy() if dtype is None else self.numpy().astype(dtype)

    def __tf_tensor__(self, dtype=None, name=None):
        return tf.convert_to_tensor(self.value(), dtype=dtype, name=name)

    def assign(self, value, use_locking=None, name=None, read_value=True):
        """Each local piece takes its part of the whole ``value`` (outside a step)."""
        flat = tf.reshape(tf.cast(value, self.dtype), [-1])
        padded = tf.pad(flat, [[0, self.piece * self._state().comm.size - self.size]])
        owned = self._state().comm.owned
        for piece, j in zip(self.pieces, owned):
            piece.assign(padded[j * self.piece : (j + 1) * self.piece])
        return self if read_value else None

    def _serialize_to_tensors(self):
        return {"VARIABLE_VALUE": self.whole()}

    def _restore_from_tensors(self, restored_tensors):
        self.assign(restored_tensors["VARIABLE_VALUE"])

    def record(self, graph, record):
        """One read's backward in ``graph``: ``(sparse, squares' pieces or None)`` (None: a
        dense gradient, or squares the update does not take)."""
        self._reads.setdefault(graph, []).append(record)

    def squares_of(self, graph):
        """This step's sums of squared sparse rows (per local replica) where every read of it in
        ``graph`` had a sparse gradient, as one device's tape would hand the optimizer an
        ``IndexedSlices``; None where some read's was dense (or none)."""
        records = self._reads.pop(graph, [])
        if not records or any(squares is None for _, squares in records):
            return None
        return [tf.add_n(list(parts)) for parts in zip(*[squares for _, squares in records])]


def _gathered(parameter, piece):
    """``parameter``'s whole value on each replica from their ``piece`` (an all-gather across the
    replicas, in a merge call); its gradient, the whole value's gradient reduce-scattered."""

    @tf.custom_gradient
    def gather(own):
        context = tf.distribute.get_replica_context()
        whole = context.merge_call(_all_gather, args=(parameter, own))

        def grad(dy):
            return tf.distribute.get_replica_context().merge_call(
                _reduce_scatter, args=(parameter, dy)
            )

        return whole, grad

    return gather(piece)


def _all_gather(strategy, parameter, own):
    state = parameter._state()
    pieces = strategy.experimental_local_results(own)
    wholes, sent = state.comm.all_gather(list(pieces), index=state.call_index(parameter))
    state.count_sent(sent)
    outputs = []
    for device, whole in zip(state.devices, wholes):
        with tf.device(device):
            outputs.append(tf.reshape(whole[: parameter.size], parameter.shape))
    return state.per_replica(outputs)


def _reduce_scatter(strategy, parameter, dy):
    """Each local replica's piece of the sum of the replicas' gradients ``dy`` (and, for a sparse
    one, of its sums of squared rows, recorded for the update)."""
    state = parameter._state()
    grads = strategy.experimental_local_results(dy)
    rows = sparse.is_sparse(grads[0])
    padding = parameter.piece * state.comm.size - parameter.size
    flat = []
    squares = []
    for device, g in zip(state.devices, grads):
        with tf.device(device):
            flat.append(tf.pad(tf.reshape(sparse.dense(g, parameter.shape), [-1]), [[0, padding]]))
            if rows and state.takes_squares:
                square = sparse.row_squares(g, parameter.shape)
                squares.append(tf.pad(tf.reshape(square, [-1]), [[0, padding]]))
    pieces, square_pieces, sent = state.reduce_piece(
        flat, squares, parameter, state.call_index(parameter)
    )
    state.count_sent(sent)
    graph = tf.compat.v1.get_default_graph()
    parameter.record(graph, (rows, square_pieces if squares else None))
    return state.per_replica(pieces)
