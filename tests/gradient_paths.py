"""The models of the gradient-path matrix (`tfpar verify --paths`, tests/*/test_gradient_paths.py),
as users write them, in both Kerases: the text shape (an Embedding, a self-attention block with
LayerNormalization, Dense layers) and the image shape (Conv2D with a synchronized
BatchNormalization). Each ``*_model`` builds and compiles with Adam; each ``*_data`` returns
examples. ``module:function`` names them for ``tfpar verify --model/--data``."""

import importlib

import numpy as np

_PER_ACCUMULATED_STEP = "BatchNormalization statistics taken per accumulated step"
EXPECTED_DIFFERENCES = {
    ("image", "tf_keras", "accumulate"): _PER_ACCUMULATED_STEP,
    ("image", "tf_keras", "zero1+accumulate"): _PER_ACCUMULATED_STEP,
    ("image", "tf_keras", "zero2+accumulate"): _PER_ACCUMULATED_STEP,
    ("image", "tf_keras", "accumulate+mixed_float16"): _PER_ACCUMULATED_STEP,
    # The one-replica reference (Keras 3's own accumulation inside its LossScaleOptimizer) skips a
    # step for an overflow that the 2 replicas' halved gradients do not reach: said, not hidden.
    ("text", "keras3", "accumulate+mixed_float16"): "loss-scale skips differ",
}
"""The rows that differ by what they are, each with the reason verify gives."""
SAME_CODE_AS_ZERO1 = {"zero2", "bf16+zero2", "fp16+zero2", "zero2+mixed_float16"}
"""Stage 2 differs from stage 1 only where it accumulates (tfpar.strategies._zero: the sum a replica
keeps between updates); without accumulation the two run one code path, so these rows are stage 1's
and are left out where stage 1's are run (stage 2 without accumulation runs across workers in
tests/multiproc/test_data_parallel_multiworker.py's "zero-2" group, under Horovod in test_horovod's
ZeRO cases)."""


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
    model = k.Sequential(
        [
            k.Input((8, 8, 1)),
            k.layers.Conv2D(4, 3, use_bias=False, name="conv"),
            k.layers.BatchNormalization(synchronized=True, name="norm"),
            k.layers.Activation("relu"),
            k.layers.Flatten(),
            k.layers.Dense(3, name="logits", dtype="float32"),
        ],
        name="image",
    )
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


def keras_hub_task(name, examples=48, kv_heads=1, blocks=2):
    """KerasHub's task model ``name`` (tiny config: ``blocks`` blocks, hidden 16, random weights,
    no preprocessor; Llama's and Gemma's ``kv_heads`` key/value heads for their 2 query heads),
    compiled as its users compile it, and ``examples`` examples for it."""
    import keras
    import keras_hub

    models = keras_hub.models
    ids = np.random.default_rng(0).integers(0, 64, size=(examples, 8)).astype("int32")
    x = {"token_ids": ids, "padding_mask": np.ones_like(ids, dtype=bool)}
    y = np.roll(ids, -1, axis=1)
    sizes = {"vocabulary_size": 64, "num_layers": blocks, "hidden_dim": 16, "intermediate_dim": 32}
    if name == "gpt2":
        backbone = models.GPT2Backbone(**sizes, num_heads=2, max_sequence_length=16, dropout=0.0)
        model = models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    elif name == "bert":
        backbone = models.BertBackbone(**sizes, num_heads=2, max_sequence_length=16, dropout=0.0)
        model = models.BertTextClassifier(
            backbone=backbone, num_classes=2, preprocessor=None, dropout=0.0
        )
        x["segment_ids"] = np.zeros_like(ids)
        y = ids[:, 0] % 2
    elif name == "bert_masked_lm":  # its head holds the backbone's embedding (tied logits)
        backbone = models.BertBackbone(**sizes, num_heads=2, max_sequence_length=16, dropout=0.0)
        model = models.BertMaskedLM(backbone=backbone, preprocessor=None)
        x["segment_ids"] = np.zeros_like(ids)
        x["mask_positions"] = np.tile(np.array([[1, 3]], "int32"), (examples, 1))
        y = ids[:, [1, 3]]
    elif name == "llama":
        backbone = models.LlamaBackbone(**sizes, num_query_heads=2, num_key_value_heads=kv_heads)
        model = models.LlamaCausalLM(backbone=backbone, preprocessor=None)
    else:
        backbone = models.GemmaBackbone(
            **sizes, num_query_heads=2, num_key_value_heads=kv_heads, head_dim=8
        )
        model = models.GemmaCausalLM(backbone=backbone, preprocessor=None)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(keras.optimizers.Adam(1e-2), loss)
    return model, x, y


def gpt2_keras_hub():
    """KerasHub's GPT2CausalLM, tiny, compiled with Adam (`keras_hub_task`)."""
    return keras_hub_task("gpt2")[0]


def gpt2_data():
    """Its examples as GPT-2's preprocessor gives them: ``({token_ids, padding_mask}, next
    tokens)``."""
    import tensorflow as tf

    _, x, y = keras_hub_task("gpt2", examples=64)
    return tf.data.Dataset.from_tensor_slices((x, y))
