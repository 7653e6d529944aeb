"""`tfpar tune --workers 2` on the communication-bound MLP (2.6M parameters),
2 workers on this host.

    python bench/tune_workers.py [--quick]

Runs `tfpar.tune.workers_space()` (DataParallel and HorovodStrategy, bf16 compression or none,
bytes_per_pack 0 or 4 MiB, Horovod's autotune off or on, per-replica batch 32 or 64,
steps_per_execution 1 or 4; --quick: strategies and compression only), each trial its own 2-worker
job, plus tfpar's defaults.

Last line:
    RESULT tune speedup=<x> same_batch_speedup=<y>

- speedup: examples/s of the fastest trial ÷ tfpar's defaults (DataParallel, no compression,
  32 per replica, steps_per_execution 1).
- same_batch_speedup: the same for the fastest trial at the defaults' batch of 32 per replica, which
  trains exactly as the defaults do (a larger batch changes the training itself).
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

from common import quick_options  # noqa: E402


def main():
    opts = quick_options(__doc__)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")]))
    sys.path.insert(0, HERE)
    from tfpar.tune import DEFAULTS, tune, workers_space

    space = (
        {"strategy": ["data_parallel", "horovod"], "compression": ["none", "bf16"]}
        if opts.quick
        else workers_space()
    )
    result = tune(
        "common:mlp_model",
        "common:mlp_dataset",
        space,
        steps=10 if opts.quick else 30,
        workers=2,
        print_fn=lambda line: print(line, flush=True),
    )
    print(result.describe(), flush=True)
    default = result.default["examples_per_second"]
    same_batch = max(
        t["examples_per_second"]
        for t in result.trials
        if t["status"] == "ok" and t["config"]["per_replica_batch"] == DEFAULTS["per_replica_batch"]
    )
    print(f"RESULT tune speedup={result.speedup:.3f} same_batch_speedup={same_batch / default:.3f}")


if __name__ == "__main__":
    main()
