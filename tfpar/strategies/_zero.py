"""Sharded optimizer states (ZeRO, Rajbhandari et al., SC'20) for `DataParallel` (one host or
several workers) and `HorovodStrategy`.

With ``zero_stage=1`` (or 2) each of the N replicas owns one N-th of the model's parameters (its
chunk: its piece of every bucket of consecutive variables, `tfpar.strategies._zero_state`; balanced
by bytes, whatever the variables' sizes), keeps the optimizer slots of its chunk only, and updates
only its chunk:

1. the replicas' gradients are reduce-scattered: replica j gets piece j of each bucket's sum (each
   sends (N-1)/N of the gradients' bytes; half of them with the strategy's bf16/fp16 compression);
2. replica j applies the optimizer's update to its piece of each bucket, with its own slots;
3. the updated pieces are all-gathered into every replica's copy of the weights.

Steps 1 and 3 move the bytes of one all-reduce, bucket by bucket, steps 2 and 3 one bucket after
the other (`tfpar.strategies._zero_exchange`: a step holds one bucket's buffers at a time), each
engine its own way (`tfpar.strategies._zero_comms`: one host's devices, TensorFlow's workers,
Horovod's ranks). The update is the optimizer's own rule, written once for both Kerases in
`tfpar.strategies._zero_rules` (its ``RULES``: SGD with momentum or Nesterov, Adam with AMSGrad,
AdamW), with its learning rate (and schedule), weight decay and exclusions, and clipping by value
or by the global norm over all chunks. An optimizer with another rule is refused with the reason.
A LossScaleOptimizer wraps the sharded update (its overflow check agreed over the replicas), and
checkpoints hold the whole state in the unsharded optimizer's layout
(`tfpar.strategies._zero_checkpoint`). A sparse gradient's sums of squared rows, which Keras 3's
Adam and a global norm take (`tfpar.strategies._sparse`), travel with its bucket's gradients.
"""

from tfpar import _compat
from tfpar._checks import check_choice, check_int
from tfpar._keras import inner_optimizer, is_keras3, tf
from tfpar.strategies import _sparse as sparse
from tfpar.strategies import _zero_rules as rules
from tfpar.strategies._zero_checkpoint import checkpoint_whole
from tfpar.strategies._zero_exchange import BucketExchange
from tfpar.strategies._zero_state import tf_variable, window_of

__all__ = [
    "ZERO_STAGES",
    "ShardedOptimizer",
    "check_zero_stage",
    "install_sharded",
    "optimizer_to_shard",
    "shard_optimizer_state",
    "zero_stage_of",
]

ZERO_STAGES = (0, 1, 2, 3)
"""0: every replica holds the whole optimizer state; 1: each holds the slots of its chunk; 2: also
only its chunk of the reduced gradients (the same as 1 without accumulation); 3: also only its
piece of each parameter (`tfpar.strategies._zero3`)."""


def check_zero_stage(stage):
    """A strategy config's ``zero_stage``, checked."""
    return check_choice("zero_stage", check_int("zero_stage", stage, 0), ZERO_STAGES)


class ShardedOptimizer(BucketExchange):
    """The sharded update of one compiled model's optimizer over its strategy's replicas."""

    def __init__(self, optimizer, variables, strategy, stage, strategy_accumulates=False):
        """The state (`BucketExchange`, where ``strategy_accumulates`` is said), and how a sparse
        gradient's squared rows take part in the update."""
        super().__init__(optimizer, variables, strategy, stage, strategy_accumulates)
        # see tfpar.strategies._sparse; Keras 3's global_clipnorm hands its Adam dense gradients
        self.moment_squares = (
            is_keras3(optimizer)
            and self.name != "SGD"
            and not getattr(optimizer, "global_clipnorm", None)
        )

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

    def _squared_rows(self, grads):
        """Whether this step needs a sparse gradient's sums of squared rows
        (`tfpar.strategies._sparse`): Keras 3's Adam or a global norm takes them where rows are not
        accumulated."""
        rows = [g is not None and sparse.is_sparse(self._local(g, 0)) for g in grads]
        if any(rows):
            self.refuse_clipping_rows()
        uses = self.moment_squares or getattr(self.optimizer, "global_clipnorm", None)
        return bool(any(rows) and uses and self.window == 1)

    def refuse_clipping_rows(self):
        """Refuses ``clipvalue`` where a gradient is sparse: the optimizer clips each looked-up row
        before duplicates are summed, a piece holds the summed rows."""
        if getattr(self.optimizer, "clipvalue", None):
            raise ValueError(
                f"zero_stage={self.stage} cannot clip a sparse gradient by value: the optimizer "
                "clips each looked-up row before duplicates are summed, and a chunk holds the "
                f"summed rows. Received: clipvalue={self.optimizer.clipvalue!r} with an "
                "Embedding's (sparse) gradient. Use global_clipnorm=, or zero_stage=0."
            )

    def _step(self, strategy, grads, summed=False):
        rows = self._squared_rows(grads)
        self._events = self._step_events()  # this step's, for the Timeline (`_trace`)

        def gradients(bucket, k):
            return self._bucket_gradients(grads, bucket, k)

        if self.window == 1:
            squares = self._squares_of(grads) if rows else None
            writes = self._counted(self._apply(*self._exchange(gradients, summed, squares)))
            writes.append(self._trace())
        elif self.strategy_accumulates:
            # a tf_keras loss-scale optimizer reduced them through the strategy, which accumulates
            # them (its sums, all-reduced at its boundary, zeros between): applied at its boundary
            # only
            def apply_summed():
                with tf.control_dependencies(
                    self._counted(self._apply(*self._exchange(gradients, summed)))
                ):
                    return self._traced(True)

            writes = [
                tf.cond(
                    strategy.extended._accumulator.boundary,
                    apply_summed,
                    lambda: self._traced(False, 0, len(self._events)),
                )
            ]
        else:
            writes = [self._accumulate(grads, gradients, summed)]
        with tf.control_dependencies(writes):
            return tf.identity(self.optimizer.iterations)

    def _accumulate(self, grads, gradients, summed):
        """Accumulated: stage 1 sums each replica's whole flat gradients, stage 2 its reduced
        pieces, bucket by bucket (a window's first step sets the sums anew: no buffer is filled
        with zeros); applied every window-th step (a ``tf.cond``)."""
        first = tf.equal(self.counter.read_value() % self.window, 0)
        if self.stage == 1:
            added = self._add_flat(gradients, first)
            sent = None
        else:
            pieces, sent, _ = self._exchange(gradients, summed)
            added = [
                _summed(buffer, piece, first)
                for buffers, own in zip(self.accumulated, pieces)
                for buffer, piece in zip(buffers, own)
            ]
        with tf.control_dependencies(added):
            boundary = tf.equal(self.counter.assign_add(1) % self.window, 0)
        exchanged = len(self._events)  # stage 2's reduce-scatters, at every step

        def apply():
            if self.stage == 1:

                def summed_means(bucket, k):
                    buffer = self.accumulated[k][self.buckets.index(bucket)]
                    return buffer.read_value() / self.window

                applied = self._apply(*self._exchange(summed_means, summed))
            else:
                means = [[b.read_value() / self.window for b in own] for own in self.accumulated]
                applied = self._apply(means, sent)
            with tf.control_dependencies(self._counted(applied)):
                return self._traced(True)

        # the false branch is traced after the true one, whose events it pads
        return tf.cond(boundary, apply, lambda: self._traced(False, exchanged, len(self._events)))

    def _add_flat(self, gradients, first):
        """Stage 1's accumulation: each local replica's flat gradients of each bucket added to its
        buffer of the bucket (set, on a window's ``first`` step), one bucket after the other."""
        added = []
        after = []
        for index, bucket in enumerate(self.buckets):
            with tf.control_dependencies(after):
                after = []
                for k, device in enumerate(self.devices):
                    with tf.device(device):
                        buffer = self.accumulated[k][index]
                        after.append(_summed(buffer, gradients(bucket, k), first))
            added += after
        return added

    def _traced(self, value, recorded=None, rows=None):
        """A branch's ``value``, once it has written the step's events (`_trace`: the first
        ``recorded``, NaN up to ``rows``)."""
        with tf.control_dependencies([self._trace(recorded, rows)]):
            return tf.constant(value)

    def _counted(self, writes):
        """``writes`` of an update, then the optimizer's ``iterations`` counting it: it counts
        updates, so an accumulated window's bias correction and schedule are one step's of its whole
        batch."""
        with tf.control_dependencies(writes):
            return [self.optimizer.iterations.assign_add(1)]

    def _updated(self, pieces, squares, scale, index, bucket):
        """Each local replica's piece of bucket ``index`` of the weights, updated by the
        optimizer's rule from its reduced ``pieces`` (and ``squares``) of that bucket, clipped
        (``scale``: the global norm's, or None)."""
        lr = tf.cast(_compat.current_learning_rate(self.optimizer), tf.float32)
        step = tf.cast(self.optimizer.iterations + 1, tf.float32)
        updated = []
        for k, device in enumerate(self.devices):
            with tf.device(device):
                g, sums = rules.clipped(
                    self.optimizer, pieces[k][index], squares[k][index] if squares else None, scale
                )
                square = rules.squared(g, sums if self.moment_squares else None)
                masks = self.decay_masks[k]
                updated.append(
                    rules.update(
                        self.optimizer,
                        self.slots[k][index],
                        self.own_piece(k, bucket),
                        g,
                        square,
                        lr,
                        step,
                        masks[index] if masks else None,
                        self.decay_all,
                    )
                )
        return updated

    def _apply(self, pieces, sent, squares=None):
        """The update of this process's reduced ``pieces`` (per local replica, one per bucket;
        ``sent``: the bytes their reduce-scatter sent; ``squares``: their reduced sums of squared
        sparse rows, negative where the gradient was dense, or None), bucket by bucket, each
        all-gathered into every local copy of the weights; returns the writes."""
        scale = rules.clip_scale(self.optimizer, pieces, squares, self.comm.total)

        def update(index, bucket):
            return self._updated(pieces, squares, scale, index, bucket)

        writes, gathered = self._write_back(pieces, update)
        # per local replica and update, from the shapes
        self.sent_bytes = [a + b for a, b in zip(sent, gathered)]
        return writes


def _summed(buffer, value, first):
    """``buffer`` set to ``value`` on a window's ``first`` step, else ``value`` added (whatever the
    buffer held, inf and NaN included: a step skipped for them starts the next window clean)."""
    return buffer.assign(tf.where(first, value, buffer.read_value() + value))


def zero_stage_of(strategy):
    """The ZeRO stage ``strategy`` shards its optimizer state at (0: none, or not a tfpar
    strategy with one)."""
    return getattr(getattr(strategy, "config", None), "zero_stage", 0)


def optimizer_to_shard(model, stages=(1, 2)):
    """The optimizer of a model of a `DataParallel` whose ``zero_stage`` is one of ``stages``, made
    ready for its sharded update: ``(the model's optimizer, the one it wraps or itself)``; None
    where the model's strategy shards nothing of it (or the model has no optimizer).

    Raises:
        ValueError: an optimizer whose state cannot be sharded, with the reason.
    """
    strategy = model.distribute_strategy
    stage = zero_stage_of(strategy)
    outer = getattr(model, "optimizer", None)
    if stage not in stages or outer is None:
        return None
    # the one a LossScaleOptimizer wraps: its update is sharded
    optimizer = inner_optimizer(outer)
    refusal = rules.sharding_refusal(optimizer)
    if refusal:
        raise ValueError(
            f"zero_stage={stage} cannot shard the state of this optimizer: {refusal}. Received: "
            f"{type(optimizer).__name__}. Use {' or '.join(rules.RULES)}, "
            "or zero_stage=0."
        )
    if is_keras3(optimizer):  # Keras 3 would build every slot before the first step
        optimizer.built = True
        if outer is not optimizer and not outer.built:
            with strategy.scope():
                # its loss scale and step counter (the inner one is built)
                outer.build(model.trainable_variables)
    _compat.current_learning_rate(optimizer)  # its variable made now, not in a step
    return outer, optimizer


def install_sharded(model, optimizer, sharded):
    """``optimizer``'s updates go through ``sharded`` (on that optimizer instance only), and its
    checkpoints hold the whole state."""
    keras3 = is_keras3(optimizer)
    object.__setattr__(
        optimizer,
        "apply" if keras3 else "apply_gradients",
        sharded.apply if keras3 else sharded.apply_gradients,
    )
    checkpoint_whole(optimizer, sharded)
    object.__setattr__(model, "_tfpar_zero", sharded)


def shard_optimizer_state(model, arguments=None):
    """After ``compile`` of a model of a `DataParallel` with ``zero_stage`` 1 or 2: its optimizer's
    updates go through a `ShardedOptimizer` (on that optimizer instance only).

    Raises:
        ValueError: an optimizer whose state cannot be sharded, with the reason.
    """
    prepared = optimizer_to_shard(model)
    if prepared is None:
        return
    outer, optimizer = prepared
    sharded = ShardedOptimizer(
        optimizer,
        model.trainable_variables,
        model.distribute_strategy,
        zero_stage_of(model.distribute_strategy),
        strategy_accumulates=outer is not optimizer
        and not is_keras3(optimizer)
        and window_of(model.distribute_strategy) > 1,
    )
    install_sharded(model, optimizer, sharded)
