"""Horovod benchmark: tfpar's HorovodStrategy against the plain Horovod recipe, side by side.

    python bench/horovod_strategy.py [--quick]

Last line:
    RESULT horovod overhead=<x> busbw_ratio=<y> keras=<strategy's>/<recipe's> cpu=<extensions>
    onednn=<on|off> [onednn_isa=<ONEDNN_MAX_CPU_ISA, where set>]

TF_ENABLE_ONEDNN_OPTS=0 runs it on TensorFlow's Eigen kernels, what TensorFlow runs by default on a
CPU without AVX-512 VNNI or BF16 or AMX (an AVX2-only one).

- overhead: median step time of HorovodStrategy in model.fit ÷ the plain Horovod
  recipe (a tf.function loop with hvd.DistributedGradientTape), same 66k-parameter
  CNN, 2 ranks under horovodrun --gloo, same per-rank batch; jobs alternate A B B A A B.
- the breakdown: one more job per side with --profile (see _horovod_worker.py), where rank 0's
  step goes: forward+backward, exchange+apply (Horovod's all-reduce and the update) and the host's
  rest (input, fit's loop and callbacks, or the recipe's Python loop), so that a difference in
  overhead can be read from one run on the machine that shows it.
- busbw_ratio: Horovod all-reduce bus bandwidth of a 64 MiB float32 tensor over 2
  ranks (size·2(n-1)/n ÷ time) ÷ the throughput one loopback TCP socket pair reaches
  in the same run.
"""

import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

from common import loopback_tcp_throughput, machine_keys, quick_options, run_job  # noqa: E402


def run_horovod_job(ranks, args):
    return run_job(
        [
            "horovodrun",
            "-np",
            str(ranks),
            "-H",
            f"localhost:{ranks}",
            "--gloo",
            sys.executable,
            os.path.join(HERE, "_horovod_worker.py"),
            *args,
        ],
        cwd=HERE,
    )


def main():
    opts = quick_options(__doc__)
    steps, epochs, mib = (5, 2, 8) if opts.quick else (40, 6, 64)
    common = ["--steps", str(steps), "--epochs", str(epochs)]
    order = (
        ["strategy", "recipe"]
        if opts.quick
        else ["strategy", "recipe", "recipe", "strategy", "strategy", "recipe"]
    )
    times = {"strategy": [], "recipe": []}
    kerases = {}
    for mode in order:
        job = run_horovod_job(2, [mode, *common])
        times[mode].append(job["step_seconds"])
        kerases[mode] = job["keras"]
        print(f"2 ranks, {mode}: {job['step_seconds'] * 1e3:.1f} ms/step", flush=True)
    overhead = statistics.median(times["strategy"]) / statistics.median(times["recipe"])
    print("where rank 0's step goes (ms, medians of a profiled job per side):", flush=True)
    for mode in ("strategy", "recipe"):
        job = run_horovod_job(2, [mode, *common, "--profile"])
        phases = "  ".join(f"{name} {seconds * 1e3:.1f}" for name, seconds in job["phases"].items())
        print(f"  {mode:<8} {phases}  (step {job['step_seconds'] * 1e3:.1f})", flush=True)

    tcp = loopback_tcp_throughput()
    reduce = run_horovod_job(2, ["allreduce", "--mib", str(mib)])
    busbw_ratio = reduce["busbw"] / tcp
    print(
        f"hvd.allreduce {mib} MiB over 2 ranks: {reduce['seconds'] * 1e3:.0f} ms, busbw "
        f"{reduce['busbw'] / 1e9:.2f} GB/s; loopback TCP {tcp / 1e9:.2f} GB/s",
        flush=True,
    )
    keras = f"keras={kerases['strategy']}/{kerases['recipe']}"
    print(
        f"RESULT horovod overhead={overhead:.3f} busbw_ratio={busbw_ratio:.3f} "
        f"{keras} {machine_keys()}"
    )


if __name__ == "__main__":
    main()
