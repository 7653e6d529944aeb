"""Precision benchmark: training step time of each tf_keras policy ÷ float32 on this machine.

    python bench/precision.py [--quick]

The 2.6M-parameter MLP (global batch 256, one device, last activation in float32),
each policy in its own process, in the order A B C C B A; medians compared.
No target: TensorFlow emulates float16 matmuls on a CPU (on this machine one step takes
~20 s against ~50 ms in float32, so mixed_float16 runs once, for 2 timed steps), while a
CPU with AVX512_BF16/AMX runs bfloat16 natively.

Last line:
    RESULT precision mixed_float16=<x> mixed_bfloat16=<y>
"""

import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

from common import quick_options, run_job  # noqa: E402

POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")


def main():
    opts = quick_options(__doc__)
    steps, epochs = ("3", "1") if opts.quick else ("20", "3")
    order = (
        POLICIES
        if opts.quick
        else ("float32", "mixed_bfloat16", "mixed_float16", "mixed_bfloat16", "float32")
    )
    times = {policy: [] for policy in POLICIES}
    for policy in order:
        # emulated: ~20 s a step
        size = ("2", "1") if policy == "mixed_float16" else (steps, epochs)
        job = run_job(
            [sys.executable, os.path.join(HERE, "_precision_worker.py"), policy, *size],
            cwd=HERE,
            timeout=900,
        )
        times[policy].append(job["step_seconds"])
        print(f"{policy:>15}: {job['step_seconds'] * 1e3:.1f} ms/step", flush=True)
    step = {policy: statistics.median(t) for policy, t in times.items()}
    print(
        f"RESULT precision mixed_float16={step['mixed_float16'] / step['float32']:.3f} "
        f"mixed_bfloat16={step['mixed_bfloat16'] / step['float32']:.3f}"
    )


if __name__ == "__main__":
    main()
