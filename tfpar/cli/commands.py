"""What ``tfpar demo``, ``verify``, ``report`` and ``doctor`` do with their parsed options
(each imports what it runs only when it runs: the CLI starts without TensorFlow)."""

import argparse
import os
import sys

__all__ = ["demo", "doctor", "keep_servers_on_loopback", "report", "verify"]


def doctor(args: argparse.Namespace | None = None, command_line: list[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tfpar.doctor import report

    print("\n".join(report()))
    return 0


def demo(args: argparse.Namespace, command_line: list[str] | None = None) -> int:
    from tfpar._checks import default_epochs

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.epochs is None:
        args.epochs = default_epochs(8)
    if args.strategy == "horovod" and "HOROVOD_RANK" not in os.environ:
        # Start the ranks (one per --devices, default 2) and run this same demo in each.
        from tfpar._factory import ParallelismSpec

        spec = ParallelismSpec(
            kind="horovod", compression=args.compression, zero_stage=args.zero_stage
        )
        argv = [
            sys.executable,
            "-m",
            "tfpar.cli",
            "demo",
            *spec.demo_flags(),
            "--epochs",
            str(args.epochs),
        ]
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

        return Horovod().run(
            LaunchConfig(command=tuple(argv), horovod=True, workers=args.devices or 2)
        )
    if args.strategy == "parameter_server" and command_line is not None:
        keep_servers_on_loopback(command_line)
    from tfpar.demo import run_demo

    run_demo(
        strategy=args.strategy,
        num_devices=args.devices,
        epochs=args.epochs,
        global_batch_size=args.batch_size,
        verbose=0 if args.quiet else 1,
        replicas=args.replicas,
        microbatches=args.microbatches,
        precision=args.precision,
        qat=args.qat,
        keras_version=args.keras,
        report_dir=args.report,
        compression=args.compression,
        compress=args.compress,
        zero_stage=args.zero_stage,
    )
    return 0


def report(args: argparse.Namespace, command_line: list[str] | None = None) -> int:
    from tfpar.report import report

    folder = args.run_dir
    written = report(folder, args.out)
    print(
        "\n".join(["wrote:", *(f"  {path}" for path in written)])
        if written
        else f"nothing to plot in {folder}: its timeline has no steps"
    )
    return 0


def verify(args: argparse.Namespace, command_line: list[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.strategy == "parameter_server" and command_line is not None:
        keep_servers_on_loopback(command_line)
    # module:function from the folder the command runs in, as python -m does
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    from tfpar.verify import load_function, verify

    model_fn, data_fn = load_function(args.model, "--model"), load_function(args.data, "--data")
    report = verify(
        model_fn,
        data_fn,
        strategy=args.strategy,
        replicas=args.replicas,
        steps=args.steps,
        global_batch_size=args.batch_size,
        tolerance=args.tolerance,
        seed=args.seed,
        tensor_parallel=args.tensor_parallel,
        zero_stage=args.zero_stage,
        paths=args.paths,
        remat=args.remat,
    )
    if report.chief:  # one report per job
        print(report.describe(), flush=True)
    return 0 if report.passed else 1


def keep_servers_on_loopback(command_line: list[str]) -> None:
    """Runs this command again with tfpar's loopback library, so that the servers this process
    starts (the chief of a local parameter-server cluster) listen on loopback only."""
    from tfpar._local import loopback as _loopback

    if not _loopback.active():
        _loopback.start_again_with_library([sys.executable, "-m", "tfpar.cli", *command_line])
