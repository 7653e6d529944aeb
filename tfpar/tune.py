"""``tfpar tune``: find the fastest configuration of a model on this machine with short timed trials.

Like Horovod's ``--autotune``, but over the knobs a Keras user sets: the
per-replica batch size, ``steps_per_execution``, the all-reduce's packing
(``num_packs`` on one host, with the "hierarchical" all-reduce that honours it;
``bytes_per_pack`` across hosts), the gradients' compression, the strategy
(`DataParallel` or `HorovodStrategy`, with or without Horovod's own autotune) and, for a
2-stage pipeline, the number of microbatches, the schedule and its ``virtual_stages``, and the tensor-parallel degree
(``tensor_degree``: the model's layers split over that many devices, ``plan="auto"``). Every combination of the search
space runs in its own process (so that a trial that runs out of memory or is
invalid fails alone; with ``workers`` > 1, its own job under ``tfpar launch``): it builds the
model from ``model_fn`` under the strategy, feeds ``data_fn``'s examples through `tfpar.data`,
trains a warm-up epoch and a timed one of ``steps`` steps, and reports examples per second.
An axis that does not apply to a trial's strategy is left out of it (``bytes_per_pack`` under
Horovod, ``horovod_autotune`` under DataParallel), and tfpar's defaults run as one more trial
(in a space of several, not of pipelines):
the fastest successful trial wins, its speed-up over the defaults is reported, with the code
that reproduces it; failed trials are listed with their error.

Examples:
    >>> result = tfpar.tune.tune("tfpar.demo:build_model", "tfpar.demo:digits_dataset",  # doctest: +SKIP
    ...                          {"per_replica_batch": [16, 64], "steps_per_execution": [1, 4]})
    >>> print(result.describe()); result.best  # doctest: +SKIP
"""

import dataclasses
import importlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from tfpar._checks import check_int, check_number
from tfpar._processes import LaunchError, ProcessGroups, forwarding_signals
from tfpar.pipeline.schedule import SCHEDULES, virtual_schedules

__all__ = ["AXES", "CHOICE_AXES", "DEFAULTS", "TuneResult", "check_space", "tune", "workers_space"]

AXES = {
    "per_replica_batch": 1,
    "steps_per_execution": 1,
    "num_packs": 1,
    "bytes_per_pack": 0,
    "microbatches": 1,
    "virtual_stages": 1,
    "tensor_degree": 1,
}
"""Integer axis name -> smallest valid value."""
CHOICE_AXES = {
    "strategy": ("data_parallel", "horovod"),
    "compression": ("none", "bf16", "fp16"),
    "horovod_autotune": (False, True),
    "schedule": tuple(SCHEDULES),  # every pipeline schedule tfpar has
    "zero_stage": (0, 1, 2),
}
"""Axis name -> its values."""
DEFAULTS = {"strategy": "data_parallel", "compression": "none", "per_replica_batch": 32, "steps_per_execution": 1}
"""What a trial leaves unset is tfpar's default; in a space of several trials (not pipelines) this
one runs too, as the reference of the speed-up."""
_UNSET = {"bytes_per_pack": 0, "horovod_autotune": False, "tensor_degree": 1, "zero_stage": 0}  # values that are the strategy's own default
_ONLY = {"horovod_autotune": "horovod", "bytes_per_pack": "data_parallel", "num_packs": "data_parallel",
         "microbatches": "data_parallel", "schedule": "data_parallel",
         "virtual_stages": "data_parallel", "tensor_degree": "data_parallel"}  # axis -> the one strategy it applies to (a pipeline's: none)


def workers_space() -> dict[str, list]:
    """``tfpar tune --workers N``'s default space: both strategies, compressed or not, packed or
    not, with and without Horovod's autotune, over batch and steps_per_execution."""
    return {"strategy": list(CHOICE_AXES["strategy"]), "compression": ["none", "bf16"],
            "bytes_per_pack": [0, 4 * 2**20], "horovod_autotune": [False, True],
            "per_replica_batch": [32, 64], "steps_per_execution": [1, 4]}


def check_space(space: dict) -> dict[str, list]:
    """Validates a search space ``{axis: [values]}``; returns it with lists.

    Raises:
        ValueError: not a dict, an unknown axis, an empty axis, or a value that is not
            an int at least the axis' minimum (or one of a choice axis' values).
    """
    names = sorted([*AXES, *CHOICE_AXES])
    if not isinstance(space, dict) or not space:
        raise ValueError(f"The search space must be a non-empty dict {{axis: [values]}}. Received: {space!r}. "
                         f"Axes: {names}.")
    checked = {}
    for axis, values in space.items():
        if axis not in names:
            raise ValueError(f"Unknown tune axis {axis!r}. Received: {sorted(space)}. Use some of {names}.")
        values = [values] if isinstance(values, (int, str)) else list(values)
        if not values:
            raise ValueError(f"The tune axis {axis!r} is empty. Received: {axis}={values!r}. Give at least one value.")
        for value in values:
            if axis in CHOICE_AXES:
                if not any(value is choice or (value == choice and type(value) is type(choice))
                           for choice in CHOICE_AXES[axis]):
                    raise ValueError(f"Tune axis {axis!r} takes {list(CHOICE_AXES[axis])}. Received: {axis}={values!r}.")
            elif isinstance(value, bool) or not isinstance(value, int) or value < AXES[axis]:
                raise ValueError(f"Tune axis {axis!r} takes ints >= {AXES[axis]}. Received: {axis}={values!r}.")
        checked[axis] = values
    return checked


def _applies(axis, value, config):
    """Whether ``axis`` means something in the trial ``config`` (and ``value`` is not its default)."""
    if axis in _UNSET and value == _UNSET[axis]:
        return False
    if axis in ("schedule", "virtual_stages") and not config.get("microbatches"):
        return False  # pipeline axes
    if axis == "compression" and (config.get("microbatches") or (config.get("tensor_degree") or 1) > 1):
        return False  # a pipeline, or one tensor-parallel model, all-reduces no gradients
    if axis == "tensor_degree" and config.get("microbatches"):
        return False
    if axis == "zero_stage" and (config.get("microbatches") or (config.get("tensor_degree") or 1) > 1):
        return False  # ZeRO shards a data-parallel optimizer's state
    if axis == "virtual_stages" and config.get("schedule") not in virtual_schedules():
        return False
    return _ONLY.get(axis, config["strategy"]) == config["strategy"]


def _trial_configs(space):
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


@dataclasses.dataclass(frozen=True)
class TuneResult:
    """The trials of `tune`, fastest first, and the winner."""

    trials: tuple
    """Dicts: ``config``, ``status`` ("ok" or "failed"), ``examples_per_second`` or ``error``."""
    workers: int = 1
    """Workers (or Horovod ranks) each trial ran on."""

    @property
    def best(self):
        """The fastest successful trial (None if every trial failed)."""
        ok = [t for t in self.trials if t["status"] == "ok"]
        return max(ok, key=lambda t: t["examples_per_second"]) if ok else None

    @property
    def default(self):
        """The trial of tfpar's defaults (`DEFAULTS`), or None (a space of pipeline trials)."""
        return next((t for t in self.trials if t["config"] == DEFAULTS), None)

    @property
    def speedup(self):
        """The fastest trial's examples/s ÷ the defaults' (None if either failed)."""
        best, default = self.best, self.default
        if best is None or default is None or default["status"] != "ok":
            return None
        return best["examples_per_second"] / default["examples_per_second"]

    def reproduce(self) -> str:
        """The command and code that train as the fastest trial did."""
        best = self.best
        if best is None:
            return ""
        config = {**DEFAULTS, **best["config"]}
        horovod = config["strategy"] == "horovod"
        strategy = trial_spec(config).code()
        env = "HOROVOD_AUTOTUNE=1 " if config.get("horovod_autotune") else ""
        launch = (f"{env}tfpar launch{' --horovod' if horovod else ''} -n {self.workers} -- python train.py"
                  if self.workers > 1 or horovod else "python train.py")
        return "\n".join([
            f"  {launch}",
            f"  strategy = {strategy}",
            f"  model.compile(..., steps_per_execution={config['steps_per_execution']})",
            f"  train = tfpar.data.distribute(dataset, strategy, {config['per_replica_batch']} * "
            "strategy.num_replicas_in_sync)"])

    def describe(self) -> str:
        axes = sorted({axis for t in self.trials for axis in t["config"]})
        lines = ["  ".join(f"{a:>19}" for a in axes) + f"  {'examples/s':>12}  status"]
        for trial in self.trials:
            cells = "  ".join(f"{str(trial['config'].get(a, '')):>19}" for a in axes)
            speed = f"{trial['examples_per_second']:>12,.0f}" if trial["status"] == "ok" else f"{'-':>12}"
            note = "ok" if trial["status"] == "ok" else "failed: " + _error_line(trial["error"])[:100]
            lines.append(f"{cells}  {speed}  {note}")
        best = self.best
        lines.append(f"fastest: {best['config']} at {best['examples_per_second']:,.0f} examples/s" if best
                     else "every trial failed")
        if self.speedup is not None:
            lines.append(f"speed-up over tfpar's defaults {DEFAULTS}: {self.speedup:.2f}x")
        if best:
            lines += ["reproduce it:", self.reproduce()]
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps({"best": self.best, "speedup": self.speedup, "workers": self.workers,
                           "trials": list(self.trials)}, indent=2)


def _error_line(text):
    """The most telling line of a failed trial's output: the last 'SomethingError: ...' line."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[\w.]*(Error|Exception): ", line)]
    return (errors or lines or ["(no output)"])[-1]


def tune(model_fn: str, data_fn: str, space: dict, *, loss: str = "sparse_categorical_crossentropy",
         optimizer: str = "adam", steps: int = 20, devices: int = 2, timeout_seconds: float = 300,
         print_fn: Callable[[str], Any] | None = None, workers: int = 1) -> "TuneResult":
    """Runs one short timed trial per combination of ``space``; returns a `TuneResult`.

    Args:
        model_fn: "module:function" returning an uncompiled tf_keras model (built in the
            trial's strategy scope).
        data_fn: "module:function" returning a tf.data.Dataset of single (x, y) examples.
        space: ``{axis: [values]}`` over `AXES`; unset axes keep their defaults.
        loss: passed to ``compile``.
        optimizer: passed to ``compile``.
        steps: timed steps per trial (after a warm-up epoch of as many).
        devices: virtual CPU devices (ignored with GPUs, and with ``workers`` > 1: a worker or
            rank is one replica).
        workers: each trial runs as a job of this many workers (or Horovod ranks) on this host,
            started by ``tfpar launch``.
        timeout_seconds: a trial running longer is stopped and fails (``--trial-timeout``).
        print_fn: called with each trial's line as it finishes (e.g. ``print``).

    Raises:
        ValueError: an invalid space, or a function reference that is not "module:function".
        LaunchError: tune was interrupted (SIGINT, SIGTERM, SIGHUP); the running trial was stopped.
    """
    space = check_space(space)
    check_number("timeout_seconds", timeout_seconds, above=0, hint=" It bounds each trial, e.g. --trial-timeout 300.")
    check_int("steps", steps, 1)
    check_int("devices", devices, 1)
    check_int("workers", workers, 1)
    one_host = ("num_packs", "microbatches", "tensor_degree")
    if workers > 1 and any(space.get(axis, [None]) != [None] for axis in one_host):
        raise ValueError(
            "num_packs, microbatches and tensor_degree tune one host's devices (the hierarchical all-reduce, "
            f"the pipeline, tensor parallelism); with workers={workers} each worker is one replica. Received: "
            f"workers={workers} with {sorted(a for a in one_host if a in space)}. Tune bytes_per_pack, "
            "compression, zero_stage and strategy across workers, or those axes with workers=1.")
    for name, ref in (("model_fn", model_fn), ("data_fn", data_fn)):
        if not isinstance(ref, str) or ref.count(":") != 1:
            raise ValueError(f"{name} must be 'module:function'. Received: {ref!r}.")
    trials = []
    for config in _trial_configs(space):
        spec = {"model_fn": model_fn, "data_fn": data_fn, "config": config, "loss": loss,
                "optimizer": optimizer, "steps": steps, "devices": devices}
        trial = _run_trial_process(spec, timeout_seconds, workers)
        trials.append(trial)
        if print_fn:
            speed = f"{trial['examples_per_second']:,.0f} examples/s" if trial["status"] == "ok" else "failed"
            print_fn(f"trial {len(trials)}: {config} -> {speed}")
    trials.sort(key=lambda t: (t["status"] != "ok", -t.get("examples_per_second", 0)))
    return TuneResult(tuple(trials), workers)


def _trial_command(spec, workers):
    trial = [sys.executable, "-m", "tfpar.tune", json.dumps(spec)]
    horovod = spec["config"].get("strategy") == "horovod"
    if workers == 1 and not horovod:
        return trial
    return [sys.executable, "-m", "tfpar.cli", "launch", *(["--horovod"] if horovod else []), "-n", str(workers),
            "--", *trial]


def _run_trial_process(spec, timeout_seconds, workers=1):
    """Runs one trial in a child process, or a job of ``workers`` under ``tfpar launch`` (its own
    process group, stopped with everything it started when it times out, when tune is signalled,
    or, through the watchdog, when tune dies)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    if spec["config"].get("horovod_autotune"):
        env["HOROVOD_AUTOTUNE"] = "1"
    groups = ProcessGroups(grace_seconds=5.0)
    try:
        with forwarding_signals(groups.send) as received:
            proc = subprocess.Popen(_trial_command(spec, workers), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=env,
                                    start_new_session=True)
            groups.add(proc.pid)
            try:
                stdout, stderr = proc.communicate(timeout=timeout_seconds)
            except subprocess.TimeoutExpired:
                groups.stop()
                proc.communicate()
                return {"config": spec["config"], "status": "failed", "error": f"timed out after {timeout_seconds} s"}
            if received:
                name = signal.Signals(received[0]).name
                raise LaunchError(f"interrupted by {name}; the running trial was stopped",
                                  returncode=128 + received[0])
    finally:
        groups.close()
    for line in stdout.splitlines():
        if "TRIAL {" in line:  # alone, or after tfpar launch's "[worker 0] "
            return {"config": spec["config"], "status": "ok", **json.loads(line.split("TRIAL ", 1)[1])}
    return {"config": spec["config"], "status": "failed",
            "error": (stderr or stdout)[-2000:] or f"exit status {proc.returncode}"}
def _resolve(ref):
    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)


def trial_spec(config, devices=None, split_devices=True):
    """The `tfpar._factory.ParallelismSpec` of a trial's ``config``: a pipeline when it has
    microbatches, else its strategy."""
    from tfpar._factory import ParallelismSpec

    degree = config.get("tensor_degree") or 1
    kind = "pipeline" if config.get("microbatches") else "tensor_parallel" if degree > 1 else config["strategy"]
    return ParallelismSpec(
        kind=kind, devices=degree if kind == "tensor_parallel" else devices, split_devices=split_devices,
        compression=(config.get("compression") or "none") if kind in ("data_parallel", "horovod") else "none",
        num_packs=config.get("num_packs"), bytes_per_pack=config.get("bytes_per_pack"),
        microbatches=config.get("microbatches") or 8, schedule=config.get("schedule") or "1f1b",
        virtual_stages=config.get("virtual_stages"), zero_stage=(config.get("zero_stage") or 0) if kind in ("data_parallel", "horovod") else 0)


def _trial(spec):
    """Runs one trial in this process and prints ``TRIAL {json}``."""
    import tfpar

    config = {**{a: None for a in AXES}, **DEFAULTS, **spec["config"]}
    # Several workers (TF_CONFIG): one replica each, and the strategy created first.
    parallelism = trial_spec(config, spec["devices"], split_devices="TF_CONFIG" not in os.environ).build()
    model = parallelism.build(_resolve(spec["model_fn"]))
    with parallelism.scope():
        model.compile(spec["optimizer"], spec["loss"], steps_per_execution=config["steps_per_execution"])
    global_batch = config["per_replica_batch"] * parallelism.num_replicas_in_sync
    train = tfpar.data.distribute(_resolve(spec["data_fn"])(), parallelism, global_batch, remainder="drop")
    throughput = tfpar.callbacks.Throughput(global_batch)
    history = model.fit(train.dataset, steps_per_epoch=spec["steps"], epochs=2, verbose=0, callbacks=[throughput])
    if parallelism.input_strategy.extended.should_checkpoint:  # one line per job: its chief's
        print("TRIAL " + json.dumps({"examples_per_second": history.history["examples_per_second"][-1],
                                     "global_batch": global_batch, "pipeline": bool(config["microbatches"])}),
              flush=True)


if __name__ == "__main__":
    _trial(json.loads(sys.argv[1]))
