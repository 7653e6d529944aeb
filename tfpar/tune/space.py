"""``tfpar tune``'s search space and target, checked: pure Python (``tfpar.cli`` loads no
TensorFlow)."""

import itertools
import re

from tfpar.pipeline.schedule import SCHEDULES, virtual_schedules

__all__ = [
    "AXES",
    "CHOICE_AXES",
    "DEFAULTS",
    "Target",
    "check_space",
    "logged_metrics",
    "parse_target",
    "trial_configs",
    "workers_space",
]

AXES = {
    "per_replica_batch": 1,
    "steps_per_execution": 1,
    "num_packs": 1,
    "bytes_per_pack": 0,
    "microbatches": 1,
    "virtual_stages": 1,
    "tensor_degree": 1,
    "warmup_epochs": 0,
}
"""Integer axis name -> smallest valid value."""
CHOICE_AXES = {
    "strategy": ("data_parallel", "horovod"),
    "compression": ("none", "bf16", "fp16"),
    "horovod_autotune": (False, True),
    "schedule": tuple(SCHEDULES),  # every pipeline schedule tfpar has
    "zero_stage": (0, 1, 2, 3),
    "remat": ("none", "blocks"),
    "optimizer": ("model", "lars", "lamb"),
    "scaling_rule": ("none", "linear", "sqrt"),
}
"""Axis name -> its values."""
DEFAULTS = {
    "strategy": "data_parallel",
    "compression": "none",
    "per_replica_batch": 32,
    "steps_per_execution": 1,
}
"""What a trial leaves unset is tfpar's default; in a space of several trials (not pipelines) this
one runs too, as the reference of the speed-up."""
# values that are the strategy's own default
_UNSET = {
    "bytes_per_pack": 0,
    "horovod_autotune": False,
    "tensor_degree": 1,
    "zero_stage": 0,
    "remat": "none",
    "optimizer": "model",
    "scaling_rule": "none",
    "warmup_epochs": 0,
}
# axis -> the one strategy it applies to (a pipeline's: none)
_ONLY = {
    "horovod_autotune": "horovod",
    "bytes_per_pack": "data_parallel",
    "num_packs": "data_parallel",
    "microbatches": "data_parallel",
    "schedule": "data_parallel",
    "virtual_stages": "data_parallel",
    "tensor_degree": "data_parallel",
}


def workers_space() -> dict[str, list]:
    """``tfpar tune --workers N``'s default space: both strategies, compressed or not, packed or
    not, with and without Horovod's autotune, over batch and steps_per_execution."""
    return {
        "strategy": list(CHOICE_AXES["strategy"]),
        "compression": ["none", "bf16"],
        "bytes_per_pack": [0, 4 * 2**20],
        "horovod_autotune": [False, True],
        "per_replica_batch": [32, 64],
        "steps_per_execution": [1, 4],
    }


def check_space(space: dict) -> dict[str, list]:
    """Validates a search space ``{axis: [values]}``; returns it with lists.

    Raises:
        ValueError: not a dict, an unknown axis, an empty axis, or a value that is not
            an int at least the axis' minimum (or one of a choice axis' values).
    """
    names = sorted([*AXES, *CHOICE_AXES])
    if not isinstance(space, dict) or not space:
        raise ValueError(
            f"The search space must be a non-empty dict {{axis: [values]}}. Received: {space!r}. "
            f"Axes: {names}."
        )
    checked = {}
    for axis, values in space.items():
        if axis not in names:
            raise ValueError(
                f"Unknown tune axis {axis!r}. Received: {sorted(space)}. Use some of {names}."
            )
        values = [values] if isinstance(values, (int, str)) else list(values)
        if not values:
            raise ValueError(
                f"The tune axis {axis!r} is empty. Received: {axis}={values!r}. Give at least one "
                "value."
            )
        for value in values:
            if axis in CHOICE_AXES:
                if not any(
                    value is choice or (value == choice and type(value) is type(choice))
                    for choice in CHOICE_AXES[axis]
                ):
                    raise ValueError(
                        f"Tune axis {axis!r} takes {list(CHOICE_AXES[axis])}. Received: "
                        f"{axis}={values!r}."
                    )
            elif isinstance(value, bool) or not isinstance(value, int) or value < AXES[axis]:
                raise ValueError(
                    f"Tune axis {axis!r} takes ints >= {AXES[axis]}. Received: {axis}={values!r}."
                )
        checked[axis] = values
    return checked


def _applies(axis, value, config):
    """Whether ``axis`` means something in the trial ``config`` (and ``value`` is not its
    default)."""
    if axis in _UNSET and value == _UNSET[axis]:
        return False
    if axis in ("schedule", "virtual_stages") and not config.get("microbatches"):
        return False  # pipeline axes
    if axis == "compression" and (
        config.get("microbatches") or (config.get("tensor_degree") or 1) > 1
    ):
        return False  # a pipeline, or one tensor-parallel model, all-reduces no gradients
    if axis == "tensor_degree" and config.get("microbatches"):
        return False
    if axis in ("zero_stage", "remat") and (
        config.get("microbatches") or (config.get("tensor_degree") or 1) > 1
    ):
        return False  # ZeRO shards a data-parallel optimizer's state; remat is data-parallel's
    if axis == "virtual_stages" and config.get("schedule") not in virtual_schedules():
        return False
    if (
        axis in ("scaling_rule", "warmup_epochs")
        and config.get("per_replica_batch") == DEFAULTS["per_replica_batch"]
    ):
        return False  # the rules scale from the defaults' batch: at that batch they change nothing
    if axis == "warmup_epochs" and config.get("scaling_rule", "none") == "none":
        return False  # a warm-up climbs to a scaled rate
    return _ONLY.get(axis, config["strategy"]) == config["strategy"]


def trial_configs(space: dict[str, list]) -> list[dict]:
    """Every combination of ``space``, without the axes that do not apply to it (once each);
    tfpar's defaults first when the space holds several and is not one of pipelines."""
    axes = sorted(space)
    combinations = list(itertools.product(*(space[a] for a in axes)))
    configs = [dict(DEFAULTS)] if len(combinations) > 1 and "microbatches" not in space else []
    for values in combinations:
        config = {**DEFAULTS, **dict(zip(axes, values))}
        config = {a: v for a, v in config.items() if _applies(a, v, config)}
        if config not in configs:
            configs.append(config)
    return configs


class Target:
    """``METRIC=VALUE`` of ``--target``: a metric the trials log and the value that ends a trial."""

    def __init__(self, metric: str, value: float) -> None:
        self.metric, self.value = metric, value
        self.lower_is_better = metric.endswith("loss") or "error" in metric

    def reached(self, value: float) -> bool:
        return value <= self.value if self.lower_is_better else value >= self.value

    def __str__(self):
        return f"{self.metric}={self.value:g}"


def parse_target(text: str, logged: list[str]) -> Target:
    """``METRIC=VALUE`` (``val_accuracy=0.95``, ``val_loss=0.1``) against the metrics the trials
    log.

    Raises:
        ValueError: not METRIC=VALUE with a number, or a metric not in ``logged`` (they are named).
    """
    match = (
        re.fullmatch(r"\s*([A-Za-z_][\w.]*)\s*=\s*([-+0-9.eE]+)\s*", text)
        if isinstance(text, str)
        else None
    )
    try:
        metric, value = match.group(1), float(match.group(2))  # type: ignore[union-attr]
    except (AttributeError, ValueError):
        raise ValueError(
            f"target must be METRIC=VALUE, e.g. val_accuracy=0.95. Received: target={text!r}."
        ) from None
    if metric not in logged:
        raise ValueError(
            f"The trials log no metric {metric!r}: they log {', '.join(logged)} (compile's loss "
            f"and metrics, with val_ for the validation data). Received: target={text!r}. Name one "
            "of those, or add the metric (--metrics) or validation data."
        )
    return Target(metric, value)


def logged_metrics(metrics: list[str], validation: bool) -> list[str]:
    """The names Keras logs for compile's loss and ``metrics`` (strings), and their val_ twins."""
    names = ["loss", *metrics]
    return names + [f"val_{n}" for n in names] if validation else names
