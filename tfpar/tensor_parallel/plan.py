"""A tensor-parallel plan as data: which layer is split in which style (no TensorFlow).

A plan maps layer names, or regular expressions matched against the whole name (as Keras'
``LayoutMap`` does), to a style:

- ``"column"``: Dense, EinsumDense. Split: the kernel's output columns (and the bias).
  Communication (Megatron's conjugate operators): forward: none (all-gather only if no row
  layer takes the split output); backward: all-reduce of the input's gradient.
- ``"row"``: Dense, EinsumDense. Split: the kernel's input rows; the bias is kept whole.
  Communication: forward: all-reduce of the partial outputs; backward: none.
- ``"heads"``: MultiHeadAttention. Split: Q, K and V by heads (columns), the output projection
  by heads (rows). Communication: one all-reduce forward, one backward.
- ``"vocab"``: Embedding. Split: the table's rows (the vocabulary). Communication: one
  all-reduce forward.

A row layer takes the split output of a column layer (through element-wise layers such as an
activation or dropout), so an MLP pair costs one reduction forward and one backward, and no
gather between them.

Examples:
    >>> match_plan({"mlp_up": "column", "mlp_down": "row"}, ["inputs", "mlp_up", "mlp_down"])
    {'mlp_up': 'column', 'mlp_down': 'row'}
    >>> match_plan({"block_.*_up": "column"}, ["block_0_up", "block_1_up", "head"])
    {'block_0_up': 'column', 'block_1_up': 'column'}
"""

import re
from collections.abc import Mapping, Sequence

__all__ = ["STYLES", "LAYERS_OF_STYLE", "match_plan", "parse_style"]

STYLES = ("column", "row", "heads", "vocab")
"""The ways a layer can be split over the tensor-parallel devices."""

LAYERS_OF_STYLE = {
    "column": ("Dense", "EinsumDense"),
    "row": ("Dense", "EinsumDense"),
    "heads": ("MultiHeadAttention",),
    "vocab": ("Embedding",),
}
"""The Keras layer classes each style can split."""


def parse_style(style: str) -> tuple[str, int | None]:
    """``(style, kernel axis or None)`` of a style: ``"column:1"`` splits a Dense or EinsumDense's
    kernel on its axis 1 (by columns).

    Examples:
        >>> parse_style("row:0")
        ('row', 0)
        >>> parse_style("heads")
        ('heads', None)

    Raises:
        ValueError: an unknown style, or an axis on a style that has none.
    """
    base, separator, axis = style.partition(":")
    with_axis = bool(separator)
    if base not in STYLES or (with_axis and (base not in ("column", "row") or not axis.isdigit())):
        raise ValueError(
            f"Unknown tensor-parallel style. Received: {style!r}. Valid styles: "
            f"{STYLES}, or 'column:<kernel axis>' / 'row:<kernel axis>'."
        )
    return base, int(axis) if axis else None


def match_plan(plan: Mapping[str, str], layer_names: Sequence[str]) -> dict[str, str]:
    """The style of each planned layer: ``plan``'s keys are layer names or regular expressions
    matched against whole names; the first key that matches a layer gives its style.

    Raises:
        TypeError: ``plan`` is not a mapping of strings to strings.
        ValueError: an unknown style, a bad pattern, or a key that matches no layer.
    """
    if not isinstance(plan, Mapping) or not plan:
        raise TypeError(
            "plan must be a non-empty dict from layer names (or regular expressions) to styles "
            f"{STYLES}. Received: plan={plan!r}. For example: "
            "plan={'mlp_up': 'column', 'mlp_down': 'row', 'attention': 'heads'}."
        )
    patterns = []
    for key, style in plan.items():
        if not isinstance(key, str) or not isinstance(style, str):
            raise TypeError(
                f"plan maps layer names (str) to styles (str). Received: {key!r}: {style!r}."
            )
        try:
            parse_style(style)
        except ValueError:
            message = (
                f"plan[{key!r}] is an unknown style. Received: {style!r}. Valid styles: "
                f"{STYLES}, or 'column:<kernel axis>' / 'row:<kernel axis>'."
            )
            raise ValueError(message) from None
        try:
            patterns.append((key, re.compile(key), style))
        except re.error as error:
            raise ValueError(
                f"plan key {key!r} is neither a layer name nor a valid regular expression "
                f"({error}). Received: {key!r}."
            ) from None
    styles: dict[str, str] = {}
    used = set()
    for name in layer_names:
        for key, pattern, style in patterns:
            if key == name or pattern.fullmatch(name):
                styles[name] = style
                used.add(key)
                break
    unused = [key for key, _, _ in patterns if key not in used]
    if unused:
        raise ValueError(
            f"plan names layer(s) the model does not have: {unused}. "
            f"Received: plan={dict(plan)!r}. "
            f"The model's layers: {list(layer_names)}. Name a layer by its path from the model "
            "down (e.g. 'backbone/transformer_layer_0/self_attention'), or fix the pattern."
        )
    return styles
