"""What the benchmarks share: their --quick option, models, synthetic data, timing and the
bus-bandwidth formula. (A driver's own folder is on sys.path, so ``from common import ...``.)"""

import argparse
import json
import socket
import subprocess
import threading
import time

import numpy as np

import tfpar

keras = tfpar.keras


def quick_options(doc, plot=False):
    """Parses a driver's command line: ``--quick`` for tiny settings (a smoke run, not a
    measurement), and with ``plot``, ``--plot DIR`` (where the driver draws its figures)."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny settings (a smoke run, not a measurement)"
    )
    if plot:
        parser.add_argument(
            "--plot", metavar="DIR", default=None, help="draw this benchmark's figures in DIR"
        )
    return parser.parse_args()


def median_seconds_in_turns(names, rounds, run_one, statistic=None):
    """Times ``run_one(name)`` for two names in turns (a, b, b, a), ``rounds`` times, so that a slow
    patch of the machine falls on both; returns ``{name: (median seconds, runs timed)}`` (or
    ``statistic`` of them: ``min``, as timeit advises where other processes only ever add time)."""
    import statistics

    first, second = names
    times = {first: [], second: []}
    for _ in range(rounds):
        for name in (first, second, second, first):
            start = time.perf_counter()
            run_one(name)
            times[name].append(time.perf_counter() - start)
    return {name: ((statistic or statistics.median)(t), len(t)) for name, t in times.items()}


def print_step_times(timed, steps_per_epoch):
    """Prints `median_seconds_in_turns`' epochs per step; returns ``{name: seconds per step}``."""
    step = {name: seconds / steps_per_epoch for name, (seconds, _) in timed.items()}
    for name, seconds in step.items():
        print(
            f"{name:>8}: {seconds * 1e3:.2f} ms/step, "
            f"{timed[name][1]} epochs of {steps_per_epoch} steps timed",
            flush=True,
        )
    return step


def machine_keys():
    """``cpu=`` the CPU's vector extensions tfpar's speed depends on, ``onednn=`` whether
    TensorFlow runs its oneDNN kernels (on by default only where the CPU has its neural-network
    instructions; else Eigen's) and ``onednn_isa=`` where ONEDNN_MAX_CPU_ISA caps them, for a
    RESULT line: a ratio is read with the CPU and the kernels it was measured on."""
    import os

    from tfpar import _compat
    from tfpar.doctor import vector_extensions

    keys = f"cpu={'+'.join(vector_extensions()) or 'none'}"
    keys += f" onednn={'on' if _compat.onednn_enabled() else 'off'}"
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA")
    return f"{keys} onednn_isa={cap}" if cap else keys


def bus_bandwidth(nbytes, workers, seconds):
    """An all-reduce's bus bandwidth (bytes/s): each byte crosses 2 (n-1)/n links (NCCL's
    definition)."""
    return nbytes * 2 * (workers - 1) / workers / seconds


def make_model(kind):
    """ "cnn": a 66k-parameter conv net on 16x16 images; "mlp": a 2.6M-parameter MLP;
    "linear": a 7.9k-parameter softmax regression on the MLP's input (almost no compute)."""
    if kind == "cnn":
        return keras.Sequential(
            [
                keras.layers.Input((16, 16, 1)),
                keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
                keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
                keras.layers.MaxPooling2D(),
                keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
                keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
                keras.layers.GlobalAveragePooling2D(),
                keras.layers.Dense(10, activation="softmax"),
            ]
        )
    if kind == "linear":
        return keras.Sequential(
            [keras.layers.Input((784,)), keras.layers.Dense(10, activation="softmax")]
        )
    return keras.Sequential(
        [
            keras.layers.Input((784,)),
            keras.layers.Dense(1152, activation="relu"),
            keras.layers.Dense(1024, activation="relu"),
            keras.layers.Dense(512, activation="relu"),
            keras.layers.Dense(10),
            # float32 output under any precision policy
            keras.layers.Activation("softmax", dtype="float32"),
        ]
    )


def mlp_model():
    """The MLP, for ``tfpar tune --model common:mlp_model`` (bench/ on PYTHONPATH)."""
    return make_model("mlp")


def mlp_dataset(n=8192):
    """Examples for the MLP, for ``tfpar tune --data common:mlp_dataset``."""
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices(make_data("mlp", n))


def make_data(kind, n, seed=0):
    rng = np.random.default_rng(seed)
    shape = (n, 16, 16, 1) if kind == "cnn" else (n, 784)
    return rng.normal(size=shape).astype("float32"), rng.integers(0, 10, size=n)


def loopback_tcp_throughput(total=512 * 2**20, chunk=4 * 2**20, repeats=5):
    """Bytes/s one TCP connection over 127.0.0.1 carries: the best of ``repeats``, as
    befits a floor (the median swings by 2-4x with whatever else the machine runs)."""
    payload = b"\0" * chunk
    rates = []
    for _ in range(repeats):
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        done = threading.Event()

        def receive():
            conn, _ = server.accept()
            left = total
            while left > 0:
                left -= len(conn.recv(min(left, chunk)))
            conn.close()
            done.set()

        thread = threading.Thread(target=receive)
        thread.start()
        client = socket.create_connection(server.getsockname())
        start = time.perf_counter()
        for _ in range(total // chunk):
            client.sendall(payload)
        done.wait()
        rates.append(total / (time.perf_counter() - start))
        thread.join()
        client.close()
        server.close()
    return max(rates)


def parse_bench_line(output):
    """Returns the JSON of the first ``BENCH {...}`` line of a job's output."""
    return parse_bench_lines(output)[0]


def parse_bench_lines(output):
    """Returns the JSON of every ``BENCH {...}`` line of a job's output (each worker's)."""
    found = [
        json.loads(line.split("BENCH ", 1)[1]) for line in output.splitlines() if "BENCH " in line
    ]
    if not found:
        raise RuntimeError("no BENCH line in the job's output:\n" + output[-3000:])
    return found


def run_job(cmd, cwd, env=None, timeout=600):
    """Runs one benchmark job (a command line) and returns its ``BENCH`` numbers."""
    return run_job_lines(cmd, cwd, env, timeout)[0]


def run_job_lines(cmd, cwd, env=None, timeout=600):
    """Runs one benchmark job (a command line) and returns every ``BENCH`` line's numbers (each
    worker's)."""
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        raise RuntimeError(f"{cmd} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return parse_bench_lines(done.stdout)
