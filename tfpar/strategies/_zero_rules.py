"""The update rules ZeRO applies to a replica's piece of a bucket of the flat parameters
(`tfpar.strategies._zero`): each optimizer's own rule, element by element, written once for both
Kerases, with its weight decay, clipping by value or by the global norm over every replica's
pieces, and Keras 3's Adam's second moment of a sparse gradient (`tfpar.strategies._sparse`)."""

from tfpar._keras import tf
from tfpar.optimizers import LAMB, LARS

__all__ = [
    "RULES",
    "clip_scale",
    "clipped",
    "sharding_refusal",
    "squared",
    "update",
    "weight_decay",
]

RULES = ("SGD", "Adam", "AdamW")
"""The optimizers whose update is element by element, so that a piece updates as the whole would."""


def sharding_refusal(optimizer) -> str | None:
    """Why ``optimizer`` cannot have its state sharded, or None."""
    name = type(optimizer).__name__
    module = type(optimizer).__module__.split(".")[0]
    if isinstance(optimizer, (LARS, LAMB)):
        return (
            f"{name} scales each layer's step by the layer's norms (its trust ratio), and a "
            "chunk holds parts of several layers; train it with zero_stage=0"
        )
    if name not in RULES or module not in ("keras", "tf_keras"):
        return (
            f"{type(optimizer).__module__}.{name} has no element-wise rule here "
            f"({', '.join(RULES)} of either Keras have): a chunk of its parameters would not "
            "update as the whole does"
        )
    for option in ("use_ema", "clipnorm"):
        if getattr(optimizer, option, None):
            return (
                f"{option}={getattr(optimizer, option)!r} needs each whole variable (a chunk "
                "holds parts of several); use global_clipnorm= to clip, or zero_stage=0"
            )
    if getattr(optimizer, "gradient_accumulation_steps", None):
        return (
            "the optimizer's own gradient_accumulation_steps; use DataParallel's "
            "gradient_accumulation_steps with zero_stage=0, or none"
        )
    if getattr(optimizer, "loss_scale_factor", None):
        return "loss_scale_factor; leave it None"
    return None


def weight_decay(optimizer) -> float:
    """``optimizer``'s weight decay (0.0 without)."""
    return float(getattr(optimizer, "weight_decay", None) or 0.0)


def squared(g, sums=None):
    """A chunk's squared gradient: ``g``'s square, but the sums of squared sparse rows where
    ``sums`` holds them (negative where the gradient was dense: `_sparse.row_squares`)."""
    if sums is None:
        return tf.square(g)
    return tf.where(sums < 0, tf.square(g), sums)


def clip_scale(optimizer, pieces, squares, total):
    """The factor of ``optimizer``'s ``global_clipnorm`` over every replica's ``pieces`` (per
    local replica, a list; ``squares`` alike, or None; ``total`` sums one value of each local
    replica over all of them), or None without one."""
    o = optimizer
    if not getattr(o, "global_clipnorm", None):
        return None
    sums = []
    for k, own in enumerate(pieces):
        own_squares = squares[k] if squares else [None] * len(own)
        clipped_own = [clipped(o, g, sq)[0] for g, sq in zip(own, own_squares)]
        sums.append(
            tf.add_n([tf.reduce_sum(squared(g, sq)) for g, sq in zip(clipped_own, own_squares)])
        )
    norm = tf.sqrt(total(sums))
    return o.global_clipnorm / tf.maximum(norm, o.global_clipnorm)


def clipped(optimizer, g, sums=None, scale=None):
    """A piece's gradient ``g`` (and its ``sums`` of squared sparse rows, or None) clipped as
    ``optimizer`` clips: by value, or by the global norm's ``scale`` (`clip_scale`)."""
    o = optimizer
    if getattr(o, "clipvalue", None):
        g = tf.clip_by_value(g, -o.clipvalue, o.clipvalue)
    if scale is not None:
        g = g * scale
        sums = None if sums is None else sums * tf.square(scale)  # signs kept
    return g, sums


def update(optimizer, slots, p, g, square, lr, step, decay_mask=None, decay_all=False):
    """``optimizer``'s update of the piece ``p`` by gradient ``g`` with this replica's ``slots``
    (``square``: what Adam's second moment takes of ``g``), its weight decay first, as both Kerases
    do (``decay_mask``: 1 where it applies, else ``decay_all``)."""
    o = optimizer
    decay = weight_decay(o)
    if decay and decay_mask is not None:
        p = p - p * decay * lr * decay_mask
    elif decay and decay_all:
        p = p - p * decay * lr
    if type(o).__name__ == "SGD":
        if not o.momentum:
            return p - g * lr
        m = slots["momentum"].assign(slots["momentum"] * o.momentum - g * lr)
        return p + (m * o.momentum - g * lr if o.nesterov else m)
    b1, b2 = tf.cast(o.beta_1, tf.float32), tf.cast(o.beta_2, tf.float32)
    b1_power, b2_power = tf.pow(b1, step), tf.pow(b2, step)
    alpha = lr * tf.sqrt(1 - b2_power) / (1 - b1_power)
    epsilon = (
        o.epsilon * tf.sqrt(1 - b2_power) if getattr(o, "adaptive_epsilon", False) else o.epsilon
    )
    m = slots["m"].assign_add((g - slots["m"]) * (1 - b1))
    v = slots["v"].assign_add((square - slots["v"]) * (1 - b2))
    if "v_hat" in slots:
        v = slots["v_hat"].assign(tf.maximum(slots["v_hat"], v))
    return p - (m * alpha) / (tf.sqrt(v) + epsilon)
