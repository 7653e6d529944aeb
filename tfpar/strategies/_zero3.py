"""ZeRO stage 3 (fully sharded data parallelism: PyTorch FSDP's ``fully_shard``): the
``zero_stage=3`` of `DataParallel` (one host or several workers) and `HorovodStrategy`, both
Kerases.

Each of the N replicas holds 1/N of every trainable variable (`tfpar.strategies._zero3_params`:
a Keras 3 variable's storage, or a tf_keras weight wherever its layer holds it, replaced by a
`ShardedParameter`), of its gradient and of its optimizer state. A layer's call reads each of its
variables whole, all-gathered from the replicas' pieces once the layer's inputs exist
(`tfpar.strategies._zero3_units`, which also recomputes the larger layers in the backward); the
read's gradient is the whole gradient reduce-scattered, so each replica's piece of the gradients'
sum reaches the Keras train step's optimizer call, and the replica updates its piece with its own
slots by the optimizer's rule (stage 2's `ShardedOptimizer`, with each variable a bucket of its
own and no exchange left in the update). Checkpoints and ``get_weights`` hold the whole, unsharded
values."""

import gc
import weakref

from tfpar import _compat
from tfpar._keras import inner_optimizer, is_keras3, tf
from tfpar.strategies import _sparse as sparse
from tfpar.strategies._zero import (
    ShardedOptimizer,
    install_sharded,
    optimizer_to_shard,
    zero_stage_of,
)
from tfpar.strategies._zero3_params import ShardedParameter, in_graph
from tfpar.strategies._zero3_units import gathering, units_of

__all__ = ["ShardedParameters", "shard_parameters"]


class ShardedParameters(ShardedOptimizer):
    """The sharded parameters of one compiled model, and their update (`ShardedOptimizer`'s, each
    variable a bucket of its own whose pieces are the parameter's)."""

    def __init__(self, optimizer, variables, strategy, loss_scale=None):
        """``loss_scale``: where a Keras 3 LossScaleOptimizer wraps ``optimizer``, its current
        scale (the backward's squared rows carry its square; the update's gradients do not)."""
        super().__init__(optimizer, variables, strategy, 3)
        self.loss_scale = loss_scale
        self._graph_sent = weakref.WeakKeyDictionary()  # per traced graph: bytes per replica
        self._step_squares: list = []
        self._calls = weakref.WeakKeyDictionary()  # per traced graph: collectives per parameter
        # per traced graph: its collectives' events
        self._graph_events = weakref.WeakKeyDictionary()
        self.variables = [
            self._shard(keras_variable, i) for i, keras_variable in enumerate(variables)
        ]
        # the model's variables hold them now (`_install`); tf_keras' are the parameters
        self.keras_variables = [
            v if is_keras3(v) else p for v, p in zip(self.keras_variables, self.variables)
        ]
        self.takes_squares = bool(
            (self.moment_squares or getattr(optimizer, "global_clipnorm", None))
            and self.window == 1
        )

    def release(self):
        """Drops its optimizer state (a later compile's state updates the parameters now; the
        ones it keeps, a frozen layer's, only read through it)."""
        self.slots = []
        self.decay_masks = [None] * len(self.devices)
        self.accumulated = []

    def _bucket_elements(self):
        return 1  # a bucket per variable: a parameter's pieces

    def _shard(self, keras_variable, i):
        """Variable ``i`` cut into its pieces on this process's replicas (kept, where an earlier
        compile sharded it: KerasHub's tasks compile twice)."""
        bucket = self.buckets[i]
        whole = self.variables[i]
        if isinstance(whole, ShardedParameter):
            whole.shard_of(self, i)
            return whole
        pieces = []
        for k, (j, device) in enumerate(zip(self.comm.owned, self.devices)):
            flat = tf.reshape(self._local(whole, k), [-1])
            padded = tf.pad(flat, [[0, bucket.size - self.sizes[i]]])
            with tf.init_scope(), tf.device(device):  # this replica's own: never mirrored
                pieces.append(
                    _compat.ResourceVariable(
                        padded[j * bucket.piece : (j + 1) * bucket.piece],
                        name=f"tfpar_zero3_{j}_{i}",
                    )
                )
        path = getattr(keras_variable, "path", whole.name)  # Keras 3's, or tf_keras' name
        return ShardedParameter(whole, self, i, pieces, path)

    def local_index(self, replica):
        """The place among this process's replicas of the replica numbered ``replica`` (a Horovod
        rank's one replica numbers itself 0)."""
        return 0 if len(self.devices) == 1 else self.comm.owned.index(replica)

    def per_replica(self, values):
        """One value per local replica, as a merge call hands them back to the replicas."""
        return _compat.PerReplica(tuple(values))

    def timed(self, label, inputs, compute):
        """``compute()`` of a collective in a forward or backward pass, timed as event ``label``
        of the step being traced (`_step_events` hands them to its update)."""
        graph = tf.compat.v1.get_default_graph()
        return self._timed(label, inputs, compute, self._graph_events.setdefault(graph, []))

    def _step_events(self):
        return in_graph(self._graph_events, tf.compat.v1.get_default_graph()) or []

    def count_sent(self, sent):
        """Bytes a traced collective sends from each local replica, counted for the step being
        traced."""
        graph = tf.compat.v1.get_default_graph()
        counted = self._graph_sent.get(graph, [0] * len(self.devices))
        self._graph_sent[graph] = [a + b for a, b in zip(counted, sent)]

    def call_index(self, parameter):
        """The name of one collective of ``parameter`` in the graph being traced (its serial, and
        how many of its collectives the graph holds before it): the same on every rank, which
        traces the same calls in the same order (Horovod names each collective of a step)."""
        graph = tf.compat.v1.get_default_graph()
        calls = self._calls.setdefault(graph, {})
        calls[parameter.serial] = calls.get(parameter.serial, 0) + 1
        return f"{parameter.serial}_{calls[parameter.serial]}"

    def _squared_rows(self, grads):
        """Whether this step's update takes sums of squared sparse rows: those the backward's
        reduce-scatters kept (`ShardedParameter.squares_of`)."""
        graph = tf.compat.v1.get_default_graph()
        held = [parameter.squares_of(graph) for parameter in self.variables]
        if self.loss_scale is not None:
            scale = tf.square(tf.cast(self.loss_scale(), tf.float32))
            held = [None if s is None else [q / scale for q in s] for s in held]
        self._step_squares = held
        return self.takes_squares and any(s is not None for s in self._step_squares)

    def _squares_of(self, grads):
        def squares(bucket, k):
            held = self._step_squares[bucket.variables[0]]
            return None if held is None else held[k]

        return squares

    def _bucket_gradients(self, grads, bucket, k, of=None):
        """Local replica ``k``'s piece of the variable's summed gradient (the backward reduced
        it)."""
        g = grads[bucket.variables[0]]
        return tf.zeros([bucket.piece]) if g is None else self._local(g, k)

    def _reduce_bucket(self, flat_of, squares_of, bucket, index, summed):
        """No exchange: the backward's reduce-scatter gave each replica its piece."""
        reduced = [flat_of(bucket, k) for k in range(len(self.devices))]
        if squares_of is None:
            return reduced, [], [0] * len(self.devices)
        squares = []
        for k, r in enumerate(reduced):
            held = squares_of(bucket, k)
            squares.append(sparse.row_squares(r, r.shape) if held is None else held)
        return reduced, squares, [0] * len(self.devices)

    def own_piece(self, k, bucket):
        return self.variables[bucket.variables[0]].pieces[k].read_value()

    def _write_back(self, pieces, update):
        """Each parameter's pieces updated in turn (a bucket each): nothing to gather."""
        writes = []
        after = []
        for index, bucket in enumerate(self.buckets):
            with tf.control_dependencies(after):
                own = self._timed(
                    f"update {index}", [p[index] for p in pieces], lambda: update(index, bucket)
                )
                parameter = self.variables[bucket.variables[0]]
                after = [piece.assign(o) for piece, o in zip(parameter.pieces, own)]
            writes += after
        return writes, [0] * len(self.devices)

    def _apply(self, pieces, sent, squares=None):
        writes = super()._apply(pieces, sent, squares)
        # the step's gathers and reduce-scatters, counted as they were traced
        sent = in_graph(self._graph_sent, tf.compat.v1.get_default_graph())
        self.sent_bytes = sent or [0] * len(self.devices)
        return writes

    def state_bytes(self) -> dict:
        held = super().state_bytes()
        full = held["weights"][0]
        return {**held, "weights": (full, 4 * self.chunk)}


def shard_parameters(model, arguments=None):
    """After ``compile`` of a model of a `DataParallel` with ``zero_stage=3``: its trainable
    variables sharded (`ShardedParameters`), their update by the optimizer's rule on each piece.
    A model with nothing to train (every layer frozen) keeps what an earlier compile sharded.

    Raises:
        ValueError: a model or optimizer stage 3 cannot shard, with the reason and the fix.
    """
    if zero_stage_of(model.distribute_strategy) != 3 or getattr(model, "optimizer", None) is None:
        return
    _refuse(model)
    if not model.trainable_variables:
        return
    outer, optimizer = optimizer_to_shard(model, stages=(3,))
    if not is_keras3(optimizer):  # no whole slot (tf_keras' BackupAndRestore would build them)
        _compat.tf_keras_mark_optimizer_built(optimizer)
    variables = list(model.trainable_variables)
    scale = None if outer is optimizer else (lambda: outer.dynamic_scale)
    superseded = getattr(model, "_tfpar_zero", None)
    sharded = ShardedParameters(optimizer, variables, model.distribute_strategy, scale)
    _install(model, variables, sharded.variables)
    install_sharded(model, optimizer, sharded)
    if isinstance(superseded, ShardedParameters):
        superseded.release()  # a frozen layer's parameters read through it still
    del variables, superseded
    gc.collect()  # the whole copies sit in reference cycles: freed now, not at some later step
    for layer in units_of(model):
        if not layer.__dict__.get("_tfpar_zero3"):
            gathering(layer)


def _install(model, variables, parameters):
    """Each of the model's ``variables`` holds its parameter from now on: a Keras 3 variable as
    its storage, a tf_keras weight replaced wherever its layers hold it (the old copies then go)."""
    layers = _compat.flatten_layers(model)
    for variable, parameter in zip(variables, parameters):
        if variable is parameter:  # a tf_keras weight sharded by an earlier compile
            continue
        if is_keras3(variable):
            _compat.keras3_replace_storage(variable, parameter)
            continue
        for layer in layers:
            _compat.tf_keras_replace_weight(layer, variable, parameter)


def _refuse(model):
    layers = _compat.flatten_layers(model)
    mixed = [layer.name for layer in layers if not is_keras3(layer) and _mixed(layer)]
    if mixed:
        raise ValueError(
            "zero_stage=3 does not yet shard tf_keras' mixed-precision weights (its layers "
            f"{mixed[:3]} cast them). Received: a tf_keras model under a mixed policy. Use "
            "Keras 3 (whose mixed policies stage 3 takes), float32, or zero_stage=2."
        )
    outer = model.optimizer
    if not is_keras3(outer) and inner_optimizer(outer) is not outer:
        raise ValueError(
            "zero_stage=3 cannot take tf_keras' LossScaleOptimizer: it all-reduces the gradients "
            "it checks, and at stage 3 each replica holds the pieces of other parameters. "
            f"Received: {type(outer).__name__}. Use Keras 3's, float32, or zero_stage=2."
        )
    unbuilt = [layer.name for layer in layers if not layer.built]
    if unbuilt:
        raise ValueError(
            "zero_stage=3 shards the variables a model has at compile; this one has unbuilt "
            f"layers {unbuilt[:3]}. Build it before compile (give it an Input, call it on a "
            "batch, or model.build(shape))."
        )


def _mixed(layer):
    policy = getattr(layer, "dtype_policy", None)
    return policy is not None and policy.compute_dtype != policy.variable_dtype
