"""The UCI digits that ship with tfpar (1,797 8x8 images, scikit-learn's ``load_digits``):
the demo's data, as arrays and as tf.data datasets."""

import os
from typing import Any

import numpy as np

from tfpar._keras import tf

__all__ = ["DIGITS_FILE", "digits_dataset", "digits_validation_dataset", "load_digits"]

DIGITS_FILE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_data", "digits.npz"
)
"""The digits: ``images`` (uint8, 1797 x 8 x 8, in 0..16) and ``target`` (uint8), an ``.npz`` as
Keras' ``mnist.npz`` (tfpar/_data/README.md says where they come from)."""


def load_digits(
    validation_fraction: float = 0.2, seed: int = 0
) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    """Returns ((x_train, y_train), (x_val, y_val)): 8x8x1 images in [0, 1]."""
    with np.load(DIGITS_FILE) as digits:
        x = (digits["images"] / 16.0).astype("float32")[..., None]
        y = digits["target"].astype("int64")
    order = np.random.default_rng(seed).permutation(len(x))
    split = int(len(x) * (1 - validation_fraction))
    train, val = order[:split], order[split:]
    return (x[train], y[train]), (x[val], y[val])


def digits_dataset() -> Any:
    """The training digits as a tf.data.Dataset of (image, label) examples (for ``tfpar tune``
    and ``tfpar verify --data tfpar.demo:digits_dataset``)."""
    (x, y), _ = load_digits()
    return tf.data.Dataset.from_tensor_slices((x, y))


def digits_validation_dataset() -> Any:
    """The validation digits (a fifth, never trained on) as a tf.data.Dataset of (image, label)
    examples (``tfpar tune --target val_accuracy=0.95``'s default validation data)."""
    _, (x, y) = load_digits()
    return tf.data.Dataset.from_tensor_slices((x, y))
