"""``tfpar tune``: find the best configuration of a model on this machine with short trials.

Like Horovod's ``--autotune``, but over the knobs a Keras user sets: the
per-replica batch size, ``steps_per_execution``, the all-reduce's packing
(``num_packs`` on one host, with the "hierarchical" all-reduce that honours it;
``bytes_per_pack`` across hosts), the gradients' compression, the strategy
(`DataParallel` or `HorovodStrategy`, with or without Horovod's own autotune), the sharding of
the optimizer state, the optimizer (the model's own, or LARS/LAMB) with the learning-rate
scaling rule and warm-up, and, for a 2-stage pipeline, the number of microbatches, the schedule
and its ``virtual_stages``, and the tensor-parallel degree (``tensor_degree``). Every combination
of the search space runs in its own process (so that a trial that runs out of memory or is
invalid fails alone; with ``workers`` > 1, its own job under ``tfpar launch``): it builds the
model from ``model_fn`` under the strategy and feeds ``data_fn``'s examples through `tfpar.data`.
An axis that does not apply to a trial is left out of it (``bytes_per_pack`` under Horovod,
``warmup_epochs`` without a scaling rule), and tfpar's defaults run as one more trial (in a
space of several, not of pipelines).

Two questions, two rankings:

- without a target, each trial trains a warm-up epoch and a timed one of ``steps`` steps, and the
  trial with the most examples per second wins;
- with ``target="val_accuracy=0.95"``, each trial trains epoch by epoch until the metric reaches
  the value (or ``max_epochs``, or ``max_seconds``), and the trial that got there in the least wall
  time wins: a larger batch is faster per example but may need more epochs, or never get there.
  Once a trial has reached the target, the next ones stop at its time (they could not win).

The report gives each trial's figures (and curve), the winner's gain over the defaults, and the
code and command that reproduce it; failed trials are listed with their error.

Examples:
    >>> result = tfpar.tune.tune("tfpar.demo:build_model", "tfpar.demo:digits_dataset",  # doctest:
    +SKIP
    ...                          {"per_replica_batch": [32, 256], "optimizer": ["model", "lamb"],
    ...                           "scaling_rule": ["none", "sqrt"]},
    ...                          target="val_accuracy=0.95",
    validation_fn="tfpar.demo:digits_validation_dataset")
    >>> print(result.describe()); result.best  # doctest: +SKIP
"""

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from tfpar._checks import check_int, check_names, check_number
from tfpar._local.processes import LaunchError, ProcessGroups, forwarding_signals
from tfpar.tune.result import TuneResult
from tfpar.tune.space import (
    AXES,
    CHOICE_AXES,
    DEFAULTS,
    check_space,
    logged_metrics,
    parse_target,
    trial_configs,
    workers_space,
)

__all__ = ["AXES", "CHOICE_AXES", "DEFAULTS", "TuneResult", "check_space", "tune", "workers_space"]


def _check_references(**references):
    for name, ref in references.items():
        if ref is not None and (not isinstance(ref, str) or ref.count(":") != 1):
            raise ValueError(f"{name} must be 'module:function'. Received: {ref!r}.")


def tune(
    model_fn: str,
    data_fn: str,
    space: dict,
    *,
    loss: str = "sparse_categorical_crossentropy",
    optimizer: str = "adam",
    steps: int = 20,
    devices: int = 2,
    timeout_seconds: float = 300,
    print_fn: Callable[[str], Any] | None = None,
    workers: int = 1,
    target: str | None = None,
    validation_fn: str | None = None,
    metrics: list[str] | tuple[str, ...] = ("accuracy",),
    max_epochs: int = 30,
    max_seconds: float = 120,
) -> "TuneResult":
    """Runs one trial per combination of ``space``; returns a `TuneResult`.

    Args:
        model_fn: "module:function" returning an uncompiled Keras model (built in the trial's
            strategy scope).
        data_fn: "module:function" returning a tf.data.Dataset of single (x, y) training examples.
        space: ``{axis: [values]}`` over `AXES` and `CHOICE_AXES`; unset axes keep their defaults.
        loss: passed to ``compile``.
        optimizer: the model's own optimizer, by its Keras name (the ``optimizer`` axis' "model").
        steps: timed steps per trial without a target (after a warm-up epoch of as many).
        devices: virtual CPU devices (ignored with GPUs, and with ``workers`` > 1: a worker or
            rank is one replica).
        workers: each trial runs as a job of this many workers (or Horovod ranks) on this host,
            started by ``tfpar launch``.
        timeout_seconds: a trial running longer is stopped and fails (``--trial-timeout``).
        print_fn: called with each trial's line as it finishes (e.g. ``print``).
        target: ``METRIC=VALUE``: rank by the wall time to reach it (``val_accuracy=0.95``; a metric
            ending in "loss" is reached from above).
        validation_fn: "module:function" returning the validation examples (for a ``val_`` metric).
        metrics: compile's metrics (weighted, so that the validation set's padding counts for
            nothing).
        max_epochs: with a target, a trial ends after this many epochs.
        max_seconds: with a target, a trial ends after the epoch that passes this many seconds of
            training.

    Raises:
        ValueError: an invalid space or target (a metric the trials do not log: they are named), a
            function reference that is not "module:function", or ``max_seconds`` not below
            ``timeout_seconds``.
        LaunchError: tune was interrupted (SIGINT, SIGTERM, SIGHUP); the running trial was stopped.
    """
    space = check_space(space)
    check_number(
        "timeout_seconds",
        timeout_seconds,
        above=0,
        hint=" It bounds each trial, e.g. --trial-timeout 300.",
    )
    for name, value in (
        ("steps", steps),
        ("devices", devices),
        ("workers", workers),
        ("max_epochs", max_epochs),
    ):
        check_int(name, value, 1)
    _check_one_host_axes(space, workers)
    _check_references(model_fn=model_fn, data_fn=data_fn, validation_fn=validation_fn)
    names = list(check_names("metrics", metrics))
    spec: dict[str, Any] = {
        "model_fn": model_fn,
        "data_fn": data_fn,
        "loss": loss,
        "optimizer": optimizer,
        "steps": steps,
        "devices": devices,
        "metrics": names,
    }
    goal = None
    if target is not None:
        goal = parse_target(target, logged_metrics(names, validation_fn is not None))
        check_number(
            "max_seconds",
            max_seconds,
            above=0,
            maximum=timeout_seconds,
            hint=" A trial's training time must fit in its --trial-timeout.",
        )
        spec.update(
            target={"metric": goal.metric, "value": goal.value},
            validation_fn=validation_fn,
            max_epochs=max_epochs,
            max_seconds=max_seconds,
        )
    trials = _run_trials(spec, space, timeout_seconds, workers, goal, print_fn)
    return TuneResult(tuple(trials), workers, str(goal) if goal else None)


def _check_one_host_axes(space, workers):
    """Refuses the axes that tune one host's devices in a job of several workers."""
    one_host = ("num_packs", "microbatches", "tensor_degree")
    if workers > 1 and any(space.get(axis, [None]) != [None] for axis in one_host):
        raise ValueError(
            "num_packs, microbatches and tensor_degree tune one host's devices (the hierarchical "
            f"all-reduce, the pipeline, tensor parallelism); with workers={workers} each worker is "
            f"one replica. Received: workers={workers} with "
            f"{sorted(a for a in one_host if a in space)}. Tune bytes_per_pack, compression, "
            "zero_stage and strategy across workers, or those axes with workers=1."
        )


def _run_trials(spec, space, timeout_seconds, workers, goal, print_fn):
    """Each configuration of ``space`` as a trial process, in turn; the trials, best first."""
    trials = []
    for config in trial_configs(space):
        trial = _run_trial_process({**spec, "config": config}, timeout_seconds, workers)
        trials.append(trial)
        # the next trials stop where they could no longer win
        if trial.get("seconds_to_target") is not None:
            spec["max_seconds"] = min(spec["max_seconds"], trial["seconds_to_target"])
        if print_fn:
            print_fn(f"trial {len(trials)}: {config} -> {_summary(trial, goal)}")
    trials.sort(
        key=lambda t: (
            t["status"] != "ok",
            t.get("seconds_to_target") is None if goal else False,
            t.get("seconds_to_target") or 0,
            -t.get("examples_per_second", 0),
        )
    )
    return trials


def _summary(trial, goal):
    if trial["status"] != "ok":
        return "failed"
    speed = f"{trial['examples_per_second']:,.0f} examples/s"
    if goal is None:
        return speed
    seconds = trial.get("seconds_to_target")
    return (
        f"{goal} in {seconds:.1f} s ({trial['epochs_to_target']} epochs), {speed}"
        if seconds is not None
        else f"{goal} not reached ({trial['stopped']}), {speed}"
    )


def _trial_command(spec, workers):
    trial = [sys.executable, "-m", "tfpar.tune.trial", json.dumps(spec)]
    horovod = spec["config"].get("strategy") == "horovod"
    if workers == 1 and not horovod:
        return trial
    return [
        sys.executable,
        "-m",
        "tfpar.cli",
        "launch",
        *(["--horovod"] if horovod else []),
        "-n",
        str(workers),
        "--",
        *trial,
    ]


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
            proc = subprocess.Popen(
                _trial_command(spec, workers),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                text=True,
                env=env,
                start_new_session=True,
            )
            groups.add(proc.pid)
            try:
                stdout, stderr = proc.communicate(timeout=timeout_seconds)
            except subprocess.TimeoutExpired:
                groups.stop()
                proc.communicate()
                return {
                    "config": spec["config"],
                    "status": "failed",
                    "error": f"timed out after {timeout_seconds} s",
                }
            if received:
                name = signal.Signals(received[0]).name
                raise LaunchError(
                    f"interrupted by {name}; the running trial was stopped",
                    returncode=128 + received[0],
                )
    finally:
        groups.close()
    for line in stdout.splitlines():
        if "TRIAL {" in line:  # alone, or after tfpar launch's "[worker 0] "
            return {
                "config": spec["config"],
                "status": "ok",
                **json.loads(line.split("TRIAL ", 1)[1]),
            }
        # every trial would fail alike: stop now, naming what the model logs
        if "METRICS [" in line:
            logged = json.loads(line.split("METRICS ", 1)[1])
            parse_target(f"{spec['target']['metric']}={spec['target']['value']}", logged)
    return {
        "config": spec["config"],
        "status": "failed",
        "error": (stderr or stdout)[-2000:] or f"exit status {proc.returncode}",
    }
