"""The papers' update rules of LARS and LAMB on one variable, in TensorFlow, written once for both
Kerases.

Each rule takes the variable, its gradient (all-reduced: the optimizers run after the strategy's
reduction, so every replica computes the same trust ratio), its slots, the learning rate and the
step, and returns the new variable and slots. ``decay`` is the weight-decay rate for this variable
(0 when excluded) and ``adapt`` whether its trust ratio applies (1 when excluded).
"""

from tfpar._keras import tf

__all__ = ["lamb", "lars", "trust_ratio"]


def trust_ratio(numerator, denominator):
    """``numerator / denominator``, or 1 where either is 0 (a zero-initialised bias, a zero update):
    the convention of the papers' reference code, so a fresh variable still moves."""
    usable = tf.logical_and(numerator > 0, denominator > 0)
    return tf.where(
        usable,
        numerator / tf.where(usable, denominator, tf.ones_like(denominator)),
        tf.ones_like(numerator),
    )


def lars(variable, gradient, velocity, learning_rate, *, momentum, nesterov, eta, decay, adapt):
    """LARS (You, Gitman & Ginsburg 2017, Algorithm 1), weight decay inside the trust ratio:

    ``local = eta * |w| / (|g| + decay * |w|)``,
    ``v = momentum * v + lr * local * (g + decay * w)``, ``w = w - v``
    (Nesterov: ``w = w - (momentum * v + lr * local * (g + decay * w))``).
    Returns ``(w, v)``.
    """
    update = gradient + decay * variable if decay else gradient
    scale = learning_rate
    if adapt:
        w_norm = tf.norm(variable)
        scale = learning_rate * trust_ratio(eta * w_norm, tf.norm(gradient) + decay * w_norm)
    velocity = momentum * velocity + scale * update
    step = momentum * velocity + scale * update if nesterov else velocity
    return variable - step, velocity


def lamb(variable, gradient, m, v, learning_rate, step, *, beta_1, beta_2, epsilon, decay, adapt):
    """LAMB (You et al. 2019, Algorithm 2), weight decay inside the trust ratio:

    Adam's bias-corrected moments give ``r = m_hat / (sqrt(v_hat) + epsilon) + decay * w``;
    ``w = w - lr * |w| / |r| * r``. ``step`` counts from 1. Returns ``(w, m, v)``.
    """
    m = beta_1 * m + (1 - beta_1) * gradient
    v = beta_2 * v + (1 - beta_2) * tf.square(gradient)
    m_hat = m / (1 - tf.pow(beta_1, step))
    v_hat = v / (1 - tf.pow(beta_2, step))
    update = m_hat / (tf.sqrt(v_hat) + epsilon)
    if decay:
        update += decay * variable
    scale = (
        learning_rate * trust_ratio(tf.norm(variable), tf.norm(update)) if adapt else learning_rate
    )
    return variable - scale * update, m, v
