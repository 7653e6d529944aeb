"""Runs several of these test scripts in turn, in this process: one job of the launcher that
started it, one TensorFlow start and one collective for them all.

Usage: in_turn.py SCRIPT [ARG ...] [--then SCRIPT [ARG ...] ...]
Each SCRIPT (a file of this folder) runs as ``__main__`` with its own ``sys.argv``, as the
launcher would have run it alone; a second multi-worker DataParallel keeps the first one's server.
Before each, this process prints ``IN TURN <script>``, so that a test can tell whose lines follow,
and ``IN TURN FAILED <script>`` where one fails (tests.conftest.in_turn_failure).
"""

import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def split_at(argv, separator):
    """``argv`` split at each ``separator``: a list of lists (e.g. [[SCRIPT, ARG, ...], ...])."""
    parts = [[]]
    for arg in argv:
        if arg == separator:
            parts.append([])
        else:
            parts[-1].append(arg)
    return parts


def run(script, args):
    """Runs ``script`` as ``__main__`` with ``args``; a script that exits with 0 lets the next
    run, and one that fails says so (``IN TURN FAILED <script>``) before its error ends the job."""
    path = os.path.join(HERE, script)
    print(f"IN TURN {script}", flush=True)
    sys.argv = [path, *args]
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as stop:
        if stop.code not in (None, 0):
            print(f"IN TURN FAILED {script}: exit {stop.code}", flush=True)
            raise
    except BaseException:
        print(f"IN TURN FAILED {script}", flush=True)
        raise


if __name__ == "__main__":
    for script, *args in split_at(sys.argv[1:], "--then"):
        run(script, args)
