"""The ``tfpar`` command: ``demo``, ``launch``, ``tune``, ``verify``, ``report``, ``doctor`` and
``install-horovod``."""

import sys
from collections.abc import Sequence

from tfpar._local.processes import LaunchError, skip_exit_collections
from tfpar.cli import parsers

__all__ = ["EXIT_CODES", "main"]


EXIT_CODES = {
    0: "success (tfpar verify: the model trains like one replica)",
    1: "tfpar verify: the model differs from one replica; tfpar tune: no trial succeeded",
    2: "usage error: an unknown option, a missing argument or a value outside an option's choices "
    "(argparse)",
    3: "a value tfpar refused (TypeError, ValueError), before anything started",
    4: "a missing dependency (ImportError), named with the command that installs it",
    124: "a task hung: it made no training step for --heartbeat-timeout seconds (its stacks were "
    "dumped)",
    128: "plus N: interrupted by signal N (130: Ctrl-C), passed on to every task first",
}
"""The exit codes of ``tfpar``. A task that fails ends ``tfpar launch`` with that task's own exit
code (which the launcher names), as horovodrun and mpirun do."""
EXIT_USAGE = 2
EXIT_BAD_VALUE = 3
EXIT_MISSING_DEPENDENCY = 4


def _parser():
    return parsers.build(EXIT_CODES)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``tfpar`` command; returns its exit status. Run as the command (``argv`` None), the
    process ends when it returns (`tfpar._local.processes.skip_exit_collections`)."""
    status = _run(argv)
    if argv is None:
        skip_exit_collections()
    return status


def _run(argv):
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
