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
update is the optimizer's own rule, written here once for both Kerases (`RULES`: SGD with momentum
or Nesterov, Adam with AMSGrad, AdamW), with its learning rate (and schedule), weight decay and
exclusions, and clipping by value or by the global norm over all chunks. An
optimizer with another rule is refused with the reason. A LossScaleOptimizer wraps the sharded
update (its overflow check agreed over the replicas), and checkpoints hold the whole state in the
unsharded optimizer's layout (`tfpar.strategies._zero_checkpoint`).
"""

import math

from tfpar import _compat
from tfpar._checks import check_choice, check_int
from tfpar._keras import is_keras3, tf
from tfpar.optimizers import LAMB, LARS
from tfpar.strategies._zero_comms import chunks_for
from tfpar.strategies._zero_checkpoint import checkpoint_whole

__all__ = ["RULES", "ZERO_STAGES", "ShardedOptimizer", "check_zero_stage", "shard_optimizer_state",
           "sharding_refusal"]

ZERO_STAGES = (0, 1, 2)
"""0: every replica holds the whole optimizer state; 1: each holds the slots of its chunk; 2: also
only its chunk of the reduced gradients (the same as 1 without accumulation)."""
RULES = ("SGD", "Adam", "AdamW")
"""The optimizers whose update is element by element, so that a chunk updates as the whole would."""


def check_zero_stage(stage):
    """A strategy config's ``zero_stage``, checked."""
    return check_choice("zero_stage", check_int("zero_stage", stage, 0), ZERO_STAGES)


def sharding_refusal(optimizer) -> str | None:
    """Why ``optimizer`` cannot have its state sharded, or None."""
    name = type(optimizer).__name__
    module = type(optimizer).__module__.split(".")[0]
    if isinstance(optimizer, (LARS, LAMB)):
        return (f"{name} scales each layer's step by the layer's norms (its trust ratio), and a chunk holds parts of "
                "several layers; train it with zero_stage=0")
    if name not in RULES or module not in ("keras", "tf_keras"):
        return (f"{type(optimizer).__module__}.{name} has no element-wise rule here ({', '.join(RULES)} "
                "of either Keras have): a chunk of its parameters would not update as the whole does")
    for option in ("use_ema", "clipnorm"):
        if getattr(optimizer, option, None):
            return (f"{option}={getattr(optimizer, option)!r} needs each whole variable (a chunk holds parts of "
                    "several); use global_clipnorm= to clip, or zero_stage=0")
    if getattr(optimizer, "gradient_accumulation_steps", None):
        return ("the optimizer's own gradient_accumulation_steps; use DataParallel's "
                "gradient_accumulation_steps with zero_stage=0, or none")
    if getattr(optimizer, "loss_scale_factor", None):
        return "loss_scale_factor; leave it None"
    return None


class ShardedOptimizer:
    """The sharded update of one compiled model's optimizer over its strategy's replicas."""

    def __init__(self, optimizer, variables, strategy, stage, strategy_accumulates=False):
        """``strategy_accumulates``: the gradients come summed through the strategy, which accumulates
        them itself (under a tf_keras loss-scale optimizer, which reduces them to check them)."""
        self.optimizer, self.strategy, self.stage = optimizer, strategy, stage
        self.keras_variables = list(variables)
        self.variables = [_tf_variable(v) for v in variables]
        for v in self.variables:
            if tf.as_dtype(v.dtype) != tf.float32:
                raise TypeError(f"zero_stage={stage} shards float32 variables; {v.name} is {tf.as_dtype(v.dtype).name}. "
                                "Keep the variables float32 (a mixed policy does), or use zero_stage=0.")
        self.comm = chunks_for(strategy)
        self.devices, n = self.comm.devices, self.comm.size  # this process's replicas; all of them
        self.sizes = [int(v.shape.num_elements()) for v in self.variables]
        self.offsets = [sum(self.sizes[:i]) for i in range(len(self.sizes))]
        self.total = sum(self.sizes)
        self.chunk = math.ceil(self.total / n)
        self.padding = self.chunk * n - self.total
        self.name = type(optimizer).__name__
        if self.name == "SGD":
            self.slot_names = ["momentum"] if optimizer.momentum else []
        else:  # Adam, AdamW
            self.slot_names = ["m", "v"] + (["v_hat"] if optimizer.amsgrad else [])
        # each local replica's slots, and its chunk's weight decay (1) or not (0)
        self.slots, self.decay_masks = [], [None] * len(self.devices)
        decayed = [1.0 if _weight_decay(optimizer) and optimizer._use_weight_decay(v) else 0.0 for v in variables]
        self.decay_all = bool(decayed) and min(decayed) == 1.0
        with tf.init_scope():  # some variables excluded from the decay: a mask (else a number)
            mask = self._flat([tf.fill([size], d) for size, d in zip(self.sizes, decayed)]) \
                if 0.0 < sum(decayed) < len(decayed) else None
        self.window, self.strategy_accumulates = _window(strategy), strategy_accumulates
        self.accumulated, self.counter = [], None  # with accumulation: stage 1 each replica's gradients, 2 its chunk
        for k, (j, device) in enumerate(zip(self.comm.owned, self.devices)):
            if self.window > 1 and not strategy_accumulates:
                with tf.init_scope(), tf.device(device):
                    self.accumulated.append(_compat.ResourceVariable(
                        tf.zeros([self.chunk * (n if stage == 1 else 1)]), trainable=False, name=f"tfpar_zero_sum_{j}"))
                    if self.counter is None:
                        self.counter = _compat.ResourceVariable(tf.constant(0, tf.int64), trainable=False,
                                                                name="tfpar_zero_accumulated_steps")
            with tf.init_scope(), tf.device(device):  # this replica's own: never mirrored
                self.slots.append({s: _compat.ResourceVariable(tf.zeros([self.chunk]), trainable=False,
                                                               name=f"tfpar_zero_{s}_{j}") for s in self.slot_names})
                if mask is not None:
                    self.decay_masks[k] = _compat.ResourceVariable(mask[j * self.chunk:(j + 1) * self.chunk],
                                                                    trainable=False, name=f"tfpar_zero_decay_{j}")

    def apply(self, grads, trainable_variables=None):
        """Keras 3's ``apply`` (which its ``apply_gradients`` and its LossScaleOptimizer call)."""
        return self.apply_gradients(zip(grads, trainable_variables or self.keras_variables))

    def apply_gradients(self, grads_and_vars, name=None, skip_gradients_aggregation=False, **kwargs):
        """The optimizer's ``apply_gradients``, in a replica's context: its gradients go to the
        sharded step (variables the optimizer was not built for are refused). Gradients a tf_keras
        LossScaleOptimizer already summed (to check them) are not summed again."""
        summed = skip_gradients_aggregation or not kwargs.get("experimental_aggregate_gradients", True)
        by_variable = {id(_tf_variable(v)): g for g, v in grads_and_vars}
        unknown = set(by_variable) - {id(v) for v in self.variables}
        if unknown:
            raise ValueError(f"zero_stage={self.stage} shards the {len(self.variables)} trainable variables the "
                             "model had at compile; this step updates others. Compile the model again after "
                             "changing its trainable variables.")
        grads = [by_variable.get(id(v)) for v in self.variables]
        context = tf.distribute.get_replica_context()
        if context is None:
            raise RuntimeError("zero_stage>0: apply_gradients runs in a replica's step (model.fit, or strategy.run).")
        return context.merge_call(self._step, args=(grads, summed))

    def _local(self, value, k):
        return self.strategy.experimental_local_results(value)[k]

    def _flat(self, tensors):
        return tf.pad(tf.concat([tf.reshape(t, [-1]) for t in tensors], 0), [[0, self.padding]])

    def _step(self, strategy, grads, summed=False):
        flat = []
        for k, device in enumerate(self.devices):
            with tf.device(device):
                flat.append(self._flat([tf.zeros(v.shape) if g is None else tf.convert_to_tensor(self._local(g, k))
                                        for g, v in zip(grads, self.variables)]))
        if self.window == 1:
            writes = self._apply(*self.comm.reduce_scatter(flat, self.chunk, summed))
        elif self.strategy_accumulates:
            # a tf_keras loss-scale optimizer reduced them through the strategy, which accumulates them
            # (its sums, all-reduced at its boundary, zeros between): applied at its boundary only
            def apply_summed():
                with tf.control_dependencies(self._apply(*self.comm.reduce_scatter(flat, self.chunk, summed))):
                    return tf.constant(True)

            writes = [tf.cond(strategy.extended._accumulator.boundary, apply_summed, lambda: tf.constant(False))]
        else:  # accumulated: stage 1 sums each replica's gradients, stage 2 the reduced chunks; applied every window-th step
            chunks, sent = (flat, None) if self.stage == 1 else self.comm.reduce_scatter(flat, self.chunk, summed)
            added = [b.assign_add(g) for b, g in zip(self.accumulated, chunks)]
            with tf.control_dependencies(added):
                boundary = tf.equal(self.counter.assign_add(1) % self.window, 0)

            def apply():
                means = [b.read_value() / self.window for b in self.accumulated]
                applied = self._apply(*self.comm.reduce_scatter(means, self.chunk, summed)) if self.stage == 1 else \
                    self._apply(means, sent)
                with tf.control_dependencies(applied):
                    cleared = [b.assign(tf.zeros_like(b)) for b in self.accumulated]
                with tf.control_dependencies(cleared):
                    return tf.constant(True)

            writes = [tf.cond(boundary, apply, lambda: tf.constant(False))]
        with tf.control_dependencies(writes):
            return self.optimizer.iterations.assign_add(1)

    def _apply(self, chunks, sent):
        """The update of this process's reduced chunks ``chunks`` (``sent``: the bytes their reduce-scatter
        sent), all-gathered into every local copy of the weights; returns the writes."""
        c = self.chunk
        chunks = self._clipped(chunks)
        lr = tf.cast(_compat.current_learning_rate(self.optimizer), tf.float32)
        step = tf.cast(self.optimizer.iterations + 1, tf.float32)
        updated = []
        for k, (j, device) in enumerate(zip(self.comm.owned, self.devices)):
            with tf.device(device):
                params = self._flat([self._local(v, k) for v in self.variables])[j * c:(j + 1) * c]
                updated.append(self._rule(k, params, chunks[k], lr, step))
        wholes, gathered = self.comm.all_gather(updated)
        writes = []
        for k, device in enumerate(self.devices):
            with tf.device(device):
                for v, part in zip(self.variables, tf.split(wholes[k][:self.total], self.sizes)):
                    writes.append(self._local(v, k).assign(tf.reshape(part, v.shape)))
        self.sent_bytes = [a + b for a, b in zip(sent, gathered)]  # per local replica and update, from the shapes
        return writes

    def _clipped(self, chunks):
        o = self.optimizer
        if getattr(o, "clipvalue", None):
            chunks = [tf.clip_by_value(g, -o.clipvalue, o.clipvalue) for g in chunks]
        if getattr(o, "global_clipnorm", None):  # the norm over every replica's chunk
            norm = tf.sqrt(self.comm.total([tf.reduce_sum(tf.square(g)) for g in chunks]))
            scale = o.global_clipnorm / tf.maximum(norm, o.global_clipnorm)
            chunks = [g * scale for g in chunks]
        return chunks

    def _rule(self, k, p, g, lr, step):
        """The optimizer's update of local replica ``k``'s chunk ``p`` (its weight decay first, as both Kerases do)."""
        o, slots = self.optimizer, self.slots[k]
        decay = _weight_decay(o)
        if decay and self.decay_masks[k] is not None:
            p = p - p * decay * lr * self.decay_masks[k]
        elif self.decay_all:
            p = p - p * decay * lr
        if self.name == "SGD":
            if not o.momentum:
                return p - g * lr
            m = slots["momentum"].assign(slots["momentum"] * o.momentum - g * lr)
            return p + (m * o.momentum - g * lr if o.nesterov else m)
        b1, b2 = tf.cast(o.beta_1, tf.float32), tf.cast(o.beta_2, tf.float32)
        b1_power, b2_power = tf.pow(b1, step), tf.pow(b2, step)
        alpha = lr * tf.sqrt(1 - b2_power) / (1 - b1_power)
        epsilon = o.epsilon * tf.sqrt(1 - b2_power) if getattr(o, "adaptive_epsilon", False) else o.epsilon
        m = slots["m"].assign_add((g - slots["m"]) * (1 - b1))
        v = slots["v"].assign_add((tf.square(g) - slots["v"]) * (1 - b2))
        if "v_hat" in slots:
            v = slots["v_hat"].assign(tf.maximum(slots["v_hat"], v))
        return p - (m * alpha) / (tf.sqrt(v) + epsilon)

    def plain_slots(self) -> list:
        """``[(slot, variable index)]`` in the order the optimizer itself would list its slots (both
        Kerases: each variable's slots in turn, then AMSGrad's maxima), so that a checkpoint written
        sharded reads as the unsharded optimizer's, and the other way round."""
        main = [name for name in self.slot_names if name != "v_hat"]
        order = [(name, i) for i in range(len(self.variables)) for name in main]
        return order + [("v_hat", i) for i in range(len(self.variables)) if "v_hat" in self.slot_names]

    def _pieces(self, i):
        """``(local replica, chunk slice, whole-slot slice)`` of this process's chunks holding variable
        ``i``'s elements."""
        c, start, end = self.chunk, self.offsets[i], self.offsets[i] + self.sizes[i]
        for k, j in enumerate(self.comm.owned):
            lo, hi = max(start, j * c), min(end, (j + 1) * c)
            if lo < hi:
                yield k, slice(lo - j * c, hi - j * c), slice(lo - start, hi - start)

    def whole_slot(self, name, i):
        """Slot ``name`` of variable ``i``, whole, in the variable's shape (gathered from every
        replica's chunks: a collective under Horovod, which every rank runs)."""
        mine = {k: self.slots[k][name][part] for k, part, _ in self._pieces(i)}
        c, start, end = self.chunk, self.offsets[i], self.offsets[i] + self.sizes[i]
        lengths = [max(0, min(end, (j + 1) * c) - max(start, j * c)) for j in range(self.comm.size)]
        parts = [mine.get(k, tf.zeros([0])) for k in range(len(self.devices))]
        whole = self.comm.gather(parts, lengths, f"tfpar_zero_checkpoint_{name}_{i}")
        return tf.reshape(whole, self.variables[i].shape)

    def set_whole_slot(self, name, i, value):
        """Sets slot ``name`` of variable ``i`` from its whole value (each local chunk takes its part)."""
        flat = tf.reshape(tf.cast(value, tf.float32), [-1])
        return tf.group([self.slots[k][name][mine].assign(flat[whole]) for k, mine, whole in self._pieces(i)])

    def state_bytes(self) -> dict:
        """``{what: (bytes unsharded, bytes sharded)}`` one replica holds: weights, reduced gradients
        (accumulated whole at stage 1), optimizer state (its slots; a chunk is padded to a whole N-th)."""
        full, slots = 4 * self.total, len(self.slot_names)
        whole = self.window > 1 and (self.stage == 1 or self.strategy_accumulates)  # a whole buffer accumulates
        gradients = full if whole else 4 * self.chunk
        return {"weights": (full, full), "gradients": (full, gradients), "optimizer state": (slots * full, slots * 4 * self.chunk)}


def _tf_variable(variable):
    """The tf.Variable of a variable of either Keras (Keras 3 wraps one)."""
    return variable if isinstance(variable, tf.Variable) else variable.value


def _window(strategy):
    """The optimizer calls a strategy accumulates gradients over, or 1: its `GradientAccumulator`'s window
    (DataParallel's and Horovod's option, times an elastic job's micro-batches)."""
    accumulator = getattr(getattr(strategy, "extended", None), "_accumulator", None)
    return accumulator.steps if accumulator is not None else 1


def _weight_decay(optimizer):
    return float(getattr(optimizer, "weight_decay", None) or 0.0)


def shard_optimizer_state(model, arguments=None):
    """After ``compile`` of a model of a `DataParallel` with ``zero_stage`` > 0: its optimizer's
    updates go through a `ShardedOptimizer` (on that optimizer instance only).

    Raises:
        ValueError: an optimizer whose state cannot be sharded, with the reason.
    """
    strategy = model.distribute_strategy
    stage = getattr(getattr(strategy, "config", None), "zero_stage", 0)
    outer = getattr(model, "optimizer", None)
    if not stage or outer is None:
        return
    optimizer = getattr(outer, "inner_optimizer", outer)  # the one a LossScaleOptimizer wraps: its update is sharded
    refusal = sharding_refusal(optimizer)
    if refusal:
        raise ValueError(f"zero_stage={stage} cannot shard the state of this optimizer: {refusal}. Received: "
                         f"{type(optimizer).__name__}. Use {' or '.join(RULES)}, or zero_stage=0.")
    keras3 = is_keras3(optimizer)
    if keras3:  # Keras 3 would build every slot before the first step
        optimizer.built = True
        if outer is not optimizer and not outer.built:
            with strategy.scope():
                outer.build(model.trainable_variables)  # its loss scale and step counter (the inner one is built)
    _compat.current_learning_rate(optimizer)  # its variable made now, not in a step
    sharded = ShardedOptimizer(optimizer, model.trainable_variables, strategy, stage,
                               strategy_accumulates=outer is not optimizer and not keras3 and _window(strategy) > 1)
    object.__setattr__(optimizer, "apply" if keras3 else "apply_gradients", sharded.apply if keras3 else sharded.apply_gradients)
    checkpoint_whole(optimizer, sharded)
    object.__setattr__(model, "_tfpar_zero", sharded)
