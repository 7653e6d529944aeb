"""Sharded optimizer states (ZeRO, Rajbhandari et al., SC'20) for `DataParallel` (one host or
several workers) and `HorovodStrategy`.

With ``zero_stage=1`` (or 2) each of the N replicas owns one N-th of the model's parameters, as one
flat vector cut into N equal chunks (balanced by bytes, whatever the variables' sizes), keeps the
optimizer slots of its chunk only, and updates only its chunk:

1. the replicas' gradients are reduce-scattered: replica j gets chunk j of their sum (each sends
   (N-1)/N of the gradients' bytes; half of them with the strategy's bf16/fp16 compression);
2. replica j applies the optimizer's update to its chunk, with its own slots;
3. the updated chunks are all-gathered into every replica's copy of the weights.

Steps 1 and 3 move the bytes of one all-reduce, each engine its own way
(`tfpar.strategies._zero_comms`: one host's devices, TensorFlow's workers, Horovod's ranks). The
update is the optimizer's own rule, written once for both Kerases in
`tfpar.strategies._zero_rules` (its ``RULES``: SGD with momentum or Nesterov, Adam with AMSGrad,
AdamW), with its learning rate (and schedule), weight decay and exclusions, and clipping by value
or by the global norm over all chunks. An optimizer with another rule is refused with the reason.
A LossScaleOptimizer wraps the sharded update (its overflow check agreed over the replicas), and
checkpoints hold the whole state in the unsharded optimizer's layout
(`tfpar.strategies._zero_checkpoint`).

A sparse gradient's sums of squared rows, which Keras 3's Adam and a global norm take
(`tfpar.strategies._sparse`), travel with the gradients in the same reduce-scatter (one
collective, so that every engine runs a step's collectives in one order), which then sends twice
the bytes. fp16's range would flush those squares (1e-8 and less) to zero, so under fp16
compression that reduce-scatter, gradients included, travels in float32: 4 times fp16's bytes.
bf16 keeps float32's range and stays 16-bit.
"""

from tfpar import _compat
from tfpar._checks import check_choice, check_int
from tfpar._keras import inner_optimizer, is_keras3, tf
from tfpar.strategies import _sparse as sparse
from tfpar.strategies import _zero_rules as rules
from tfpar.strategies._zero_checkpoint import checkpoint_whole
from tfpar.strategies._zero_state import ShardedState, tf_variable, window_of

__all__ = [
    "ZERO_STAGES",
    "ShardedOptimizer",
    "check_zero_stage",
    "shard_optimizer_state",
    "zero_stage_of",
]

ZERO_STAGES = (0, 1, 2)
"""0: every replica holds the whole optimizer state; 1: each holds the slots of its chunk; 2: also
only its chunk of the reduced gradients (the same as 1 without accumulation)."""


def check_zero_stage(stage):
    """A strategy config's ``zero_stage``, checked."""
    return check_choice("zero_stage", check_int("zero_stage", stage, 0), ZERO_STAGES)


class ShardedOptimizer(ShardedState):
    """The sharded update of one compiled model's optimizer over its strategy's replicas."""

    def __init__(self, optimizer, variables, strategy, stage, strategy_accumulates=False):
        """The state (`ShardedState`, where ``strategy_accumulates`` is said), and how a sparse
        gradient's squared rows take part in the update."""
        super().__init__(optimizer, variables, strategy, stage, strategy_accumulates)
        # see tfpar.strategies._sparse
        self.moment_squares = is_keras3(optimizer) and self.name != "SGD"
        # fp16 would flush squared rows to zero: their reduce-scatter travels in float32 there
        compression = getattr(getattr(strategy, "config", None), "compression", "none")
        self.squares_in_float32 = compression == "fp16"

    def apply(self, grads, trainable_variables=None):
        """Keras 3's ``apply`` (which its ``apply_gradients`` and its LossScaleOptimizer call)."""
        return self.apply_gradients(zip(grads, trainable_variables or self.keras_variables))

    def apply_gradients(
        self, grads_and_vars, name=None, skip_gradients_aggregation=False, **kwargs
    ):
        """The optimizer's ``apply_gradients``, in a replica's context: its gradients go to the
        sharded step (variables the optimizer was not built for are refused). Gradients a tf_keras
        LossScaleOptimizer already summed (to check them) are not summed again."""
        summed = skip_gradients_aggregation or not kwargs.get(
            "experimental_aggregate_gradients", True
        )
        by_variable = {id(tf_variable(v)): g for g, v in grads_and_vars}
        unknown = set(by_variable) - {id(v) for v in self.variables}
        if unknown:
            raise ValueError(
                f"zero_stage={self.stage} shards the {len(self.variables)} trainable variables the "
                "model had at compile; this step updates others. Compile the model again after "
                "changing its trainable variables."
            )
        grads = [by_variable.get(id(v)) for v in self.variables]
        context = tf.distribute.get_replica_context()
        if context is None:
            raise RuntimeError(
                "zero_stage>0: apply_gradients runs in a replica's step (model.fit, or "
                "strategy.run)."
            )
        return context.merge_call(self._step, args=(grads, summed))

    def _gradients(self, grads, k, of=sparse.dense):
        """Local replica ``k``'s flat gradients (``of`` each: summed rows, or their squares)."""
        return self._flat(
            [
                tf.zeros(v.shape) if g is None else of(self._local(g, k), v.shape)
                for g, v in zip(grads, self.variables)
            ]
        )

    def _squared_rows(self, grads):
        """Whether this step needs a sparse gradient's sums of squared rows
        (`tfpar.strategies._sparse`): Keras 3's Adam or a global norm takes them where rows are not
        accumulated."""
        rows = [g is not None and sparse.is_sparse(self._local(g, 0)) for g in grads]
        if any(rows) and getattr(self.optimizer, "clipvalue", None):
            raise ValueError(
                f"zero_stage={self.stage} cannot clip a sparse gradient by value: the optimizer "
                "clips each looked-up row before duplicates are summed, and a chunk holds the "
                f"summed rows. Received: clipvalue={self.optimizer.clipvalue!r} with an "
                "Embedding's (sparse) gradient. Use global_clipnorm=, or zero_stage=0."
            )
        uses = self.moment_squares or getattr(self.optimizer, "global_clipnorm", None)
        return bool(any(rows) and uses and self.window == 1)

    def _step(self, strategy, grads, summed=False):
        rows = self._squared_rows(grads)
        flat, squares = [], []
        for k, device in enumerate(self.devices):
            with tf.device(device):
                flat.append(self._gradients(grads, k))
                if rows:
                    squares.append(self._gradients(grads, k, sparse.row_squares))
        if rows:
            chunks, squares, sent = self._reduce_scatter_with_squares(flat, squares, summed)
            writes = self._counted(self._apply(chunks, sent, squares))
        elif self.window == 1:
            writes = self._counted(self._apply(*self.comm.reduce_scatter(flat, self.chunk, summed)))
        elif self.strategy_accumulates:
            # a tf_keras loss-scale optimizer reduced them through the strategy, which accumulates
            # them (its sums, all-reduced at its boundary, zeros between): applied at its boundary
            # only
            def apply_summed():
                self._counted(self._apply(*self.comm.reduce_scatter(flat, self.chunk, summed)))
                return tf.constant(True)

            writes = [
                tf.cond(
                    strategy.extended._accumulator.boundary,
                    apply_summed,
                    lambda: tf.constant(False),
                )
            ]
        else:
            # accumulated: stage 1 sums each replica's gradients, stage 2 the reduced chunks;
            # applied every window-th step
            chunks, sent = (
                (flat, None)
                if self.stage == 1
                else self.comm.reduce_scatter(flat, self.chunk, summed)
            )
            added = [b.assign_add(g) for b, g in zip(self.accumulated, chunks)]
            with tf.control_dependencies(added):
                boundary = tf.equal(self.counter.assign_add(1) % self.window, 0)

            def apply():
                means = [b.read_value() / self.window for b in self.accumulated]
                applied = (
                    self._apply(*self.comm.reduce_scatter(means, self.chunk, summed))
                    if self.stage == 1
                    else self._apply(means, sent)
                )
                with tf.control_dependencies(self._counted(applied)):
                    cleared = [b.assign(tf.zeros_like(b)) for b in self.accumulated]
                with tf.control_dependencies(cleared):
                    return tf.constant(True)

            writes = [tf.cond(boundary, apply, lambda: tf.constant(False))]
        with tf.control_dependencies(writes):
            return tf.identity(self.optimizer.iterations)

    def _reduce_scatter_with_squares(self, flat, squares, summed):
        """Each replica's flat gradients and sums of squared sparse rows, reduce-scattered as one:
        chunk j of both travels together (one collective, so every engine runs them in one
        order)."""
        c, n = self.chunk, self.comm.size
        both = []
        for device, g, sq in zip(self.devices, flat, squares):
            with tf.device(device):
                both.append(
                    tf.reshape(tf.concat([tf.reshape(g, [n, c]), tf.reshape(sq, [n, c])], 1), [-1])
                )
        reduced, sent = self.comm.reduce_scatter(both, 2 * c, summed, full=self.squares_in_float32)
        return [r[:c] for r in reduced], [r[c:] for r in reduced], sent

    def _counted(self, writes):
        """``writes`` of an update, then the optimizer's ``iterations`` counting it: it counts
        updates, so an accumulated window's bias correction and schedule are one step's of its whole
        batch."""
        with tf.control_dependencies(writes):
            return [self.optimizer.iterations.assign_add(1)]

    def _apply(self, chunks, sent, squares=None):
        """The update of this process's reduced chunks ``chunks`` (``sent``: the bytes their
        reduce-scatter sent; ``squares``: each chunk's reduced sums of squared sparse rows, negative
        where the gradient was dense, or None), all-gathered into every local copy of the weights;
        returns the writes."""
        chunks, squares = rules.clipped(self.optimizer, chunks, squares, self.comm.total)
        lr = tf.cast(_compat.current_learning_rate(self.optimizer), tf.float32)
        step = tf.cast(self.optimizer.iterations + 1, tf.float32)
        updated = []
        for k, device in enumerate(self.devices):
            with tf.device(device):
                params = self.own_chunk(k)
                square = rules.squared(
                    chunks[k], squares[k] if squares and self.moment_squares else None
                )
                updated.append(
                    rules.update(
                        self.optimizer,
                        self.slots[k],
                        params,
                        chunks[k],
                        square,
                        lr,
                        step,
                        self.decay_masks[k],
                        self.decay_all,
                    )
                )
        wholes, gathered = self.comm.all_gather(updated)
        writes = []
        for k, device in enumerate(self.devices):
            with tf.device(device):
                for v, part in zip(self.variables, tf.split(wholes[k][: self.total], self.sizes)):
                    writes.append(self._local(v, k).assign(tf.reshape(part, v.shape)))
        # per local replica and update, from the shapes
        self.sent_bytes = [a + b for a, b in zip(sent, gathered)]
        return writes


def zero_stage_of(strategy):
    """The ZeRO stage ``strategy`` shards its optimizer state at (0: none, or not a tfpar
    strategy with one)."""
    return getattr(getattr(strategy, "config", None), "zero_stage", 0)


def shard_optimizer_state(model, arguments=None):
    """After ``compile`` of a model of a `DataParallel` with ``zero_stage`` > 0: its optimizer's
    updates go through a `ShardedOptimizer` (on that optimizer instance only).

    Raises:
        ValueError: an optimizer whose state cannot be sharded, with the reason.
    """
    strategy = model.distribute_strategy
    stage = zero_stage_of(strategy)
    outer = getattr(model, "optimizer", None)
    if not stage or outer is None:
        return
    # the one a LossScaleOptimizer wraps: its update is sharded
    optimizer = inner_optimizer(outer)
    refusal = rules.sharding_refusal(optimizer)
    if refusal:
        raise ValueError(
            f"zero_stage={stage} cannot shard the state of this optimizer: {refusal}. Received: "
            f"{type(optimizer).__name__}. Use {' or '.join(rules.RULES)}, "
            "or zero_stage=0."
        )
    keras3 = is_keras3(optimizer)
    if keras3:  # Keras 3 would build every slot before the first step
        optimizer.built = True
        if outer is not optimizer and not outer.built:
            with strategy.scope():
                # its loss scale and step counter (the inner one is built)
                outer.build(model.trainable_variables)
    _compat.current_learning_rate(optimizer)  # its variable made now, not in a step
    sharded = ShardedOptimizer(
        optimizer,
        model.trainable_variables,
        strategy,
        stage,
        strategy_accumulates=outer is not optimizer and not keras3 and window_of(strategy) > 1,
    )
    object.__setattr__(
        optimizer,
        "apply" if keras3 else "apply_gradients",
        sharded.apply if keras3 else sharded.apply_gradients,
    )
    checkpoint_whole(optimizer, sharded)
    object.__setattr__(model, "_tfpar_zero", sharded)
