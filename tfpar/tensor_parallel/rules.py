"""Which layer a style can split, and how: the rules, read from a layer's class and config.

A Dense or EinsumDense splits one axis of its kernel:
- by columns, an axis the output has and the input has not (by default the kernel's last axis, the
  output's last): each device computes its block of the output along that axis;
- by rows, an axis contracted with the input (by default the one of the input's last axis): each
  device takes its block of the input along it, and the partial outputs are summed.

A style ``"column:<k>"`` or ``"row:<k>"`` names the kernel's axis ``k`` itself (`plan.parse_style`),
as a Keras ``LayoutMap`` does (`layouts.py`).
"""

from typing import Any, NamedTuple

from tfpar.tensor_parallel.plan import LAYERS_OF_STYLE, parse_style

__all__ = ["NOT_ELEMENTWISE", "DenseSplit", "dense_split", "einsum_parts", "kind_of", "split_error"]

NOT_ELEMENTWISE = ("softmax", "log_softmax")


class DenseSplit(NamedTuple):
    """Where a Dense or EinsumDense is cut."""

    kernel_axis: int
    """The kernel's axis split over the devices."""
    activation_axis: int
    """The output's axis (by columns) or the input's (by rows) cut with it, from the end."""
    bias_axis: int | None
    """The bias' axis split with it (counted from the end), or None: the bias is kept whole."""


def einsum_parts(equation: str) -> tuple[str, str, str]:
    """(input, kernel, output) subscripts of an EinsumDense equation."""
    inputs, output = equation.split("->")
    x, kernel = inputs.split(",")
    return x, kernel, output


def kind_of(layer: Any, style: str, keras_module: Any) -> str | None:
    """The Keras class name of ``layer`` among those ``style`` splits, or None."""
    kinds = LAYERS_OF_STYLE[parse_style(style)[0]]
    return next((k for k in kinds if isinstance(layer, getattr(keras_module.layers, k))), None)


def dense_split(config: dict, style: str) -> DenseSplit:
    """Where ``style`` ("column" or "row", maybe with a kernel axis) cuts a Dense (``config`` with
    no "equation") or an EinsumDense; `split_error` says first whether it can."""
    base, axis = parse_style(style)
    equation = config.get("equation")
    if equation is None:  # Dense: kernel [inputs, units]
        if base == "column":
            return DenseSplit(1, -1, -1)
        return DenseSplit(0, -1, None)
    x, kernel, out = einsum_parts(equation)
    if axis is None:
        axis = len(kernel) - 1 if base == "column" else kernel.index(x[-1])
    letter = kernel[axis]
    if base == "row":
        return DenseSplit(axis, x.index(letter) - len(x), None)
    bias_axes = config.get("bias_axes") or ""
    # The bias is aligned with the output's last axes, so it follows the output's axis from the end.
    output_axis = out.index(letter) - len(out)
    return DenseSplit(axis, output_axis, output_axis if letter in bias_axes else None)


def split_error(layer: Any, style: str, degree: int, kind: str) -> str | None:
    """Why ``layer`` (class ``kind``) cannot be split ``degree`` ways in ``style``, or None."""
    config = layer.get_config()
    adapted = _adapted_error(layer)
    if adapted:
        return adapted
    if kind in ("Dense", "EinsumDense"):
        return _dense_error(layer, config, style, degree)
    if kind == "MultiHeadAttention":
        return _attention_error(layer, config, degree)
    if kind == "Embedding":
        return _embedding_error(layer, config, degree)
    return None


def _adapted_error(layer):
    """Why a layer with LoRA or quantized weights (Keras 3's ``enable_lora``, ``quantize``; in it
    or a sublayer) cannot be split, or None: tfpar splits float kernels, not their factors or
    scales."""
    for part in [layer, *layer._flatten_layers(include_self=False)]:
        mode = getattr(part, "quantization_mode", None)
        if getattr(part, "lora_enabled", False) or mode:
            what = f"quantized ({mode})" if mode else "LoRA enabled"
            where = "" if part is layer else f" in {part.name!r}"
            return (
                f"layer {layer.name!r} has {what}{where}, "
                "and tensor parallelism splits float kernels, not their LoRA factors or "
                "quantization scales. Split the model before enable_lora() or quantize(), or "
                "leave the layer replicated."
            )
    return None


def _dense_error(layer, config, style, degree):
    name = layer.name
    base, axis = parse_style(style)
    kernel = tuple(layer.kernel.shape)
    if axis is not None and axis >= len(kernel):
        return (
            f"layer {name!r} has a kernel of rank {len(kernel)}, which has no axis {axis}. "
            f"Received: style {style!r}. Name an axis below {len(kernel)}."
        )
    equation = config.get("equation")
    if equation is not None:
        x, k, out = einsum_parts(equation)
        letter = k[axis] if axis is not None else None
        if base == "column" and axis is None and not (k[-1] == out[-1] and k[-1] not in x):
            return (
                f"layer {name!r} (EinsumDense {equation!r}) cannot be split by columns: its "
                "kernel's last axis is not the output's last axis. Split it by rows, name the "
                "kernel's axis ('column:<axis>'), or leave it replicated."
            )
        if base == "column" and axis is not None and not (letter in out and letter not in x):
            return (
                f"layer {name!r} (EinsumDense {equation!r}) cannot be split by columns "
                f"along its kernel's axis {axis} ({letter!r}): the output must have that axis "
                f"and the input not. Received: style {style!r}. Split an axis of the output."
            )
        if base == "row" and axis is None and not (x[-1] in k and x[-1] not in out):
            return (
                f"layer {name!r} (EinsumDense {equation!r}) cannot be split by rows: the "
                "input's last axis is not contracted with the kernel. Split it by columns, or "
                "leave it replicated."
            )
        if base == "row" and axis is not None and not (letter in x and letter not in out):
            return (
                f"layer {name!r} (EinsumDense {equation!r}) cannot be split by rows along its "
                f"kernel's axis {axis} ({letter!r}): the input must have that axis and the "
                f"output not. Received: style {style!r}. Split an axis contracted with the "
                "input."
            )
    elif axis is not None and axis != (1 if base == "column" else 0):
        return (
            f"layer {name!r} (Dense) splits its kernel's axis 1 by columns and 0 by rows. "
            f"Received: style {style!r}. Use 'column' or 'row'."
        )
    cut = dense_split(config, style).kernel_axis
    if kernel[cut] % degree:
        what = "output columns (units)" if base == "column" else "input rows"
        return (
            f"layer {name!r} has {kernel[cut]} {what}, which the tensor-parallel degree does "
            f"not divide. Received: degree={degree}. Use a degree that divides {kernel[cut]}, "
            f"or leave {name!r} out of the plan."
        )
    if base == "column" and config.get("activation") in NOT_ELEMENTWISE:
        return (
            f"layer {name!r} ends in activation={config['activation']!r}, which mixes the "
            "columns a device holds with the others'. Split it by rows, or move the activation "
            "to its own layer."
        )
    return None


def _attention_error(layer, config, degree):
    name = layer.name
    if config["num_heads"] % degree:
        return (
            f"layer {name!r} has num_heads={config['num_heads']}, which the tensor-parallel "
            f"degree does not divide. Received: degree={degree}. Use a degree that divides "
            f"{config['num_heads']}."
        )
    unsupported = {}
    if config.get("output_shape") is not None:
        unsupported["output_shape"] = config["output_shape"]
    axes = config.get("attention_axes")
    if axes is not None and tuple(axes) != (1,):
        unsupported["attention_axes"] = axes
    if getattr(layer, "_gate_dense", None) is not None:
        unsupported["gate"] = True
    if unsupported:
        return (
            f"layer {name!r} (MultiHeadAttention) is split by heads only with its default "
            f"output and attention axes. Received: {unsupported}. Leave it out of the plan."
        )
    return None


def _embedding_error(layer, config, degree):
    name = layer.name
    if config["input_dim"] % degree:
        return (
            f"layer {name!r} has a vocabulary of input_dim={config['input_dim']}, which the "
            f"tensor-parallel degree does not divide. Received: degree={degree}. Pad the "
            f"vocabulary to a multiple of {degree}."
        )
    if config.get("mask_zero"):
        return (
            f"layer {name!r} has mask_zero=True: a tensor-parallel model does not carry Keras "
            "masks. Pass attention_mask= to the attention instead, or leave it out of the "
            "plan."
        )
    return None
