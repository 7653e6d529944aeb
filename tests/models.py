"""Models and data shared by equivalence tests in this process and in child processes."""

import numpy as np

import tfpar

keras = tfpar.keras


def equivalence_model():
    """Conv, Dense and an active Dropout whose mask does not depend on the batch.

    A Dropout mask drawn per example differs between one device and several
    replicas by construction, so exact equality needs a mask shared across the
    batch (noise_shape) from a stateless seed: the same on every replica.
    """
    keras.utils.set_random_seed(1)
    return keras.Sequential([
        keras.layers.Input((8, 8, 1)),
        keras.layers.Conv2D(4, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dropout(0.3, noise_shape=(1, 144), seed=3, rng_type="stateless"),
        keras.layers.Dense(16, activation="tanh"),
        keras.layers.Dense(3),
    ])


def equivalence_data(n=96):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 8, 8, 1)).astype("float32")
    y = rng.integers(0, 3, size=n)
    return x, y


def compile_for_equivalence(model):
    model.compile(keras.optimizers.SGD(0.1, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def pipeline_model(regularize=True):
    """A Functional model with five cuttable layers (one L2-regularized) for pipeline tests."""
    keras.utils.set_random_seed(2)
    inputs = keras.Input((8, 8, 1))
    h = keras.layers.Conv2D(4, 3, activation="relu", name="conv")(inputs)
    h = keras.layers.Flatten(name="flatten")(h)
    h = keras.layers.Dense(16, activation="tanh", name="dense_a",
                           kernel_regularizer="l2" if regularize else None)(h)
    h = keras.layers.Dense(16, activation="tanh", name="dense_b")(h)
    outputs = keras.layers.Dense(3, name="logits")(h)
    return keras.Model(inputs, outputs, name="pipeline_model")


def max_weight_difference(a, b):
    return max(float(np.abs(u - v).max()) for u, v in zip(a.get_weights(), b.get_weights()))
