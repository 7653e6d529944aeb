"""The ``tfpar`` command's parsers: one function per subcommand, each naming the function of
`tfpar.cli.commands` that runs it (launch's and tune's options are their packages' own)."""

import argparse

from tfpar._checks import whole_number as _int
from tfpar.cli import commands

__all__ = ["build"]


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Every option's default in ``--help``, unless its help says it or it has none."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (
            "default" in text
            or any(action.default is v for v in (None, False, argparse.SUPPRESS))
            or not action.option_strings
        ):
            return text
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """A subcommand's parser, with every option's default in its ``--help``."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)


def build(exit_codes: dict) -> argparse.ArgumentParser:
    """The ``tfpar`` parser, its subcommands' each from a function of their own."""
    from tfpar import __version__

    codes = "\n".join(f"  {code:<4} {meaning}" for code, meaning in exit_codes.items())
    parser = argparse.ArgumentParser(
        prog="tfpar",
        description="Distributed training for Keras models (tf_keras and Keras 3).",
        epilog=f"exit codes:\n{codes}",
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"tfpar {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for add in (
        _demo_parser,
        _verify_parser,
        _report_parser,
        _launch_parser,
        _tune_parser,
        _doctor_parser,
        _install_parser,
    ):
        add(sub)
    return parser


def _demo_parser(sub):
    demo = sub.add_parser(
        "demo",
        help="train a small CNN on the bundled digits (a small transformer on "
        "generated tokens under tensor_parallel)",
    )
    demo.set_defaults(func=commands.demo)
    _demo_layout_arguments(demo.add_argument_group("the layout"))
    _demo_training_arguments(demo.add_argument_group("training"))
    _demo_after_training_arguments(demo.add_argument_group("after training"))


def _demo_layout_arguments(group):
    from tfpar._factory import STRATEGIES

    group.add_argument(
        "--strategy",
        default="data_parallel",
        choices=STRATEGIES,
        help="data_parallel, horovod (starts the ranks with horovodrun), "
        "parameter_server (a local parameter-server cluster), pipeline (2 stages) or "
        "tensor_parallel (a small transformer's layers split over the devices)",
    )
    group.add_argument(
        "--devices",
        type=_int,
        default=None,
        help="virtual CPU devices when there is no GPU (tensor_parallel: its degree), Horovod "
        "ranks, or PS workers (default 2)",
    )
    group.add_argument(
        "--replicas",
        type=_int,
        default=1,
        help="with --strategy pipeline: data-parallel copies of the 2-stage pipeline",
    )
    group.add_argument(
        "--microbatches",
        type=_int,
        default=8,
        help="with --strategy pipeline: microbatches per replica and step",
    )


def _demo_training_arguments(group):
    group.add_argument(
        "--precision",
        default="float32",
        help="auto, mixed_float16, mixed_bfloat16 or float32 (default)",
    )
    group.add_argument(
        "--compression",
        default="none",
        help="data_parallel and horovod: the gradients on the wire, none (default), bf16 or fp16",
    )
    group.add_argument(
        "--zero-stage",
        type=_int,
        default=0,
        help=(
            "data_parallel, horovod: the optimizer state sharded (ZeRO 1 or 2), or the "
            "parameters too (3)"
        ),
    )
    group.add_argument("--epochs", type=_int, default=None, help="default 8 (or $TFPAR_EPOCHS)")
    group.add_argument(
        "--batch-size", type=_int, default=None, help="global batch size (default: 32 per replica)"
    )
    group.add_argument(
        "--keras",
        type=_int,
        default=2,
        choices=(2, 3),
        help="the Keras the model is built in: 2 (tf_keras, default) or 3 (Keras 3; "
        "data_parallel, horovod and pipeline)",
    )


def _demo_after_training_arguments(group):
    group.add_argument(
        "--qat",
        action="store_true",
        help="then quantization-aware fine-tuning and float vs int8 TFLite export",
    )
    group.add_argument(
        "--compress",
        action="store_true",
        help="then pruning, clustering and cluster-preserving QAT, exported as int8 TFLite "
        "with its deployment report (size raw and gzipped, sparsity, accuracy, latency)",
    )
    group.add_argument("--quiet", action="store_true", help="no progress bar")
    group.add_argument(
        "--report",
        metavar="DIR",
        default=None,
        help="write the run's timeline and plots (tfpar report) to DIR, and say where",
    )


def _verify_parser(sub):
    from tfpar._factory import STRATEGIES

    verify = sub.add_parser(
        "verify",
        help="prove a model trains under a distribution as on one replica",
        description="K steps on one replica and K steps under --strategy, from the same weights "
        "and batches; prints each variable's largest difference and its likely cause, "
        "and exits 1 above --tolerance. Several workers: tfpar launch -n 2 -- python "
        "-m tfpar verify ...",
    )
    verify.set_defaults(func=commands.verify)
    verify.add_argument(
        "--model",
        required=True,
        help="module:function that builds and compiles the model (looked up from this folder)",
    )
    verify.add_argument(
        "--data",
        required=True,
        help="module:function returning (x, y) arrays or an unbatched tf.data.Dataset",
    )
    verify.add_argument(
        "--strategy", default="data_parallel", choices=STRATEGIES, help="the parallelism to check"
    )
    _verify_parallelism_arguments(verify)
    verify.add_argument("--steps", type=_int, default=10, help="steps on each side (default 10)")
    verify.add_argument(
        "--batch-size", type=_int, default=None, help="global batch (default 32 per replica)"
    )
    verify.add_argument(
        "--tolerance",
        type=float,
        default=1e-5,
        help="largest absolute difference per variable (default 1e-5)",
    )
    verify.add_argument(
        "--seed", type=_int, default=0, help="Keras seed before each build (default 0)"
    )


def _verify_parallelism_arguments(verify):
    """``tfpar verify``'s options of the parallelism it checks: its replicas and its options."""
    verify.add_argument(
        "--replicas",
        type=_int,
        default=None,
        help="data_parallel: devices (default 2; 1 per worker under tfpar launch); ps: workers "
        "(default 1: more train asynchronously); pipeline: copies of a 2-stage pipeline "
        "(default 1); tensor_parallel: the degree (default 2)",
    )
    verify.add_argument(
        "--tensor-parallel", type=_int, default=1, help="pipeline: each stage split over N devices"
    )
    verify.add_argument(
        "--zero-stage",
        type=_int,
        default=0,
        help=(
            "data_parallel, horovod: the optimizer state sharded (ZeRO 1 or 2), or the "
            "parameters too (3)"
        ),
    )
    verify.add_argument(
        "--remat",
        type=_remat,
        default="none",
        help="data_parallel, horovod, pipeline: the blocks that recompute their activations "
        "('blocks', or layer names and patterns, comma-separated; default none)",
    )
    verify.add_argument(
        "--paths",
        default=None,
        help="data_parallel, horovod: one row per gradient path instead ('all', or names: "
        "plain, bf16, fp16, zero1, zero2, accumulate, mixed_float16, pairs as bf16+zero1)",
    )


def _report_parser(sub):
    plots = sub.add_parser(
        "report", help="PNG plots of a run from its timeline (tfpar launch --timeline DIR)"
    )
    plots.set_defaults(func=commands.report)
    plots.add_argument("run_dir", help="the run's folder (its timeline.json)")
    plots.add_argument(
        "--out", default=None, help="where the PNG files go (default: the run's folder)"
    )


def _launch_parser(sub):
    run = sub.add_parser(
        "launch",
        help="start a job's processes with TF_CONFIG",
        description="Local: tfpar launch -n 2 -- python train.py. Several hosts: on host K run "
        "tfpar launch --hosts a:2222,b:2222 --task-index K -- python train.py.",
    )
    from tfpar.launch import command as launch_command

    launch_command.add_arguments(run)
    run.set_defaults(func=lambda args, command_line=None: launch_command.run(args))


def _tune_parser(sub):
    tune = sub.add_parser(
        "tune",
        help="run short trials over a search space; report the fastest, or the first to a --target",
        description='tfpar tune --space \'{"per_replica_batch": [16, 64], '
        "\"steps_per_execution\": [1, 4]}' (default: the demo's model and data)",
    )
    from tfpar.tune import command as tune_command

    tune_command.add_arguments(tune)
    tune.set_defaults(func=lambda args, command_line=None: tune_command.run(args))


def _doctor_parser(sub):
    sub.add_parser(
        "doctor",
        help="versions, devices, the CPU's vector instructions and whether Horovod "
        "(and its Keras API) is usable",
    ).set_defaults(func=commands.doctor)


def _install_parser(sub):
    from tfpar import install_horovod

    install = sub.add_parser(
        "install-horovod",
        help=f"build Horovod {install_horovod.VERSION} against this "
        "TensorFlow (checked, cached) and install it",
        description=install_horovod.__doc__,
    )
    install_horovod.add_arguments(install)
    install.set_defaults(func=lambda args, command_line=None: install_horovod.run(args))


def _remat(text: str):
    """``--remat``: "none", "blocks", or layer names and patterns separated by commas."""
    from tfpar.remat._blocks import CHOICES

    if text in CHOICES:
        return text
    return [name.strip() for name in text.split(",") if name.strip()]
