"""Pipeline benchmark: 2 stages x 8 microbatches on two compute units against one.

    python bench/pipeline.py [--quick]

Every op runs on one intra-op thread. The baseline process gets one inter-op
thread too (one compute unit); the pipeline process gets two inter-op threads for
its two virtual CPU devices (two compute units). Same model (an MLP of 8 Dense
layers, 2048 wide, and a 10-way output) and global batch (512); the two jobs
alternate A B B A and the medians are compared.

Last line:
    RESULT pipeline efficiency=<x> bubble_ratio=<y> overhead_1stage=<z> microbatch_cost=<w>
           zb_bubble_vs_1f1b=<a> zb_vs_1f1b=<b> interleaved_vs_1f1b=<c> gpipe_vs_1f1b=<d>

- efficiency: step time of a 1-stage pipeline running the 8 microbatches one after
  another with gradient accumulation ÷ the 2-stage pipeline's, ÷ the ideal
  m·p/(m+p-1) = 16/9 (so the figure isolates the schedule);
- bubble_ratio: the bubble `tfpar.callbacks.PipelineBubble` measures on the 2-stage run
  ÷ the theory, (p-1)/(m+p-1) = 1/9;
- overhead_1stage: a 1-stage, 1-microbatch pipeline ÷ the plain Keras model;
- microbatch_cost: the 1-stage pipeline with 8 microbatches ÷ the plain model (one full
  batch): what cutting the batch costs on one device.
- zb_bubble_vs_1f1b: the measured bubble of ZB-H1 ÷ that of 1F1B (the same 2 x 8 pipeline);
- <schedule>_vs_1f1b: 1F1B's step time ÷ the schedule's (above 1: faster than 1F1B); interleaved
  runs 2 chunks per stage (4 chunks of the 9 layers). Each schedule's measured bubble against
  its own theory is printed above the last line, with its efficiency against GPipe.
"""

import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

from common import quick_options, run_job  # noqa: E402


def main():
    opts = quick_options(__doc__)
    size = (
        ["--width", "256", "--depth", "4", "--batch", "64", "--steps", "3", "--epochs", "1"]
        if opts.quick
        else []
    )
    order = (
        ["baseline", "pipeline"] if opts.quick else ["baseline", "pipeline", "pipeline", "baseline"]
    )
    jobs = {"baseline": [], "pipeline": []}
    for mode in order:
        jobs[mode].append(
            run_job(
                [sys.executable, os.path.join(HERE, "_pipeline_worker.py"), mode, *size], cwd=HERE
            )
        )
        print(mode, jobs[mode][-1], flush=True)
    step = {
        name: statistics.median(job[name] for job in jobs[mode])
        for mode in jobs
        for name in jobs[mode][0]
        if not name.startswith("bubble")
    }
    bubble = {
        name: statistics.median(job[f"bubble {name}"] for job in jobs["pipeline"])
        for name in jobs["pipeline"][0]
        if name.startswith("2 stages")
    }
    theory = {name: jobs["pipeline"][0][f"bubble_theory {name}"] for name in bubble}
    for name, seconds in step.items():
        print(f"{name:>13}: {seconds * 1e3:7.1f} ms/step", flush=True)
    stages, microbatches = 2, 8
    ideal = microbatches * stages / (microbatches + stages - 1)
    speedup = step["1 stage x 8"] / step["2 stages x 8"]
    one_f = "2 stages x 8"
    print(
        f"speedup {speedup:.3f} (ideal {ideal:.3f}); bubble measured {bubble[one_f]:.3f}, theory "
        f"{theory[one_f]:.3f}",
        flush=True,
    )
    for name in bubble:
        print(
            f"{name:>26}: bubble {bubble[name]:.3f} (theory {theory[name]:.3f}, ratio "
            f"{bubble[name] / theory[name]:.2f}), step {step[name] * 1e3:.1f} ms, "
            "efficiency vs GPipe "
            f"{step[one_f + ' gpipe'] / step[name]:.3f}, vs 1F1B {step[one_f] / step[name]:.3f}",
            flush=True,
        )
    print(
        f"RESULT pipeline efficiency={speedup / ideal:.3f} "
        f"bubble_ratio={bubble[one_f] / theory[one_f]:.3f} "
        f"overhead_1stage={step['1 stage x 1'] / step['plain']:.3f} "
        f"microbatch_cost={step['1 stage x 8'] / step['plain']:.3f} "
        f"zb_bubble_vs_1f1b={bubble[one_f + ' zb-h1'] / bubble[one_f]:.3f} "
        f"zb_vs_1f1b={step[one_f] / step[one_f + ' zb-h1']:.3f} "
        f"interleaved_vs_1f1b={step[one_f] / step[one_f + ' interleaved']:.3f} "
        f"gpipe_vs_1f1b={step[one_f] / step[one_f + ' gpipe']:.3f}"
    )


if __name__ == "__main__":
    main()
