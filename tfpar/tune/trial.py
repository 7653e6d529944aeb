"""One ``tfpar tune`` trial, run in its own process (``python -m tfpar.tune.trial SPEC``): the model
built under the trial's parallelism, its optimizer and learning-rate rule, and either a timed run of
``steps`` steps (examples per second) or a run to the target (the wall time to reach it)."""

import importlib
import json
import math
import os
import sys
import time
from typing import Any

from tfpar._local.processes import skip_exit_collections

__all__ = ["ADAPTIVE", "trial_spec"]

ADAPTIVE = {
    "lars": ("LARS", {"learning_rate": 0.5, "momentum": 0.9, "eta": 0.02, "weight_decay": 1e-4}),
    "lamb": ("LAMB", {"learning_rate": 1e-2, "weight_decay": 1e-4}),
}
"""The ``optimizer`` axis' layer-wise optimizers and their base settings at tfpar's default global
batch (the learning rate is scaled from there by the trial's ``scaling_rule``); the biases keep no
decay and no trust ratio."""


def trial_spec(config: dict, devices: int | None = None, split_devices: bool = True) -> Any:
    """The `tfpar._factory.ParallelismSpec` of a trial's ``config``: a pipeline when it has
    microbatches, else its strategy."""
    from tfpar._factory import ParallelismSpec

    degree = config.get("tensor_degree") or 1
    kind = (
        "pipeline"
        if config.get("microbatches")
        else "tensor_parallel"
        if degree > 1
        else config["strategy"]
    )
    return ParallelismSpec(
        kind=kind,
        devices=degree if kind == "tensor_parallel" else devices,
        split_devices=split_devices,
        compression=(config.get("compression") or "none")
        if kind in ("data_parallel", "horovod")
        else "none",
        num_packs=config.get("num_packs"),
        bytes_per_pack=config.get("bytes_per_pack"),
        microbatches=config.get("microbatches") or 8,
        schedule=config.get("schedule") or "1f1b",
        virtual_stages=config.get("virtual_stages"),
        zero_stage=(config.get("zero_stage") or 0) if kind in ("data_parallel", "horovod") else 0,
        remat=(config.get("remat") or "none") if kind in ("data_parallel", "horovod") else "none",
    )


def _resolve(ref):
    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)


def _optimizer(config, spec, model, global_batch, base_batch):
    """The trial's optimizer (built in the strategy's scope), the callbacks of its learning-rate
    rule and both as code: the model's own optimizer or LARS/LAMB, at a rate scaled from
    ``base_batch``."""
    from tfpar._keras import is_keras3, keras_of
    from tfpar.callbacks import LearningRateWarmup, scaled_learning_rate

    k = keras_of(model)
    rule, warmup = config.get("scaling_rule") or "none", config.get("warmup_epochs") or 0
    choice = config.get("optimizer") or "model"
    if choice == "model":
        name, options = spec["optimizer"], {}
        base = float(k.optimizers.get(name).learning_rate.numpy())
    else:
        name, options = ADAPTIVE[choice]
        options = {
            **options,
            "exclude_from_weight_decay": ["bias"],
            "keras_version": 3 if is_keras3(model) else 2,
        }
        base = options.pop("learning_rate")
    rate = base if rule == "none" else scaled_learning_rate(base, global_batch, base_batch, rule)
    start = base if warmup else rate  # a warm-up climbs from the base rate
    if choice == "model":
        optimizer = k.optimizers.get({"class_name": name, "config": {"learning_rate": start}})
        code = f"keras.optimizers.{type(optimizer).__name__}(learning_rate={start:.6g})"
    else:
        import tfpar.optimizers

        optimizer = getattr(tfpar.optimizers, name)(start, **options)
        shown = ", ".join(f"{key}={value!r}" for key, value in options.items())
        code = f"tfpar.optimizers.{name}({start:.6g}, {shown})"
    callbacks, callbacks_code = [], ""
    if warmup and rate != base:
        callbacks = [
            LearningRateWarmup(
                warmup_epochs=warmup, scale=global_batch / base_batch, rule=rule, initial_lr=base
            )
        ]
        callbacks_code = (
            f"tfpar.callbacks.LearningRateWarmup(warmup_epochs={warmup}, "
            f"scale={global_batch}/{base_batch}, rule={rule!r}, initial_lr={base:.6g})"
        )
    return optimizer, callbacks, {"optimizer": code, "callbacks": callbacks_code}


def _to_target(target, max_seconds):
    """A callback that records the target metric after each epoch, at the seconds since training
    began, and stops the run when the target is reached or the trial's time is up."""
    from tfpar._keras import keras

    class ToTarget(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.curve, self.stopped, self.reached_at, self.started = [], "max_epochs", None, 0.0

        def on_train_begin(self, logs=None):
            self.started = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            logs = logs or {}
            if target.metric not in logs:
                print("METRICS " + json.dumps(sorted(logs)), flush=True)
                raise ValueError(
                    f"The model logs no metric {target.metric!r}; it logs {sorted(logs)}."
                )
            seconds, value = (
                round(time.perf_counter() - self.started, 3),
                float(logs[target.metric]),
            )
            self.curve.append([seconds, value])
            if target.reached(value):
                self.stopped, self.reached_at = "target", (seconds, epoch + 1)
                self.model.stop_training = True
            elif seconds >= max_seconds and epoch >= 1:
                # 2 epochs at least: examples/s past the first's tracing
                self.stopped = f"stopped at {max_seconds:.1f} s"
                self.model.stop_training = True

    return ToTarget()


def _trial(spec):
    """Runs one trial in this process and prints ``TRIAL {json}``."""
    import tfpar
    from tfpar.tune.space import AXES, DEFAULTS

    config = {**{a: None for a in AXES}, **DEFAULTS, **spec["config"]}
    # Several workers (TF_CONFIG): one replica each, and the strategy created first.
    parallelism = trial_spec(
        config, spec["devices"], split_devices="TF_CONFIG" not in os.environ
    ).build()
    model = parallelism.build(_resolve(spec["model_fn"]))
    replicas = parallelism.num_replicas_in_sync
    global_batch = config["per_replica_batch"] * replicas
    with parallelism.scope():
        optimizer, callbacks, code = _optimizer(
            config, spec, model, global_batch, DEFAULTS["per_replica_batch"] * replicas
        )
        # weighted: the padding of the validation set
        model.compile(
            optimizer,
            spec["loss"],
            steps_per_execution=config["steps_per_execution"],
            weighted_metrics=spec.get("metrics") or None,
        )
    train = tfpar.data.distribute(
        _resolve(spec["data_fn"])(), parallelism, global_batch, remainder="drop"
    )
    throughput = tfpar.callbacks.Throughput(global_batch)
    callbacks = [throughput, *callbacks]
    if spec.get("target") is None:
        result = _timed(model, train, spec, callbacks)
    else:
        reached = _to_the_target(model, train, spec, parallelism, global_batch, callbacks)
        result = {**reached, "code": code}
    if parallelism.input_strategy.extended.should_checkpoint:  # one line per job: its chief's
        result = {**result, "global_batch": global_batch, "pipeline": bool(config["microbatches"])}
        _report(result)


def _timed(model, train, spec, callbacks):
    """Examples per second over ``spec["steps"]`` steps, after a warm-up epoch of as many."""
    history = model.fit(
        train.dataset, steps_per_epoch=spec["steps"], epochs=2, verbose=0, callbacks=callbacks
    )
    return {"examples_per_second": history.history["examples_per_second"][-1]}


def _to_the_target(model, train, spec, parallelism, global_batch, callbacks):
    """Trains until ``spec["target"]`` is reached, or its epochs or seconds run out; the time to
    reach it, the curve and the speed."""
    import tfpar
    from tfpar.tune.space import Target

    validation = {}
    if spec.get("validation_fn"):
        val = tfpar.data.distribute(
            _resolve(spec["validation_fn"])(), parallelism, global_batch, remainder="pad"
        )
        validation = {"validation_data": val.dataset, "validation_steps": val.steps_per_epoch}
    recorder = _to_target(Target(**spec["target"]), spec["max_seconds"])
    history = model.fit(
        train.dataset,
        steps_per_epoch=train.steps_per_epoch,
        epochs=spec["max_epochs"],
        verbose=0,
        callbacks=[*callbacks, recorder],
        **validation,
    )
    seconds, epochs = recorder.reached_at or (None, None)
    speeds = history.history["examples_per_second"]
    return {
        "examples_per_second": max(speeds[1:] or speeds),
        "seconds_to_target": seconds,
        "epochs_to_target": epochs,
        "curve": recorder.curve,
        "stopped": recorder.stopped,
    }


def _report(result):
    """The trial's one line for the tuner: ``TRIAL {json}``, NaN as null."""
    line = json.dumps(
        result, default=lambda v: None if isinstance(v, float) and math.isnan(v) else v
    )
    print(f"TRIAL {line}", flush=True)


if __name__ == "__main__":
    _trial(json.loads(sys.argv[1]))
    skip_exit_collections()
