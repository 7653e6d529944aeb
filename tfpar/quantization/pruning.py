"""Magnitude pruning through tensorflow-model-optimization, under any tfpar strategy.

`prune` wraps the prunable layers in ``prune_low_magnitude`` with a polynomial
schedule from 0 to ``target_sparsity``; training needs TFMOT's step callback,
which `prune` returns with the model. `sparsity` measures the zeros of the
pruned kernels and `strip_pruning` removes the wrappers for export.

Examples:
    >>> with strategy.scope():  # doctest: +SKIP
    ...     pruned, callbacks = tfpar.quantization.prune(model, 0.8, end_step=500)
    ...     pruned.compile(...)
    >>> pruned.fit(..., callbacks=callbacks)  # doctest: +SKIP
    >>> tfpar.quantization.sparsity(pruned)  # doctest: +SKIP
    0.8
"""

from typing import Any

import numpy as np

from tfpar._checks import check_int
from tfpar.quantization._tfmot import check_graph_model, fresh_copy, load_tfmot, owned

__all__ = ["prune", "sparsity", "strip_pruning"]


def prune(
    model: Any, target_sparsity: float, *, begin_step: int = 0, end_step: int, frequency: int = 10
) -> tuple[Any, list]:
    """Returns ``(pruned_model, callbacks)``: a copy of the model with pruning wrappers (``model``
    keeps its weights), and the callbacks ``fit`` needs (TFMOT's ``UpdatePruningStep``).

    The sparsity grows polynomially from 0 at ``begin_step`` to ``target_sparsity``
    at ``end_step`` (global steps), masks updated every ``frequency`` steps.

    Raises:
        ValueError: a sparsity outside [0, 1), bad steps, or a subclassed model.
    """
    check_graph_model(model, "prune")
    if not isinstance(target_sparsity, (int, float)) or not 0 <= target_sparsity < 1:
        raise ValueError(
            f"target_sparsity must be in [0, 1). Received: target_sparsity={target_sparsity!r}."
        )
    check_int("begin_step", begin_step, 0)
    check_int("end_step", end_step, begin_step + 1, f" It must come after begin_step={begin_step}.")
    check_int("frequency", frequency, 1)
    tfmot = load_tfmot()
    schedule = tfmot.sparsity.keras.PolynomialDecay(
        initial_sparsity=0.0,
        final_sparsity=float(target_sparsity),
        begin_step=begin_step,
        end_step=end_step,
        frequency=frequency,
    )
    with model.distribute_strategy.scope():
        pruned = tfmot.sparsity.keras.prune_low_magnitude(
            fresh_copy(model), pruning_schedule=schedule
        )
    return owned(pruned), [tfmot.sparsity.keras.UpdatePruningStep()]


def sparsity(model: Any) -> float:
    """The fraction of zeros over the kernels that pruning masks (a pruned or stripped model)."""
    kernels = [w for w in model.weights if w.name.split("/")[-1].startswith("kernel")]
    if not kernels:
        raise ValueError(f"{model.name!r} has no kernel weights to measure.")
    zeros = sum(int(np.sum(k.numpy() == 0)) for k in kernels)
    return zeros / sum(int(np.prod(k.shape)) for k in kernels)


def strip_pruning(model: Any) -> Any:
    """The model without pruning wrappers (the pruned weights kept), for saving and export."""
    return load_tfmot().sparsity.keras.strip_pruning(model)
