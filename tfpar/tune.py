"""``tfpar tune``: find the fastest configuration of a model on this machine with short timed trials.

Like Horovod's ``--autotune``, but over the knobs a Keras user sets: the
per-replica batch size, ``steps_per_execution``, the all-reduce's packing
(``num_packs`` on one host, with the "hierarchical" all-reduce that honours it;
``bytes_per_pack`` across hosts) and, for a
2-stage pipeline, the number of microbatches. Every combination of the search
space runs in its own process (so that a trial that runs out of memory or is
invalid fails alone): it builds the model from ``model_fn`` under the
strategy, feeds ``data_fn``'s examples through `tfpar.data`, trains a warm-up
epoch and a timed one of ``steps`` steps, and reports examples per second. The
fastest successful trial wins; failed trials are listed with their error.

Example:
    >>> result = tfpar.tune.tune("tfpar.demo:build_model", "tfpar.demo:digits_dataset",  # doctest: +SKIP
    ...                          {"per_replica_batch": [16, 64], "steps_per_execution": [1, 4]})
    >>> print(result.table()); result.best  # doctest: +SKIP
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

from tfpar._checks import check_int, check_number
from tfpar._processes import LaunchError, ProcessGroups, forwarding_signals

__all__ = ["AXES", "TuneResult", "check_space", "tune"]

AXES = {
    "per_replica_batch": 1,
    "steps_per_execution": 1,
    "num_packs": 1,
    "bytes_per_pack": 0,
    "microbatches": 1,
}
"""Axis name -> smallest valid value."""


def check_space(space):
    """Validates a search space ``{axis: [values]}``; returns it with lists.

    Raises:
        ValueError: not a dict, an unknown axis, an empty axis, or a value that is not
            an int at least the axis' minimum.
    """
    if not isinstance(space, dict) or not space:
        raise ValueError(f"The search space must be a non-empty dict {{axis: [values]}}. Received: {space!r}. "
                         f"Axes: {sorted(AXES)}.")
    checked = {}
    for axis, values in space.items():
        if axis not in AXES:
            raise ValueError(f"Unknown tune axis {axis!r}. Received: {sorted(space)}. Use some of {sorted(AXES)}.")
        values = [values] if isinstance(values, int) else list(values)
        if not values:
            raise ValueError(f"The tune axis {axis!r} is empty. Received: {axis}={values!r}. Give at least one value.")
        for value in values:
            if isinstance(value, bool) or not isinstance(value, int) or value < AXES[axis]:
                raise ValueError(f"Tune axis {axis!r} takes ints >= {AXES[axis]}. Received: {axis}={values!r}.")
        checked[axis] = values
    return checked


@dataclasses.dataclass(frozen=True)
class TuneResult:
    """The trials of `tune`, fastest first, and the winner."""

    trials: tuple
    """Dicts: ``config``, ``status`` ("ok" or "failed"), ``examples_per_second`` or ``error``."""

    @property
    def best(self):
        """The fastest successful trial (None if every trial failed)."""
        ok = [t for t in self.trials if t["status"] == "ok"]
        return max(ok, key=lambda t: t["examples_per_second"]) if ok else None

    def table(self):
        axes = sorted({axis for t in self.trials for axis in t["config"]})
        lines = ["  ".join(f"{a:>19}" for a in axes) + f"  {'examples/s':>12}  status"]
        for trial in self.trials:
            cells = "  ".join(f"{trial['config'].get(a, ''):>19}" for a in axes)
            speed = f"{trial['examples_per_second']:>12,.0f}" if trial["status"] == "ok" else f"{'-':>12}"
            note = "ok" if trial["status"] == "ok" else "failed: " + _error_line(trial["error"])[:100]
            lines.append(f"{cells}  {speed}  {note}")
        best = self.best
        lines.append(f"fastest: {best['config']} at {best['examples_per_second']:,.0f} examples/s" if best
                     else "every trial failed")
        return "\n".join(lines)

    def to_json(self):
        return json.dumps({"best": self.best, "trials": list(self.trials)}, indent=2)


def _error_line(text):
    """The most telling line of a failed trial's output: the last 'SomethingError: ...' line."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[\w.]*(Error|Exception): ", line)]
    return (errors or lines or ["(no output)"])[-1]


def tune(model_fn, data_fn, space, *, loss="sparse_categorical_crossentropy", optimizer="adam", steps=20,
         devices=2, timeout_seconds=300, print_fn=None):
    """Runs one short timed trial per combination of ``space``; returns a `TuneResult`.

    Args:
        model_fn: "module:function" returning an uncompiled tf_keras model (built in the
            trial's strategy scope).
        data_fn: "module:function" returning a tf.data.Dataset of single (x, y) examples.
        space: ``{axis: [values]}`` over `AXES`; unset axes keep their defaults.
        loss, optimizer: passed to ``compile``.
        steps: timed steps per trial (after a warm-up epoch of as many).
        devices: virtual CPU devices (ignored with GPUs).
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
    for name, ref in (("model_fn", model_fn), ("data_fn", data_fn)):
        if not isinstance(ref, str) or ref.count(":") != 1:
            raise ValueError(f"{name} must be 'module:function'. Received: {ref!r}.")
    axes = sorted(space)
    trials = []
    for values in itertools.product(*(space[a] for a in axes)):
        config = dict(zip(axes, values))
        spec = {"model_fn": model_fn, "data_fn": data_fn, "config": config, "loss": loss,
                "optimizer": optimizer, "steps": steps, "devices": devices}
        trial = _run_trial_process(spec, timeout_seconds)
        trials.append(trial)
        if print_fn:
            speed = f"{trial['examples_per_second']:,.0f} examples/s" if trial["status"] == "ok" else "failed"
            print_fn(f"trial {len(trials)}: {config} -> {speed}")
    trials.sort(key=lambda t: (t["status"] != "ok", -t.get("examples_per_second", 0)))
    return TuneResult(tuple(trials))


def _run_trial_process(spec, timeout_seconds):
    """Runs one trial in a child process (its own process group, stopped with everything it
    started when it times out, when tune is signalled, or, through the watchdog, when tune dies)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    groups = ProcessGroups(grace_seconds=5.0)
    try:
        with forwarding_signals(groups.send) as received:
            proc = subprocess.Popen([sys.executable, "-m", "tfpar.tune", json.dumps(spec)], stdout=subprocess.PIPE,
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
        if line.startswith("TRIAL "):
            return {"config": spec["config"], "status": "ok", **json.loads(line[6:])}
    return {"config": spec["config"], "status": "failed",
            "error": (stderr or stdout)[-2000:] or f"exit status {proc.returncode}"}
def _resolve(ref):
    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)


def _trial(spec):
    """Runs one trial in this process and prints ``TRIAL {json}``."""
    import tfpar

    config = {**{a: None for a in AXES}, **spec["config"]}
    tfpar.configure_devices(spec["devices"])
    per_replica = config["per_replica_batch"] or 32
    if config["microbatches"]:
        from tfpar.pipeline import Pipeline

        parallelism = Pipeline(num_stages=2, num_microbatches=config["microbatches"])
    else:
        options = {k: config[k] for k in ("num_packs", "bytes_per_pack") if config[k] is not None}
        if "num_packs" in options:  # the one-host all-reduce that packs on any device
            options["all_reduce"] = "hierarchical"
        parallelism = tfpar.DataParallel(**options)
    model = parallelism.build(_resolve(spec["model_fn"]))
    with parallelism.scope():
        model.compile(spec["optimizer"], spec["loss"], steps_per_execution=config["steps_per_execution"] or 1)
    global_batch = per_replica * parallelism.num_replicas_in_sync
    train = tfpar.data.distribute(_resolve(spec["data_fn"])(), parallelism, global_batch, remainder="drop")
    throughput = tfpar.callbacks.Throughput(global_batch)
    history = model.fit(train.dataset, steps_per_epoch=spec["steps"], epochs=2, verbose=0, callbacks=[throughput])
    print("TRIAL " + json.dumps({"examples_per_second": history.history["examples_per_second"][-1],
                                 "global_batch": global_batch, "pipeline": bool(config["microbatches"])}), flush=True)


if __name__ == "__main__":
    _trial(json.loads(sys.argv[1]))
