"""Data-parallel benchmark: tfpar against bare TensorFlow, measured side by side.

    python bench/data_parallel.py [--quick] [--plot DIR]

--plot DIR also times the all-reduce at 1, 4, 16 and 64 MiB and draws DIR/busbw.png: its bus
bandwidth per size against the loopback TCP limit measured in the same run (tfpar.report).

Last line:
    RESULT data_parallel overhead=<x> mw_overhead=<y> busbw_ratio=<z> weak_scaling_cnn=<a>
           weak_scaling_mlp=<b> weak_scaling_mlp_bf16=<c> bf16_gain=<c/b>

- overhead: median step time of tfpar.DataParallel (+ tfpar.data input) ÷ bare
  tf.distribute.MirroredStrategy (+ the plain Keras input recipe), same model,
  2 virtual CPU devices and global batch, alternating rounds in this process.
- mw_overhead: the same for 2 workers: `tfpar launch -n 2` ÷ bare
  MultiWorkerMirroredStrategy started with a hand-written TF_CONFIG and the same
  communication options (RING, same timeout); jobs alternate A B B A A B.
- busbw_ratio: bus bandwidth of tfpar's multi-worker all-reduce of a 64 MiB
  float32 tensor over 2 workers (size·2(n-1)/n ÷ time) ÷ the throughput a plain
  loopback TCP socket pair reaches in this run: the physical limit here.
- weak_scaling_*: examples/s of 2 workers ÷ (2 × 1 worker), per-worker batch
  fixed, for a 66k-parameter CNN and a 2.6M-parameter MLP. Two processes on a
  2-core machine share the cores TensorFlow's thread pools would otherwise
  use alone, so this describes the machine more than tfpar.
- weak_scaling_mlp_bf16: the MLP's 2 workers with DataParallel(compression="bf16"), against the
  same 1-worker figure (one worker sends nothing); bf16_gain: its ratio to weak_scaling_mlp. The
  2-worker MLP jobs alternate none, bf16, bf16, none (medians).
"""

import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "_worker.py")

from common import loopback_tcp_throughput, parse_bench_line, quick_options, run_job  # noqa: E402


def run_tfpar_job(workers, args, env=None, timeout=600):
    """Runs _worker.py under `tfpar launch -n workers`; returns worker 0's numbers."""
    cmd = [
        sys.executable,
        "-m",
        "tfpar.cli",
        "launch",
        "-n",
        str(workers),
        "--",
        sys.executable,
        WORKER,
        *args,
    ]
    return run_job(cmd, cwd=HERE, env={**os.environ, **(env or {})}, timeout=timeout)


def run_hand_job(workers, args, timeout=600):
    """Starts ``workers`` processes with hand-written TF_CONFIGs, as a TF tutorial does."""
    from tfpar.cluster import free_ports

    addresses = [f"127.0.0.1:{p}" for p in free_ports(workers)]
    procs = []
    for index in range(workers):
        tf_config = json.dumps(
            {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, WORKER, *args],
                cwd=HERE,
                env={**os.environ, "TF_CONFIG": tf_config},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=timeout)[0])
    finally:
        for proc in procs:
            proc.kill()
    if any(p.returncode for p in procs):
        raise RuntimeError("hand-launched job failed:\n" + "\n".join(o[-2000:] for o in outputs))
    return parse_bench_line(outputs[0])


def one_host_overhead(rounds, steps):
    """DataParallel vs bare MirroredStrategy in this process, alternating rounds."""
    import tfpar

    tfpar.configure_devices(2)
    import tensorflow as tf
    from common import make_data, make_model

    keras = tfpar.keras
    global_batch = 128
    x, y = make_data("cnn", global_batch * steps)
    source = tf.data.Dataset.from_tensor_slices((x, y))
    runs = {}
    for name, strategy in (
        ("tfpar", tfpar.DataParallel()),
        ("bare", tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])),
    ):
        with strategy.scope():
            keras.utils.set_random_seed(0)
            model = make_model("cnn")
            model.compile(keras.optimizers.SGD(0.01), "sparse_categorical_crossentropy")
        if name == "tfpar":
            train = tfpar.data.distribute(source, strategy, global_batch)
            data = train.dataset
        else:
            data = source.batch(global_batch).repeat()
        runs[name] = (model, data)
    times = {name: [] for name in runs}
    for r in range(rounds + 1):
        order = list(runs) if r % 2 else list(reversed(list(runs)))
        for name in order:
            model, data = runs[name]
            start = time.perf_counter()
            model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0)
            if r:  # round 0 traces
                times[name].append((time.perf_counter() - start) / steps)
    return statistics.median(times["tfpar"]) / statistics.median(times["bare"]), times


def main():
    opts = quick_options(__doc__, plot=True)
    rounds, steps, epochs, mib = (2, 5, 2, 8) if opts.quick else (10, 30, 6, 64)
    common = ["--steps", str(steps), "--epochs", str(epochs)]

    overhead, _ = one_host_overhead(rounds, steps)
    print(f"one host: DataParallel / MirroredStrategy step time = {overhead:.3f}", flush=True)

    mw = {"tfpar": [], "bare": []}
    for mode in (
        ["tfpar", "bare"] if opts.quick else ["tfpar", "bare", "bare", "tfpar", "tfpar", "bare"]
    ):
        job = (
            run_tfpar_job(2, [mode, *common])
            if mode == "tfpar"
            else run_hand_job(2, [mode, *common])
        )
        mw[mode].append(job)
        print(f"2 workers, {mode}: {job['step_seconds'] * 1e3:.1f} ms/step", flush=True)
    step = {m: statistics.median(j["step_seconds"] for j in jobs) for m, jobs in mw.items()}
    mw_overhead = step["tfpar"] / step["bare"]

    tcp = loopback_tcp_throughput()
    reduce = run_tfpar_job(2, ["allreduce", "--mib", str(mib)])
    busbw_ratio = reduce["busbw"] / tcp
    print(
        f"all-reduce {mib} MiB over 2 workers: {reduce['seconds'] * 1e3:.0f} ms, busbw "
        f"{reduce['busbw'] / 1e9:.2f} GB/s; loopback TCP {tcp / 1e9:.2f} GB/s",
        flush=True,
    )
    if opts.plot:
        from tfpar.report import bandwidth_plot

        busbw = {mib * 2**20: reduce["busbw"]}
        for size in (1, 4, 16, 64):
            if size != mib:
                busbw[size * 2**20] = run_tfpar_job(2, ["allreduce", "--mib", str(size)])["busbw"]
        os.makedirs(opts.plot, exist_ok=True)
        print(
            f"plot: {bandwidth_plot(os.path.join(opts.plot, 'busbw.png'), busbw, tcp)}", flush=True
        )

    scaling = {}
    mlp_jobs = {"none": [], "bf16": []}
    for compression in ["none", "bf16"] if opts.quick else ["none", "bf16", "bf16", "none"]:
        job = run_tfpar_job(2, ["tfpar", "--model", "mlp", "--compression", compression, *common])
        mlp_jobs[compression].append(job["examples_per_second"])
        print(
            f"mlp, 2 workers, compression={compression}: {job['examples_per_second']:,.0f} ex/s",
            flush=True,
        )
    for model, key, two in (
        ("cnn", "cnn", statistics.median(j["examples_per_second"] for j in mw["tfpar"])),
        ("mlp", "mlp", statistics.median(mlp_jobs["none"])),
        ("mlp", "mlp_bf16", statistics.median(mlp_jobs["bf16"])),
    ):
        if model not in scaling.get("_one", {}):
            one = run_tfpar_job(
                1, ["tfpar", "--model", model, *common], env={"TFPAR_NUM_CPU_DEVICES": "1"}
            )
            scaling.setdefault("_one", {})[model] = one
        one = scaling["_one"][model]
        scaling[key] = two / (2 * one["examples_per_second"])
        print(
            f"{key} ({one['params']:,} parameters): "
            f"1 worker {one['examples_per_second']:,.0f} ex/s, "
            f"2 workers {two:,.0f} ex/s, weak scaling {scaling[key]:.2f}",
            flush=True,
        )

    print(
        f"RESULT data_parallel overhead={overhead:.3f} mw_overhead={mw_overhead:.3f} "
        f"busbw_ratio={busbw_ratio:.3f} weak_scaling_cnn={scaling['cnn']:.3f} "
        f"weak_scaling_mlp={scaling['mlp']:.3f} weak_scaling_mlp_bf16={scaling['mlp_bf16']:.3f} "
        f"bf16_gain={scaling['mlp_bf16'] / scaling['mlp']:.3f}"
    )


if __name__ == "__main__":
    main()
