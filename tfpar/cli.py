"""The ``tfpar`` command: ``demo``, ``launch``, ``tune``, ``verify``, ``report``, ``doctor`` and ``install-horovod``."""

import argparse
import functools
import os
import sys
from collections.abc import Sequence

from tfpar._checks import whole_number as _int
from tfpar._local.processes import DEFAULT_GRACE_SECONDS, LaunchError
from tfpar._tasks.elastic_batch import ELASTIC_BATCHES

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
    from tfpar._factory import STRATEGIES
    from tfpar.cluster import ROLES
    from tfpar.launch.rendezvous.static import DEFAULT_MASTER_PORT

    codes = "\n".join(f"  {code:<4} {meaning}" for code, meaning in EXIT_CODES.items())
    parser = argparse.ArgumentParser(prog="tfpar", description="Distributed training for Keras models (tf_keras and Keras 3).",
                                     epilog=f"exit codes:\n{codes}", formatter_class=_HelpFormatter)
    parser.add_argument("--version", action="version", version=f"tfpar {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser = functools.partial(sub.add_parser, formatter_class=_HelpFormatter)

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

    plots = sub.add_parser("report", help="PNG plots of a run from its timeline (tfpar launch --timeline DIR)")
    plots.set_defaults(func=_report)
    plots.add_argument("run_dir", help="the run's folder (its timeline.json)")
    plots.add_argument("--out", default=None, help="where the PNG files go (default: the run's folder)")

    run = sub.add_parser(
        "launch",
        help="start a job's processes with TF_CONFIG",
        description="Local: tfpar launch -n 2 -- python train.py. Several hosts: on host K run "
                    "tfpar launch --hosts a:2222,b:2222 --task-index K -- python train.py.",
    )
    run.set_defaults(func=_launch)
    run.add_argument("-n", "--workers", type=_int, default=None,
                     help="number of local workers on 127.0.0.1, sharing this host's devices")
    run.add_argument("--nproc-per-node", type=_int, default=None, metavar="N",
                     help="N workers on this host, each with its own GPUs (CUDA_VISIBLE_DEVICES) or, without a GPU, "
                          "its own virtual CPU device; with --hosts or --nnodes, N on every host")
    run.add_argument("--nnodes", default=None, metavar="K|MIN:MAX",
                     help="K identical hosts: run the same line on each with its --node-rank; node 0 (at "
                          "--master-addr) tells every node the others' addresses. MIN:MAX: an elastic job, the same "
                          "line on every host (no --node-rank); it goes on with at least MIN when hosts are lost and "
                          "grows back to MAX as they join, restarting every worker from FaultTolerance's backup")
    run.add_argument("--node-rank", type=_int, default=None, metavar="R",
                     help="with --nnodes K: this host, 0 to K-1")
    run.add_argument("--master-addr", default=None, metavar="HOST",
                     help="with --nnodes: node 0's address, reachable from every node")
    run.add_argument("--master-port", type=_int, default=DEFAULT_MASTER_PORT, help="with --nnodes: node 0's port")
    run.add_argument("--rendezvous-timeout", type=float, default=300.0,
                     help="with --nnodes: seconds to wait for every node to join (MIN:MAX: for MIN)")
    run.add_argument("--ps", type=_int, default=0,
                     help="parameter-server job: this many ps tasks, -n worker servers, and a chief "
                          "that runs the command")
    run.add_argument("--hosts", help="comma-separated host[:port] list (port 2222 when left out), one worker each, "
                                      "or --nproc-per-node each on consecutive ports")
    run.add_argument("--cluster", help="JSON file with the cluster ({\"worker\": [...], ...})")
    run.add_argument("--task-type", default="worker", choices=ROLES, help="this machine's role (multi-host)")
    run.add_argument("--task-index", type=_int, default=None,
                     help="this machine's index in its role (multi-host)")
    run.add_argument("--grace", type=float, default=DEFAULT_GRACE_SECONDS,
                     help="seconds a stopped task gets before SIGKILL")
    run.add_argument("--max-restarts", type=_int, default=0,
                     help="local jobs: when a task fails, stop the others and start the job again on "
                          "fresh ports, up to this many times (training resumes from FaultTolerance's backup); "
                          "elastic jobs: the failures of one worker's slot (--nnodes MIN:MAX: of one node's workers) before "
                          "it is dropped")
    run.add_argument("--min-workers", type=_int, default=None, metavar="N",
                     help="an elastic local job: it trains on with at least N workers when it loses some (default 1)")
    run.add_argument("--max-workers", type=_int, default=None, metavar="N",
                     help="an elastic local job: at most N workers; it grows back to them when capacity returns")
    run.add_argument("--host-discovery-script", default=None, metavar="PATH",
                     help="an elastic local job: an executable printing host:slots lines (Horovod's), run again "
                          "every second; a worker a slot")
    run.add_argument("--host-discovery-file", default=None, metavar="PATH",
                     help="an elastic local job: a file of host:slots lines, read again every second")
    run.add_argument("--elastic-timeout", type=float, default=600.0,
                     help="an elastic job: seconds to wait for --min-workers slots (--nnodes MIN:MAX: MIN nodes) "
                          "before failing")
    run.add_argument("--elastic-batch", default="accumulate", choices=ELASTIC_BATCHES,
                     help="an elastic job on fewer workers than --max-workers (else the most it has had; --nnodes MIN:MAX: "
                          "MAX nodes'): keep the "
                          "global batch by computing each replica's batch in micro-batches of the full job's size and "
                          "accumulating their gradients (DataParallel), or by larger per-replica batches (grow); or keep "
                          "each replica's batch, the global batch following the workers, and scale the learning rate "
                          "with it by the linear rule (scale-lr) or the square root (scale-lr-sqrt)")
    run.add_argument("--heartbeat-timeout", type=float, default=None,
                     help="seconds a task may make no training step before it is named hung, its stacks are "
                          "dumped and the job is stopped (or restarted under --max-restarts)")
    run.add_argument("--timeline", metavar="DIR", default=None,
                     help="every fit of the job writes DIR/timeline.json: a Chrome trace of all workers' steps "
                          "(tfpar.callbacks.Timeline); with --horovod, Horovod's own DIR/horovod_timeline.json too")
    run.add_argument("--slurm", action="store_true",
                     help="join the SLURM job this srun task belongs to (one worker per task; the "
                          "cluster comes from SLURM_JOB_NODELIST, SLURM_NTASKS, SLURM_PROCID)")
    run.add_argument("--horovod", action="store_true",
                     help="start a Horovod job instead (horovodrun --gloo, -n local ranks)")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- program and arguments")

    tune = sub.add_parser("tune", help="run short trials over a search space; report the fastest, or the first to a --target",
                          description="tfpar tune --space '{\"per_replica_batch\": [16, 64], "
                                      "\"steps_per_execution\": [1, 4]}' (default: the demo's model and data)")
    from tfpar.tune import command as tune_command

    tune_command.add_arguments(tune)
    tune.set_defaults(func=lambda args, command_line=None: tune_command.run(args))

    sub.add_parser("doctor", help="versions, devices, the CPU's vector instructions and whether Horovod "
                                  "(and its Keras API) is usable").set_defaults(func=_doctor)
    from tfpar import install_horovod

    install = sub.add_parser("install-horovod", help=f"build Horovod {install_horovod.VERSION} against this "
                                                     "TensorFlow (checked, cached) and install it",
                             description=install_horovod.__doc__)
    install_horovod.add_arguments(install)
    install.set_defaults(func=lambda args, command_line=None: install_horovod.run(args))
    return parser


def _launch(args, command_line=None):
    from tfpar.launch.backends import backend_for

    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if args.timeline is not None:
        _timeline_folder(args.timeline, horovod=args.horovod)
    return backend_for(args).run(args, command)


def _timeline_folder(folder, horovod):
    """--timeline DIR: made if missing and checked writable now; the tasks inherit $TFPAR_TIMELINE."""
    from tfpar._tasks.timeline_files import TIMELINE_VARIABLE, timeline_in

    folder = os.path.dirname(timeline_in(folder, "--timeline"))
    os.environ[TIMELINE_VARIABLE] = folder
    if horovod:
        os.environ.setdefault("HOROVOD_TIMELINE", os.path.join(folder, "horovod_timeline.json"))


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
        args.workers, args.hosts, args.cluster = args.devices or 2, None, None
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

        return Horovod().run(args, argv)
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
