"""Activation checkpointing (rematerialization) of a model tfpar owns: the ``remat`` option of its
parallelisms.

``remat="blocks"`` makes each block of the model (a layer with sublayers: a KerasHub backbone's
transformer layer, a tutorial's ``TransformerBlock``) keep only its inputs in the forward pass and
run its forward again in the backward pass, one block at a time (`tf.recompute_grad`); a list of
layer names or fnmatch patterns chooses the blocks; ``"none"`` (the default) keeps every
activation. The trained weights are those of the same steps without it: a recomputed Dropout drops
the units its forward dropped, a BatchNormalization moves its statistics once (Keras 3; tf_keras
keeps such blocks, and ``describe()`` says why).
"""

import dataclasses
from typing import Any

from tfpar.remat._blocks import RematPlan, check_remat, plan_remat

__all__ = [
    "RematPlan",
    "apply_remat",
    "check_remat",
    "plan_remat",
    "remat_check",
    "remat_lines",
]


def apply_remat(model: Any, remat: Any) -> RematPlan:
    """Makes the blocks `plan_remat` chooses recompute their activations; returns the plan.
    Keras 3's own RematScope recomputation stops in each recomputed block and inside it (it would
    recompute a layer once more, and a Dropout or a BatchNormalization from the state their
    forward changed), in each kept block, and in the models (tfpar recomputes their blocks)."""
    from tfpar import _compat
    from tfpar.remat._recompute import recomputing

    plan = plan_remat(model, remat)
    for block in plan.recomputed:
        for layer in _compat.flatten_layers(block):
            _compat.stop_keras3_remat(layer)
    for layer in plan.taken:
        _compat.stop_keras3_remat(layer)
    for layer in plan.recomputed:
        if not layer.__dict__.get("_tfpar_remat"):
            recomputing(layer)
    return plan


@dataclasses.dataclass(frozen=True)
class _RematCheck:
    """The ``("fit", "before")`` check of a model tfpar owns: its blocks set up before its train
    step is traced. Equal checks are one (`tfpar._owned` keeps a check once)."""

    remat: object

    def __call__(self, model, arguments):
        apply_remat(model, self.remat)


def remat_check(remat: Any) -> tuple:
    """The model checks (`tfpar._owned`) of a parallelism's ``remat`` option (with "none" too: a
    Keras 3 RematScope in the model is honoured)."""
    return (("fit", "before", _RematCheck(remat)),)


def remat_lines(remat: Any, model: Any = None) -> list[str]:
    """A parallelism's ``describe()`` lines of its ``remat`` option: with ``model``, the blocks
    recomputed and those kept (`RematPlan.lines`)."""
    if model is not None:
        return plan_remat(model, remat).lines()
    if remat == "none":
        return []
    return [f"  remat:      {remat!r} (the blocks: describe(model=...))"]
