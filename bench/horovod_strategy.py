"""Horovod benchmark: tfpar's HorovodStrategy against the plain Horovod recipe, side by side.

    python bench/horovod_strategy.py [--quick]

Last line:
    RESULT horovod overhead=<x> busbw_ratio=<y>

- overhead: median step time of HorovodStrategy in model.fit ÷ the plain Horovod
  recipe (a tf.function loop with hvd.DistributedGradientTape), same 66k-parameter
  CNN, 2 ranks under horovodrun --gloo, same per-rank batch; jobs alternate A B B A A B.
- busbw_ratio: Horovod all-reduce bus bandwidth of a 64 MiB float32 tensor over 2
  ranks (size·2(n-1)/n ÷ time) ÷ the throughput one loopback TCP socket pair reaches
  in the same run.
"""

import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

from common import loopback_tcp_throughput, quick_options, run_job  # noqa: E402


def run_horovod_job(ranks, args):
    return run_job(["horovodrun", "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo", sys.executable,
                    os.path.join(HERE, "_horovod_worker.py"), *args], cwd=HERE)


def main():
    opts = quick_options(__doc__)
    steps, epochs, mib = (5, 2, 8) if opts.quick else (40, 6, 64)
    common = ["--steps", str(steps), "--epochs", str(epochs)]
    order = ["strategy", "recipe"] if opts.quick else ["strategy", "recipe", "recipe", "strategy",
                                                        "strategy", "recipe"]
    times = {"strategy": [], "recipe": []}
    for mode in order:
        job = run_horovod_job(2, [mode, *common])
        times[mode].append(job["step_seconds"])
        print(f"2 ranks, {mode}: {job['step_seconds'] * 1e3:.1f} ms/step", flush=True)
    overhead = statistics.median(times["strategy"]) / statistics.median(times["recipe"])

    tcp = loopback_tcp_throughput()
    reduce = run_horovod_job(2, ["allreduce", "--mib", str(mib)])
    busbw_ratio = reduce["busbw"] / tcp
    print(f"hvd.allreduce {mib} MiB over 2 ranks: {reduce['seconds'] * 1e3:.0f} ms, busbw "
          f"{reduce['busbw'] / 1e9:.2f} GB/s; loopback TCP {tcp / 1e9:.2f} GB/s", flush=True)
    print(f"RESULT horovod overhead={overhead:.3f} busbw_ratio={busbw_ratio:.3f}")


if __name__ == "__main__":
    main()
