"""The ``tfpar`` command: ``demo``, ``launch``, ``tune``, ``verify``, ``report``, ``doctor`` and ``install-horovod``."""

import argparse
import functools
import os
import sys
from collections.abc import Sequence

from tfpar._checks import whole_number as _int
from tfpar._local.processes import LaunchError

__all__ = ["EXIT_CODES", "main"]


EXIT_CODES = {
    0: "success (tfpar verify: the model trains like one replica)",
    1: "tfpar verify: the model differs from one replica; tfpar tune: no trial succeeded",
    2: "usage error: an unknown option, a missing argument or a value outside an option's choices (argparse)",
    3: "a value tfpar refused (TypeError, ValueError), before anything started",
    4: "a missing dependency (ImportError), named with the command that installs it",
    124: "a task hung: it made no training step for --heartbeat-timeout seconds (its stacks were dumped)",
    128: "plus N: interrupted by signal N (130: Ctrl-C), passed on to every task first",
}
"""The exit codes of ``tfpar``. A task that fails ends ``tfpar launch`` with that task's own exit code
(which the launcher names), as horovodrun and mpirun do."""
EXIT_USAGE, EXIT_BAD_VALUE, EXIT_MISSING_DEPENDENCY = 2, 3, 4


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Every option's default in ``--help``, unless its help says it or it has none."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or any(action.default is v for v in (None, False, argparse.SUPPRESS)) \
                or not action.option_strings:
            return text
        return super()._get_help_string(action)


def _parser():
    from tfpar import __version__

    codes = "\n".join(f"  {code:<4} {meaning}" for code, meaning in EXIT_CODES.items())
    parser = argparse.ArgumentParser(prog="tfpar", description="Distributed training for Keras models (tf_keras and Keras 3).",
                                     epilog=f"exit codes:\n{codes}", formatter_class=_HelpFormatter)
    parser.add_argument("--version", action="version", version=f"tfpar {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser = functools.partial(sub.add_parser, formatter_class=_HelpFormatter)
    for add in (_demo_parser, _verify_parser, _report_parser, _launch_parser, _tune_parser, _doctor_parser,
                _install_parser):
        add(sub)
    return parser


def _demo_parser(sub):
    from tfpar._factory import STRATEGIES

    demo = sub.add_parser("demo", help="train a small CNN on the bundled digits (a small transformer on "
                                       "generated tokens under tensor_parallel)")
    demo.set_defaults(func=_demo)
    demo.add_argument("--strategy", default="data_parallel", choices=STRATEGIES,
                      help="data_parallel, horovod (starts the ranks with horovodrun), "
                           "parameter_server (a local parameter-server cluster), pipeline (2 stages) or "
                           "tensor_parallel (a small transformer's layers split over the devices)")
    demo.add_argument("--devices", type=_int, default=None,
                      help="virtual CPU devices when there is no GPU (tensor_parallel: its degree), Horovod "
                           "ranks, or PS workers (default 2)")
    demo.add_argument("--replicas", type=_int, default=1,
                      help="with --strategy pipeline: data-parallel copies of the 2-stage pipeline")
    demo.add_argument("--microbatches", type=_int, default=8,
                      help="with --strategy pipeline: microbatches per replica and step")
    demo.add_argument("--precision", default="float32",
                      help="auto, mixed_float16, mixed_bfloat16 or float32 (default)")
    demo.add_argument("--compression", default="none",
                      help="data_parallel and horovod: the gradients on the wire, none (default), bf16 or fp16")
    demo.add_argument("--zero-stage", type=_int, default=0, help="data_parallel, horovod: the optimizer state sharded (ZeRO 1 or 2)")
    demo.add_argument("--qat", action="store_true",
                      help="then quantization-aware fine-tuning and float vs int8 TFLite export")
    demo.add_argument("--compress", action="store_true",
                      help="then pruning, clustering and cluster-preserving QAT, exported as int8 TFLite "
                           "with its deployment report (size raw and gzipped, sparsity, accuracy, latency)")
    demo.add_argument("--epochs", type=_int, default=None, help="default 8 (or $TFPAR_EPOCHS)")
    demo.add_argument("--batch-size", type=_int, default=None,
                      help="global batch size (default: 32 per replica)")
    demo.add_argument("--keras", type=_int, default=2, choices=(2, 3),
                      help="the Keras the model is built in: 2 (tf_keras, default) or 3 (Keras 3; "
                           "data_parallel, horovod and pipeline)")
    demo.add_argument("--quiet", action="store_true", help="no progress bar")
    demo.add_argument("--report", metavar="DIR", default=None,
                      help="write the run's timeline and plots (tfpar report) to DIR, and say where")


def _verify_parser(sub):
    from tfpar._factory import STRATEGIES

    verify = sub.add_parser(
        "verify", help="prove a model trains under a distribution as on one replica",
        description="K steps on one replica and K steps under --strategy, from the same weights and "
                    "batches; prints each variable's largest difference and its likely cause, and exits 1 "
                    "above --tolerance. Several workers: tfpar launch -n 2 -- python -m tfpar verify ...")
    verify.set_defaults(func=_verify)
    verify.add_argument("--model", required=True,
                        help="module:function that builds and compiles the model (looked up from this folder)")
    verify.add_argument("--data", required=True,
                        help="module:function returning (x, y) arrays or an unbatched tf.data.Dataset")
    verify.add_argument("--strategy", default="data_parallel", choices=STRATEGIES, help="the parallelism to check")
    verify.add_argument("--replicas", type=_int, default=None,
                        help="data_parallel: devices (default 2; 1 per worker under tfpar launch); ps: workers "
                             "(default 1: more train asynchronously); pipeline: copies of a 2-stage pipeline "
                             "(default 1); tensor_parallel: the degree (default 2)")
    verify.add_argument("--tensor-parallel", type=_int, default=1, help="pipeline: each stage split over N devices")
    verify.add_argument("--zero-stage", type=_int, default=0, help="data_parallel, horovod: the optimizer state sharded (ZeRO 1 or 2)")
    verify.add_argument("--paths", default=None,
                        help="data_parallel, horovod: one row per gradient path instead ('all', or names: "
                             "plain, bf16, fp16, zero1, zero2, accumulate, mixed_float16, pairs as bf16+zero1)")
    verify.add_argument("--steps", type=_int, default=10, help="steps on each side (default 10)")
    verify.add_argument("--batch-size", type=_int, default=None, help="global batch (default 32 per replica)")
    verify.add_argument("--tolerance", type=float, default=1e-5,
                        help="largest absolute difference per variable (default 1e-5)")
    verify.add_argument("--seed", type=_int, default=0, help="Keras seed before each build (default 0)")


def _report_parser(sub):
    plots = sub.add_parser("report", help="PNG plots of a run from its timeline (tfpar launch --timeline DIR)")
    plots.set_defaults(func=_report)
    plots.add_argument("run_dir", help="the run's folder (its timeline.json)")
    plots.add_argument("--out", default=None, help="where the PNG files go (default: the run's folder)")


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
    tune = sub.add_parser("tune", help="run short trials over a search space; report the fastest, or the first to a --target",
                          description="tfpar tune --space '{\"per_replica_batch\": [16, 64], "
                                      "\"steps_per_execution\": [1, 4]}' (default: the demo's model and data)")
    from tfpar.tune import command as tune_command

    tune_command.add_arguments(tune)
    tune.set_defaults(func=lambda args, command_line=None: tune_command.run(args))


def _doctor_parser(sub):
    sub.add_parser("doctor", help="versions, devices, the CPU's vector instructions and whether Horovod "
                                  "(and its Keras API) is usable").set_defaults(func=_doctor)


def _install_parser(sub):
    from tfpar import install_horovod

    install = sub.add_parser("install-horovod", help=f"build Horovod {install_horovod.VERSION} against this "
                                                     "TensorFlow (checked, cached) and install it",
                             description=install_horovod.__doc__)
    install_horovod.add_arguments(install)
    install.set_defaults(func=lambda args, command_line=None: install_horovod.run(args))


def _doctor(args=None, command_line=None):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tfpar.doctor import report

    print("\n".join(report()))
    return 0


def _demo(args, command_line=None):
    from tfpar._checks import default_epochs

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.epochs is None:
        args.epochs = default_epochs(8)
    if args.strategy == "horovod" and "HOROVOD_RANK" not in os.environ:
        # Start the ranks (one per --devices, default 2) and run this same demo in each.
        from tfpar._factory import ParallelismSpec

        spec = ParallelismSpec(kind="horovod", compression=args.compression, zero_stage=args.zero_stage)
        argv = [sys.executable, "-m", "tfpar.cli", "demo", *spec.demo_flags(), "--epochs", str(args.epochs)]
        if args.batch_size:
            argv += ["--batch-size", str(args.batch_size)]
        argv += ["--precision", args.precision, "--keras", str(args.keras)]
        argv += ["--qat"] if args.qat else []
        argv += ["--compress"] if args.compress else []
        if args.quiet:
            argv.append("--quiet")
        if args.report:
            argv += ["--report", os.path.abspath(args.report)]
        from tfpar.launch.backends import Horovod
        from tfpar.launch.config import LaunchConfig

        return Horovod().run(LaunchConfig(command=tuple(argv), horovod=True, workers=args.devices or 2))
    if args.strategy == "parameter_server" and command_line is not None:
        _keep_servers_on_loopback(command_line)
    from tfpar.demo import run_demo

    run_demo(strategy=args.strategy, num_devices=args.devices, epochs=args.epochs,
             global_batch_size=args.batch_size, verbose=0 if args.quiet else 1,
             replicas=args.replicas, microbatches=args.microbatches, precision=args.precision, qat=args.qat,
             keras_version=args.keras, report_dir=args.report, compression=args.compression,
             compress=args.compress, zero_stage=args.zero_stage)
    return 0


def _report(args, command_line=None):
    from tfpar.report import report

    folder = args.run_dir
    written = report(folder, args.out)
    print("\n".join(["wrote:", *(f"  {path}" for path in written)]) if written else
          f"nothing to plot in {folder}: its timeline has no steps")
    return 0


def _verify(args, command_line=None):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.strategy == "parameter_server" and command_line is not None:
        _keep_servers_on_loopback(command_line)
    if os.getcwd() not in sys.path:  # module:function from the folder the command runs in, as python -m does
        sys.path.insert(0, os.getcwd())
    from tfpar.verify import load_function, verify

    model_fn, data_fn = load_function(args.model, "--model"), load_function(args.data, "--data")
    report = verify(model_fn, data_fn, strategy=args.strategy, replicas=args.replicas, steps=args.steps,
                    global_batch_size=args.batch_size, tolerance=args.tolerance, seed=args.seed,
                    tensor_parallel=args.tensor_parallel, zero_stage=args.zero_stage, paths=args.paths)
    if report.chief:  # one report per job
        print(report.describe(), flush=True)
    return 0 if report.passed else 1


def _keep_servers_on_loopback(command_line):
    """Runs this command again with tfpar's loopback library, so that the servers this process
    starts (the chief of a local parameter-server cluster) listen on loopback only."""
    from tfpar._local import loopback as _loopback

    if not _loopback.active():
        _loopback.start_again_with_library([sys.executable, "-m", "tfpar.cli", *command_line])


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``tfpar`` command; returns its exit status."""
    args = _parser().parse_args(argv)
    try:
        # The real command line only: a call from Python (tests) is never replaced by exec.
        return args.func(args, command_line=sys.argv[1:] if argv is None else None)
    except LaunchError as e:
        print(f"tfpar {args.command}: error: {e}", file=sys.stderr)
        return e.returncode
    except (ValueError, TypeError) as e:
        print(f"tfpar {args.command}: error: {e}", file=sys.stderr)
        return EXIT_BAD_VALUE
    except ImportError as e:
        print(f"tfpar {args.command}: error: {e}", file=sys.stderr)
        return EXIT_MISSING_DEPENDENCY


if __name__ == "__main__":
    sys.exit(main())
