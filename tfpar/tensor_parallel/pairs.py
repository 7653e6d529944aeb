"""The column/row pairs of a functional model's layer graph: which column layers' outputs stay
split on their way to a row layer, through element-wise layers run on each device
(`split_outputs`), and Megatron's plan of the model's top-level layers (`auto_plan`)."""

from typing import Any

from tfpar import _compat
from tfpar.tensor_parallel.rules import NOT_ELEMENTWISE, kind_of, split_error

__all__ = ["ELEMENTWISE", "auto_plan", "is_elementwise", "split_outputs"]

ELEMENTWISE = ("Activation", "Dropout", "ReLU", "LeakyReLU", "ELU")
"""Layers a split activation passes through part by part (an Activation other than softmax)."""


def is_elementwise(layer: Any, keras_module: Any) -> bool:
    """Whether a split activation passes through ``layer`` part by part (`ELEMENTWISE`)."""
    kinds: Any = tuple(getattr(keras_module.layers, n) for n in ELEMENTWISE)
    if not isinstance(layer, kinds):
        return False
    return layer.get_config().get("activation") not in NOT_ELEMENTWISE


def _graph_index(model):
    """``model``'s graph steps (`_compat.graph_steps`), with which steps read each tensor, which
    step made it, and how many times each layer is called."""
    _, steps, _ = _compat.graph_steps(model)
    consumers: dict = {}
    producer: dict = {}
    calls: dict = {}
    for index, (layer, inputs, outputs, _) in enumerate(steps):
        for key in inputs:
            consumers.setdefault(key, []).append(index)
        for key in outputs:
            producer[key] = index
        calls[layer.name] = calls.get(layer.name, 0) + 1
    return steps, consumers, producer, calls


def split_outputs(model: Any, styles: dict[str, str], keras_module: Any) -> set[str]:
    """The column layers whose output stays split (every use reaches a row layer through
    element-wise layers), after checking that every row layer's input comes split that way.

    Raises:
        ValueError: a planned layer called more than once, or a row layer whose input is not the
            split output of column layers.
    """
    steps, consumers, producer, calls = _graph_index(model)
    for name in styles:
        if calls.get(name, 0) > 1:
            raise ValueError(
                f"layer {name!r} is called {calls[name]} times in the model; a planned layer must "
                "be called once. Leave the shared layer out of the plan."
            )

    def reaches_rows(key):
        """Whether every use of the tensor ``key`` ends in a row layer through element-wise
        layers."""
        uses = consumers.get(key, [])
        if not uses:
            return False
        for index in uses:
            layer, inputs, outputs, _ = steps[index]
            if styles.get(layer.name) == "row" and inputs == [key]:
                continue
            if is_elementwise(layer, keras_module) and len(inputs) == 1 and len(outputs) == 1:
                if not reaches_rows(outputs[0]):
                    return False
                continue
            return False
        return True

    def source_columns(key):
        """The column layers a row layer's input comes from, through element-wise layers (None:
        not split)."""
        if key not in producer:
            return None
        layer, inputs, _, _ = steps[producer[key]]
        if styles.get(layer.name) == "column":
            return [layer.name]
        if is_elementwise(layer, keras_module) and len(inputs) == 1:
            return source_columns(inputs[0])
        return None

    kept = {
        layer.name
        for layer, _, outputs, _ in steps
        if styles.get(layer.name) == "column" and reaches_rows(outputs[0])
    }
    for layer, inputs, _, _ in steps:
        if styles.get(layer.name) != "row":
            continue
        columns = source_columns(inputs[0]) if len(inputs) == 1 else None
        if not columns or not set(columns) <= kept:
            raise ValueError(
                f"layer {layer.name!r} is planned 'row', and its input is not the split output of "
                f"a 'column' layer. Received: plan {dict(styles)!r}. "
                f"Plan the Dense that feeds {layer.name!r} as 'column' "
                "(its output must go only to row layers, through activations or dropout), or plan "
                f"{layer.name!r} as 'column' itself."
            )
    return kept


def auto_plan(model: Any, degree: int, keras_module: Any) -> dict[str, str]:
    """Megatron's plan for ``model`` (DeepSpeed calls it AutoTP): each MultiHeadAttention by heads,
    each Embedding by vocabulary, and each Dense whose output goes (through element-wise layers) to
    one Dense only as a column/row pair, where ``degree`` divides what is split."""
    steps, consumers, _, calls = _graph_index(model)

    def fits(layer, style):
        kind = kind_of(layer, style, keras_module)
        return (
            kind is not None
            and calls[layer.name] == 1
            and split_error(layer, style, degree, kind) is None
        )

    def next_dense(key):
        """The one layer the tensor ``key`` reaches through element-wise layers, if it is one."""
        uses = consumers.get(key, [])
        if len(uses) != 1:
            return None
        layer, inputs, outputs, _ = steps[uses[0]]
        if is_elementwise(layer, keras_module) and len(outputs) == 1:
            return next_dense(outputs[0])
        return layer if len(inputs) == 1 else None

    plan: dict = {}
    for layer, _, outputs, _ in steps:
        if layer.name in plan:
            continue
        if fits(layer, "heads"):
            plan[layer.name] = "heads"
        elif fits(layer, "vocab"):
            plan[layer.name] = "vocab"
        elif fits(layer, "column") and len(outputs) == 1:
            following = next_dense(outputs[0])
            if following is not None and following.name not in plan and fits(following, "row"):
                plan[layer.name], plan[following.name] = "column", "row"
    return plan
