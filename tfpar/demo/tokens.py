"""A small transformer language model and generated tokens for it (no download): what `tfpar demo`,
`tfpar verify` and `bench/model_parallel.py` split with tensor parallelism.

The tokens follow a hidden rule: each token is followed by ``successor[token]`` (a fixed random
permutation of the vocabulary) with probability ``1 - noise``, else by a random token. A model that
learns the rule predicts the next token with accuracy about ``1 - noise``.
"""

from typing import Any

import numpy as np

from tfpar._keras import keras

__all__ = ["TRANSFORMER_PLAN", "token_data", "transformer"]

TRANSFORMER_PLAN = {
    "embed": "vocab",
    r"block\d+_attention": "heads",
    r"block\d+_up": "column",
    r"block\d+_down": "row",
}
"""The Megatron plan of `transformer`, by layer name (what ``plan="auto"`` finds too)."""


def transformer(
    k: Any = None,
    *,
    vocab: int = 64,
    length: int = 16,
    dim: int = 32,
    heads: int = 4,
    blocks: int = 2,
    hidden: int | None = None,
    seed: int = 0,
) -> Any:
    """A causal transformer language model in Keras ``k`` (default tf_keras): a token embedding,
    ``blocks`` pre-norm blocks (MultiHeadAttention, an MLP of ``hidden`` units, LayerNorm,
    residuals) and a head over the vocabulary. Its output is each position's next-token logits."""
    k = k or keras
    k.utils.set_random_seed(seed)
    hidden = hidden or 4 * dim
    tokens = k.Input((length,), dtype="int32", name="tokens")
    x = k.layers.Embedding(vocab, dim, name="embed")(tokens)
    for b in range(blocks):
        h = k.layers.LayerNormalization(name=f"block{b}_norm1")(x)
        h = k.layers.MultiHeadAttention(heads, dim // heads, name=f"block{b}_attention")(
            h, h, use_causal_mask=True
        )
        x = k.layers.Add(name=f"block{b}_residual1")([x, h])
        h = k.layers.LayerNormalization(name=f"block{b}_norm2")(x)
        h = k.layers.Dense(hidden, activation="gelu", name=f"block{b}_up")(h)
        h = k.layers.Dense(dim, name=f"block{b}_down")(h)
        x = k.layers.Add(name=f"block{b}_residual2")([x, h])
    x = k.layers.LayerNormalization(name="final_norm")(x)
    logits = k.layers.Dense(vocab, name="head", dtype="float32")(x)
    return k.Model(tokens, logits, name="token_transformer")


def token_data(
    n: int, *, vocab: int = 64, length: int = 16, noise: float = 0.05, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` sequences of ``length + 1`` generated tokens as (inputs, next tokens), int32."""
    rng = np.random.default_rng(seed)
    # the rule is the same for every seed
    successor = np.random.default_rng(1234).permutation(vocab)
    seq = np.empty((n, length + 1), np.int32)
    seq[:, 0] = rng.integers(0, vocab, n)
    for t in range(length):
        follow = rng.random(n) >= noise
        seq[:, t + 1] = np.where(follow, successor[seq[:, t]], rng.integers(0, vocab, n))
    return seq[:, :-1], seq[:, 1:]
