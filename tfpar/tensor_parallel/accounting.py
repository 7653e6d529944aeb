"""What a split model holds and what its step costs beyond Megatron's reductions: the bytes each
device holds (from where each variable lives), and the column outputs a custom layer reads whole
(each an all-gather), as `describe()` lines."""

from typing import Any

from tfpar._keras import tf

__all__ = ["bytes_by_device", "describe_bytes", "describe_gathers"]


def bytes_by_device(weights: list, optimizer: Any = None) -> dict[str, dict[str, int]]:
    """``{device: {"weights": bytes, "optimizer": bytes}}`` of ``weights`` and ``optimizer``'s
    slots, from where each variable lives."""
    held: dict = {}
    groups = [("weights", weights)]
    if optimizer is not None:
        groups.append(("optimizer", [v for v in optimizer.variables if tuple(v.shape)]))
    for group, variables in groups:
        for variable in variables:
            # Keras 3's variable holds a tf.Variable in .value (tf's .value is a method)
            value = getattr(variable, "value", None)
            value = variable if value is None or callable(value) else value
            device = tf.DeviceSpec.from_string(value.device)
            name = f"/{device.device_type}:{device.device_index}"
            entry = held.setdefault(name, {"weights": 0, "optimizer": 0})
            entry[group] += _nbytes(variable)
    return held


def describe_bytes(held: dict[str, dict[str, int]]) -> list[str]:
    """`bytes_by_device`'s figures as `describe()` lines, each device against one device's total."""
    total = sum(sum(h.values()) for h in held.values())
    return [
        f"  {device}: weights {h['weights']:,} B, optimizer {h['optimizer']:,} B "
        f"({sum(h.values()) / total:.0%} of one device's {total:,} B)"
        for device, h in held.items()
    ]


def describe_gathers(gathers: list) -> list[str]:
    """`TensorParallelModel.gathers` as `describe()` lines: what a custom layer reads whole."""
    if not gathers:
        return []
    lines = [
        f"  gathered:   {len(gathers)} column output(s) a step, read whole by the layer that "
        "calls them (an all-gather each; the Timeline shows its time):"
    ]
    lines += [f"    {name}: {list(shape)}" for name, shape in gathers]
    return lines


def _nbytes(variable):
    n = tf.as_dtype(variable.dtype).size
    for d in variable.shape:
        n *= int(d)
    return n
