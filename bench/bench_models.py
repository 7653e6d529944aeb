"""Models and synthetic data shared by the benchmarks."""

import numpy as np

import tfpar

keras = tfpar.keras


def make_model(kind):
    """"cnn": a 66k-parameter conv net on 16x16 images; "mlp": a 2.6M-parameter MLP."""
    if kind == "cnn":
        return keras.Sequential([
            keras.layers.Input((16, 16, 1)),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
            keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10, activation="softmax"),
        ])
    return keras.Sequential([
        keras.layers.Input((784,)),
        keras.layers.Dense(1152, activation="relu"),
        keras.layers.Dense(1024, activation="relu"),
        keras.layers.Dense(512, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])


def make_data(kind, n, seed=0):
    rng = np.random.default_rng(seed)
    shape = (n, 16, 16, 1) if kind == "cnn" else (n, 784)
    return rng.normal(size=shape).astype("float32"), rng.integers(0, 10, size=n)
