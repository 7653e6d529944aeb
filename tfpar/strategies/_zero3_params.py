"""ZeRO stage 3's parameters (`tfpar.strategies._zero3`): a trainable variable whose storage is
cut into N pieces, one per replica, each replica holding only its own (FSDP2's per-parameter
sharding: variable i flattened and padded to N pieces of ``ceil(size_i / N)`` elements).

A `ShardedParameter` takes the place of a Keras 3 variable's storage (its ``_value``), so the
variable object, its path, its checkpoint key and the user's references to it stay as they were;
under tf_keras it takes the weight's place in its layer (`tfpar._compat.tf_keras_replace_weight`),
with the weight's name and checkpoint key.
Reading it where a layer computes (a replica's step) all-gathers the whole value from every
replica's piece, and the gradient of that read reduce-scatters the whole value's gradient back to
the pieces (each replica gets its piece of the sum over replicas, as an all-reduce would give it
whole). A gradient tape differentiates to the local replica's piece (its ``handle``), so Keras'
own train step hands the optimizer each replica's piece of the summed gradient. Where no replica
computes (``get_weights``, a checkpoint), it reads the whole value from this process's pieces and
writes each piece its part.

A sparse gradient (an ``Embedding``'s lookup) travels as its rows where they weigh less than a
piece of the table (a batch's tokens against a vocabulary): every replica's rows and their
indices are all-gathered (in float32) and each replica sums those that fall in its piece; else it
is summed into the table's elements and reduce-scattered. Its sums of squared rows, which Keras
3's Adam and a global norm take (`tfpar.strategies._sparse`), come from the same gathered rows,
or are reduce-scattered after the table (one table's buffers at a time); they are kept for the
update of the same step (``squares_of``)."""

import itertools
import weakref

from tfpar import _compat
from tfpar._keras import tf
from tfpar.strategies import _sparse as sparse
from tfpar.strategies._zero3_units import unit_call

__all__ = ["ShardedParameter", "in_graph"]

_SERIALS = itertools.count()
"""A number per parameter made in this process, in its collectives' names: the same on every
rank (each makes them in one order), and never one another parameter's (a model compiled again
keeps the parameters an earlier compile made)."""


class ShardedParameter(_compat.Trackable):
    """One trainable variable's N pieces: this process's replicas' own ``pieces`` (a
    ResourceVariable on each one's device), gathered whole where they are read; a trackable that
    TF-format checkpoints write whole."""

    _should_act_as_resource_variable = True  # a gradient tape differentiates to ``handle``
    _tfpar_sharded = True  # `tfpar.strategies._zero_state.tf_variable`

    def __init__(self, variable, state, index, pieces, path):
        """``variable``'s storage cut by ``state`` (the `tfpar.strategies._zero3.ShardedParameters`
        that laid it out as its bucket ``index``) into this process's ``pieces``; ``path``: the
        Keras variable's, which the Timeline's events name."""
        self.shape = variable.shape
        self.dtype = tf.as_dtype(variable.dtype)
        self.name = variable.name
        # a checkpoint's name-based key (TensorFlow reads it from anything that acts as a variable)
        self._shared_name = getattr(variable, "_shared_name", variable.name.split(":")[0])
        self._distribute_strategy = state.strategy  # tf_keras' fit checks where it was made
        # tf_keras' optimizers key a variable by it (weight decay's exclusions among them)
        self._unique_id = getattr(variable, "_unique_id", f"tfpar_zero3_{id(self)}")
        self.trainable = True
        self.size = int(variable.shape.num_elements())
        self.pieces = pieces
        self.piece = int(pieces[0].shape[0])
        self.padding = self.piece * state.comm.size - self.size  # zeros after its last element
        self.index = index
        self.serial = next(_SERIALS)
        self.path = path
        self._owner = state  # a frozen parameter keeps the state that sharded it
        # per traced graph: each read's (sparse or not, its squares' pieces per local replica)
        self._reads = weakref.WeakKeyDictionary()

    def shard_of(self, state, index):
        """Its pieces now laid out and updated by ``state`` as its bucket ``index`` (the same
        pieces: a model compiled again)."""
        self._owner = state
        self.index = index

    def _state(self):
        return self._owner

    @property
    def device(self):
        return self.pieces[0].device

    @property
    def handle(self):
        """The local replica's piece, what a tape in a replica's step differentiates to."""
        return self._own().handle

    def _in_step(self):
        """Whether a replica of the strategy that shards it runs here (a step, ``predict``): not
        outside its scope, where TensorFlow's default strategy's replica context is current."""
        if tf.distribute.in_cross_replica_context():
            return False
        return tf.distribute.get_strategy() is self._state().strategy

    def _own(self):
        if not self._in_step():
            return self.pieces[0]
        context = tf.distribute.get_replica_context()
        replica = tf.get_static_value(context.replica_id_in_sync_group)
        return self.pieces[self._state().local_index(int(replica))]

    def read_value(self):
        return self.value()

    def value(self):
        """The whole value: gathered from every replica in a replica's step (differentiable to the
        local piece; once the inputs of the layer reading it exist, once per call of that layer:
        `unit_call`), else from this process's pieces."""
        if not self._in_step():
            return self.whole()
        call = unit_call()
        if call is not None and id(self) in call.gathered:
            return call.gathered[id(self)]
        # gathered once the inputs of the layer reading it exist
        with tf.control_dependencies(call.inputs if call is not None else []):
            own = tf.identity(self._own().read_value())
        whole = _gathered(self, own)
        if call is not None:
            call.gathered[id(self)] = whole
        return whole

    def whole(self):
        """The whole value from the replicas' pieces, outside a step."""
        state = self._state()
        pieces = [piece.read_value() for piece in self.pieces]
        lengths = [self.piece] * state.comm.size
        flat = state.comm.gather(pieces, lengths, f"tfpar_zero3_read_{self.serial}")
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
        padded = tf.pad(flat, [[0, self.padding]])
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
        records = in_graph(self._reads, graph) or []
        if not records or any(squares is None for _, squares in records):
            return None
        return [tf.add_n(list(parts)) for parts in zip(*[squares for _, squares in records])]


def in_graph(table, graph):
    """What ``table`` (per traced graph) held for ``graph``, or for the graph it is nested in (a
    branch of a ``tf.cond``: Keras 3's loss scale applies the update in one, after the backward
    pass recorded in the step's graph), taken out of it; None where it holds none."""
    while graph is not None:
        if graph in table:
            return table.pop(graph)
        graph = getattr(graph, "outer_graph", None)
    return None


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
    index = state.call_index(parameter)
    wholes, sent = state.timed(
        f"all-gather {parameter.path}",
        pieces,
        lambda: state.comm.all_gather(list(pieces), index=index),
    )
    state.count_sent(sent)
    outputs = []
    for device, whole in zip(state.devices, wholes):
        with tf.device(device):
            whole = whole if parameter.padding == 0 else whole[: parameter.size]
            outputs.append(tf.reshape(whole, parameter.shape))
    return state.per_replica(outputs)


def _reduce_scatter(strategy, parameter, dy):
    """Each local replica's piece of the sum of the replicas' gradients ``dy``; for a sparse one
    whose squared rows the update takes, then (once the gradients' buffers are freed) the pieces
    of its sums of squared rows too, recorded for the update."""
    state = parameter._state()
    grads = strategy.experimental_local_results(dy)
    if sparse.is_sparse(grads[0]):
        state.refuse_clipping_rows()
    if _rows_travel(parameter, grads):
        pieces, squares = _from_rows(parameter, grads)
        parameter.record(tf.compat.v1.get_default_graph(), (squares is not None, squares))
        return state.per_replica(pieces)
    pieces = _reduced(parameter, grads, sparse.dense)
    squares = None
    if sparse.is_sparse(grads[0]) and state.takes_squares:
        with tf.control_dependencies(pieces):
            squares = _reduced(parameter, grads, sparse.row_squares, state.squares_in_float32)
    parameter.record(tf.compat.v1.get_default_graph(), (squares is not None, squares))
    return state.per_replica(pieces)


def _reduced(parameter, grads, of, full=False):
    """Each local replica's piece of the sum over the replicas of ``of`` their gradients ``grads``
    (flat and padded: one reduce-scatter; ``full``: in float32 whatever the compression)."""
    state = parameter._state()
    flat = []
    for device, g in zip(state.devices, grads):
        with tf.device(device):
            values = tf.reshape(of(g, parameter.shape), [-1])
            flat.append(
                values if parameter.padding == 0 else tf.pad(values, [[0, parameter.padding]])
            )
    index = state.call_index(parameter)
    pieces, sent = state.timed(
        f"reduce-scatter {parameter.path}",
        flat,
        lambda: state.comm.reduce_scatter(flat, parameter.piece, False, full=full, index=index),
    )
    state.count_sent(sent)
    return pieces


def _rows_travel(parameter, grads):
    """Whether a sparse gradient's rows (values and indices) are gathered rather than its table
    reduce-scattered: fewer bytes (each replica's rows against its piece of the table), rows of
    a size known when traced (every replica's the same), row indices a float32 holds exactly."""
    if not all(sparse.is_sparse(g) and g.values.shape.is_fully_defined() for g in grads):
        return False
    rows = int(parameter.shape[0])
    width = parameter.size // rows
    looked_up = int(grads[0].values.shape[0])
    return rows < 2**24 and looked_up * (width + 1) < parameter.piece


def _from_rows(parameter, grads):
    """Each local replica's piece of the replicas' summed sparse gradients, and of their sums of
    squared rows where the update takes them (else None), from every replica's rows gathered:
    each replica sums the rows that fall in its piece."""
    state = parameter._state()
    width = parameter.size // int(parameter.shape[0])
    rows = []
    for device, g in zip(state.devices, grads):
        with tf.device(device):
            values = tf.reshape(tf.cast(g.values, tf.float32), [-1, width])
            indices = tf.cast(tf.reshape(g.indices, [-1, 1]), tf.float32)  # exact below 2**24
            rows.append(tf.reshape(tf.concat([values, indices], 1), [-1]))
    index = state.call_index(parameter)
    gathered, sent = state.timed(
        f"all-gather rows {parameter.path}",
        rows,
        lambda: state.comm.all_gather(rows, index=index),
    )
    state.count_sent(sent)
    pieces = []
    squares = []
    for device, every, j in zip(state.devices, gathered, state.comm.owned):
        with tf.device(device):
            table = tf.reshape(every, [-1, width + 1])
            ids = tf.cast(table[:, -1], tf.int32)
            values = table[:, :-1] * state.comm.gradient_scale
            pieces.append(_piece_of_rows(parameter, ids, values, j))
            if state.takes_squares:
                squares.append(_piece_of_rows(parameter, ids, tf.square(values), j))
    return pieces, squares or None


def _piece_of_rows(parameter, ids, values, j):
    """Piece ``j`` of the flat table that the rows ``values`` at row ``ids`` sum to (duplicates
    summed; the rows outside the piece left out)."""
    width = parameter.size // int(parameter.shape[0])
    start = j * parameter.piece
    first = start // width
    last = min(int(parameter.shape[0]), -(-(start + parameter.piece) // width))
    if last <= first:  # the piece holds padding only
        return tf.zeros([parameter.piece])
    inside = tf.logical_and(ids >= first, ids < last)
    block = tf.math.unsorted_segment_sum(
        tf.boolean_mask(values, inside), tf.boolean_mask(ids - first, inside), last - first
    )
    flat = tf.reshape(block, [-1])[start - first * width :][: parameter.piece]
    short = parameter.piece - ((last - first) * width - (start - first * width))
    return flat if short <= 0 else tf.pad(flat, [[0, short]])
