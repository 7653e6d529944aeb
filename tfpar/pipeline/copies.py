"""What ties a flattened pipeline's stages (`flat.py`) to the model they were copied from: a
weight two stages hold (a tied embedding: the first stage looks tokens up, the last computes the
logits with it) takes the sum of its copies' gradients in each copy, so the copies take the same
steps, as Megatron-LM keeps its first and last stages' embeddings; what would step it otherwise is
refused; and the trained weights are copied back into the user's model."""

import functools
from typing import Any

from tfpar.pipeline.executor import add_gradients
from tfpar.tensor_parallel.nested import own_variables, plain_weights_back

__all__ = ["check_tied", "copy_back", "tied_gradients"]


def tied_gradients(copies: list, pairs: list) -> list:
    """``pairs`` ((gradient, variable), summed over microbatches) with each weight (or part) that
    several stages hold (``copies``: `StageCopy` per stage) given the sum of its copies'
    gradients, in every copy, also one its own stage does not use (an untied embedding's output
    table in the first stage), so that the copies take the same steps."""
    key_of = {}
    for held in copies:
        key_of.update(held.keys)
    gradients: dict = {}
    for gradient, variable in pairs:
        gradients.setdefault(key_of[id(variable)], []).append(gradient)
    summed = {key: functools.reduce(add_gradients, found) for key, found in gradients.items()}
    return [
        (summed[key_of[id(v)]], v)
        for held in copies
        for v in held.stage.trainable_variables
        if key_of[id(v)] in summed
    ]


def check_tied(copies: list, optimizer: Any) -> None:
    """Refuses what would step a weight two stages hold (a tied embedding) otherwise than the plain
    model: a global norm clip (each copy's gradient would count in the norm) or a regularizer on
    its layer (its loss would count in each stage).

    Raises:
        ValueError: ``optimizer`` clips by the global norm, or a tied layer has a regularizer.
    """
    counts: dict = {}
    for held in copies:
        for key in set(held.keys.values()):
            counts[key] = counts.get(key, 0) + 1
    tied = {key for key, count in counts.items() if count > 1}
    if not tied:
        return
    if getattr(optimizer, "global_clipnorm", None):
        raise ValueError(
            "A weight of this pipeline is held by two stages (a tied embedding: the first looks "
            "tokens up, the last computes logits), and global_clipnorm would count its gradient "
            f"twice in the norm. Received: global_clipnorm={optimizer.global_clipnorm}. Use "
            "clipnorm (each gradient by its own norm), or untie the embedding."
        )
    for held in copies:
        for layer in held.stage.parts:
            for sub in layer._flatten_layers(include_self=True):
                # not get_config(): Llama's fails
                regularized = [
                    k for k, v in vars(sub).items() if k.endswith("_regularizer") and v is not None
                ]
                shared = any(held.keys.get(id(v)) in tied for v in own_variables(sub))
                if regularized and shared:
                    raise ValueError(
                        f"Layer {sub.name!r} is held by two stages (tied) and has {regularized}: "
                        "its loss would count in each stage. Received: a regularized tied "
                        "layer. Remove its regularizer (or use AdamW's weight decay)."
                    )


def copy_back(source: Any, copies: list) -> None:
    """Assigns ``source``'s weights from the stages' copies: a split layer's whole, every other
    layer's own (a layer two stages hold is equal in both)."""
    for held in copies:
        plain_weights_back(source, held.twins, held.splits)
