"""The model of Keras' tutorial "Text classification with Transformer" (keras.io), its subclassed
layers as the tutorial writes them: no ``get_config``, not registered, sublayers made in
``__init__`` and called from ``call``. A model tfpar did not write, for either Keras."""

import numpy as np

MAXLEN = 8
VOCAB = 40
EMBED = 16
HEADS = 2
FF = 32


def tutorial_classes(k):
    """The tutorial's ``TransformerBlock`` and ``TokenAndPositionEmbedding`` for Keras module
    ``k``."""
    layers = k.layers

    class TransformerBlock(layers.Layer):
        def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1, **kwargs):
            super().__init__(**kwargs)
            self.att = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
            self.ffn = k.Sequential(
                [layers.Dense(ff_dim, activation="relu"), layers.Dense(embed_dim)]
            )
            self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
            self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
            self.dropout1 = layers.Dropout(rate)
            self.dropout2 = layers.Dropout(rate)

        def call(self, inputs, training=False):
            attn_output = self.att(inputs, inputs)
            attn_output = self.dropout1(attn_output, training=training)
            out1 = self.layernorm1(inputs + attn_output)
            ffn_output = self.ffn(out1)
            ffn_output = self.dropout2(ffn_output, training=training)
            return self.layernorm2(out1 + ffn_output)

    class TokenAndPositionEmbedding(layers.Layer):
        def __init__(self, maxlen, vocab_size, embed_dim, **kwargs):
            super().__init__(**kwargs)
            self.token_emb = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
            self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

        def call(self, x):
            import tensorflow as tf

            maxlen = tf.shape(x)[-1]
            positions = tf.range(start=0, limit=maxlen, delta=1)
            positions = self.pos_emb(positions)
            x = self.token_emb(x)
            return x + positions

    return TransformerBlock, TokenAndPositionEmbedding


def tutorial_model(k, seed=1):
    """The tutorial's classifier (dropout 0: two runs compare exactly), built with ``seed``."""
    transformer_block, token_and_position_embedding = tutorial_classes(k)
    k.utils.set_random_seed(seed)
    inputs = k.layers.Input(shape=(MAXLEN,))
    x = token_and_position_embedding(MAXLEN, VOCAB, EMBED)(inputs)
    x = transformer_block(EMBED, HEADS, FF, rate=0.0)(x)
    x = k.layers.GlobalAveragePooling1D()(x)
    outputs = k.layers.Dense(2, activation="softmax")(x)
    return k.Model(inputs=inputs, outputs=outputs)


def tutorial_data(examples=32):
    """Token ids and labels for `tutorial_model`."""
    rng = np.random.default_rng(0)
    return rng.integers(0, VOCAB, (examples, MAXLEN)), rng.integers(0, 2, examples)


def two_block_model(k, rate):
    """Two of the tutorial's TransformerBlocks ("block_a", "block_b") at dropout ``rate`` between an
    Embedding and 3 logits, compiled with Adam; the model and the block's class."""
    k.utils.set_random_seed(1)
    block = tutorial_classes(k)[0]
    inputs = k.Input((8,), dtype="int32")
    x = k.layers.Embedding(50, 16, name="embedding")(inputs)
    x = block(16, 2, 32, rate=rate, name="block_a")(x)
    x = block(16, 2, 32, rate=rate, name="block_b")(x)
    x = k.layers.GlobalAveragePooling1D()(x)
    model = k.Model(inputs, k.layers.Dense(3)(x))
    model.compile(k.optimizers.Adam(1e-2), k.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model, block
