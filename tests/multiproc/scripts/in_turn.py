"""Runs several of these test scripts in turn, in this process: one job of the launcher that
started it, one TensorFlow start and one collective for them all.

Usage: in_turn.py SCRIPT [ARG ...] [--then SCRIPT [ARG ...] ...]
Each SCRIPT (a file of this folder) runs as ``__main__`` with its own ``sys.argv``, as the
launcher would have run it alone; a second multi-worker DataParallel keeps the first one's server.
Before each, this process prints ``IN TURN <script>``, so that a test can tell whose lines follow.
"""

import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def scripts(argv):
    """[[SCRIPT, ARG, ...], ...]: ``argv`` split at each ``--then``."""
    runs = [[]]
    for arg in argv:
        if arg == "--then":
            runs.append([])
        else:
            runs[-1].append(arg)
    return runs


for script, *args in scripts(sys.argv[1:]):
    path = os.path.join(HERE, script)
    print(f"IN TURN {script}", flush=True)
    sys.argv = [path, *args]
    runpy.run_path(path, run_name="__main__")
