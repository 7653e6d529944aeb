"""The models of the gradient-path matrix (`tfpar verify --paths`, tests/*/test_gradient_paths.py),
as users write them, in both Kerases: the text shape (an Embedding, a self-attention block with
LayerNormalization, Dense layers) and the image shape (Conv2D with a synchronized
BatchNormalization). Each ``*_model`` builds and compiles with Adam; each ``*_data`` returns
examples. ``module:function`` names them for ``tfpar verify --model/--data``."""

import importlib

import numpy as np


def _keras(name):
    if name == "keras3":
        return importlib.import_module("keras")
    import tfpar

    return tfpar.keras


def _text(k):
    tokens = k.Input((6,), dtype="int32")
    h = k.layers.Embedding(40, 16, name="embedding")(tokens)
    attended = k.layers.MultiHeadAttention(num_heads=2, key_dim=8, name="attention")(h, h)
    h = k.layers.LayerNormalization(name="norm")(h + attended)
    h = k.layers.GlobalAveragePooling1D()(h)
    h = k.layers.Dense(16, activation="relu", name="hidden")(h)
    outputs = k.layers.Dense(3, name="logits", dtype="float32")(h)
    model = k.Model(tokens, outputs, name="text")
    model.compile(k.optimizers.Adam(1e-2), k.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _image(k):
    model = k.Sequential([
        k.Input((8, 8, 1)),
        k.layers.Conv2D(4, 3, use_bias=False, name="conv"),
        k.layers.BatchNormalization(synchronized=True, name="norm"),
        k.layers.Activation("relu"),
        k.layers.Flatten(),
        k.layers.Dense(3, name="logits", dtype="float32"),
    ], name="image")
    model.compile(k.optimizers.Adam(1e-2), k.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def text_tf_keras():
    return _text(_keras("tf_keras"))


def text_keras3():
    return _text(_keras("keras3"))


def image_tf_keras():
    return _image(_keras("tf_keras"))


def image_keras3():
    return _image(_keras("keras3"))


def text_data():
    rng = np.random.default_rng(0)
    return rng.integers(0, 40, size=(64, 6)).astype("int32"), rng.integers(0, 3, size=64)


def image_data():
    rng = np.random.default_rng(1)
    return rng.normal(size=(64, 8, 8, 1)).astype("float32"), rng.integers(0, 3, size=64)
