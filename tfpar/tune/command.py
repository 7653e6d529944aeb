"""``tfpar tune``'s options and run, for ``tfpar.cli`` (no TensorFlow in this process: the trials
load it)."""

import argparse
import json

from tfpar._checks import whole_number as _int

__all__ = ["add_arguments", "run"]


def add_arguments(tune: argparse.ArgumentParser) -> None:
    _what_arguments(tune.add_argument_group("what is trained"))
    _search_arguments(tune.add_argument_group("the search"))
    _trial_arguments(tune.add_argument_group("each trial"))


def _what_arguments(group):
    group.add_argument(
        "--model", default="tfpar.demo:build_model", help="module:function building the model"
    )
    group.add_argument(
        "--data",
        default="tfpar.demo:digits_dataset",
        help="module:function returning a tf.data.Dataset of (x, y) examples",
    )
    group.add_argument("--metrics", default="accuracy", help="compile's metrics, comma-separated")
    group.add_argument(
        "--optimizer",
        default="adam",
        help="the model's own optimizer (the optimizer axis' 'model')",
    )
    group.add_argument(
        "--loss", default="sparse_categorical_crossentropy", help="the loss each trial compiles"
    )


def _search_arguments(group):
    group.add_argument(
        "--space",
        default=None,
        help="JSON {axis: [values]}; axes: per_replica_batch, steps_per_execution, num_packs, "
        "bytes_per_pack, microbatches, schedule, virtual_stages, tensor_degree, strategy "
        "(data_parallel, horovod), compression (none, bf16, fp16), horovod_autotune (false, true), "
        "zero_stage, remat (none, blocks), optimizer (model, lars, lamb), scaling_rule (none, "
        "linear, sqrt), warmup_epochs. Default: batch and steps_per_execution (with --target: "
        "batch, optimizer and scaling rule); with --workers N > 1, both strategies too "
        "(tfpar.tune.workers_space)",
    )
    group.add_argument(
        "--target",
        metavar="METRIC=VALUE",
        help="rank the trials by the wall time to reach it, e.g. val_accuracy=0.95 (default: by "
        "examples per second); each trial trains until it gets there, or --max-epochs, or "
        "--max-seconds",
    )
    group.add_argument(
        "--validation-data",
        default=None,
        help="module:function returning the validation examples (default with --target and the "
        "demo's data: tfpar.demo:digits_validation_dataset)",
    )
    group.add_argument(
        "--max-epochs", type=_int, default=30, help="with --target: epochs a trial may train"
    )
    group.add_argument(
        "--max-seconds", type=float, default=120.0, help="with --target: seconds a trial may train"
    )
    group.add_argument("--json", help="also write the trials and the winner to this file")


def _trial_arguments(group):
    group.add_argument(
        "--steps", type=_int, default=20, help="timed steps per trial (without --target)"
    )
    group.add_argument(
        "--devices", type=_int, default=2, help="virtual CPU devices of a one-worker trial (no GPU)"
    )
    group.add_argument(
        "--workers",
        type=_int,
        default=1,
        help="run each trial as a job of N workers (or Horovod ranks) under tfpar launch",
    )
    group.add_argument(
        "--trial-timeout",
        type=float,
        default=300.0,
        help="seconds a trial may run before it is stopped and counted as failed (default 300)",
    )


def _default_space(args):
    """The search space when --space is not given."""
    from tfpar.tune import workers_space

    if args.workers > 1:
        return workers_space()
    if args.target:  # a larger batch with the rate it needs, against the defaults
        return {
            "per_replica_batch": [32, 128],
            "optimizer": ["model", "lars"],
            "scaling_rule": ["sqrt"],
        }
    return {"per_replica_batch": [16, 32, 64], "steps_per_execution": [1, 4]}


def run(args: argparse.Namespace) -> int:
    from tfpar._files import check_folder_of, write_atomically
    from tfpar.tune import tune

    if args.json:
        check_folder_of("--json", args.json)  # before the trials, not after them
    if args.space is None:
        space = _default_space(args)
    else:
        try:
            space = json.loads(args.space)
        except json.JSONDecodeError as error:
            raise ValueError(f"--space must be JSON. Received: {args.space!r} ({error}).") from None
    validation = args.validation_data
    if validation is None and args.target and args.data == "tfpar.demo:digits_dataset":
        validation = "tfpar.demo:digits_validation_dataset"
    result = tune(
        args.model,
        args.data,
        space,
        loss=args.loss,
        optimizer=args.optimizer,
        steps=args.steps,
        devices=args.devices,
        timeout_seconds=args.trial_timeout,
        print_fn=lambda line: print(line, flush=True),
        workers=args.workers,
        target=args.target,
        validation_fn=validation,
        metrics=[m.strip() for m in args.metrics.split(",") if m.strip()],
        max_epochs=args.max_epochs,
        max_seconds=args.max_seconds,
    )
    print(result.describe())
    if args.json:
        write_atomically(args.json, result.to_json())
    return 0 if result.best else 1
