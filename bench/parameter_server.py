"""Parameter-server benchmark: a local PS cluster against DataParallel, and against its floor.

    python bench/parameter_server.py [--quick]

Last line:
    RESULT parameter_server steps_ratio=<x> model_ratio=<y> model_ratio_spe8=<z> model_ratio_2ps=<w>
           model_ratio_cpu=<v>

- steps_ratio: steps/second of ParameterServer.local(2 workers, 1 ps) ÷ DataParallel on
  2 virtual CPU devices, same 66k-parameter CNN and global batch (each in its own process,
  alternating A B B A).
- model_ratio: the PS step time of a communication-bound model (the 2.6M-parameter MLP,
  10.5 MB of variables, global batch 8: under 2 ms of compute) ÷ its floor: every step
  pulls the variables from the ps and pushes their gradients back (2 × variable bytes ÷ the
  loopback TCP throughput measured in this run) plus one RPC round trip (a loopback TCP
  ping-pong measured here). A compute-bound model (the CNN) would only measure its compute.

- model_ratio_cpu: the same step time ÷ the larger of that floor and the CPU floor: the CPU
  seconds every process of the cluster (coordinator, workers, ps) spends per step, measured in
  this run, over the cores this process may use. On a box with fewer cores than processes the
  cluster is CPU-bound before it is bandwidth-bound; this says how close it runs to that.

Also printed: the step time of a 7.9k-parameter linear model on the same cluster, i.e. what
TensorFlow's coordinator costs per step whatever the model (scheduling a closure, a remote
function call, reading back its result), which the floor leaves out; and the breakdown of the
MLP's step against the levers:
- model_ratio_spe8: with steps_per_execution=8 (one closure, one remote call, runs 8 steps: the
  coordinator's cost is paid once per 8 steps; the variables still travel every step);
- model_ratio_2ps: with 2 ps tasks (the MLP's large variables partitioned over both: two
  connections move them in parallel), against the same one-connection floor;
and a profile of 3 MLP epochs on every task (TensorFlow's profiler, through the profiler service
of each server): per task, the CPU it spends per step and its ops' time per step (the optimizer's
update ops, sends and receives, matrix products, the rest); per worker, its step function's wall
time per call.
"""

import os
import socket
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))

from common import loopback_tcp_throughput, quick_options, run_job  # noqa: E402


def loopback_round_trip(repeats=2000):
    """Median seconds for a 1-byte request and reply over one loopback TCP connection."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def echo():
        conn, _ = server.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while data := conn.recv(1):
            conn.sendall(data)
        conn.close()

    thread = threading.Thread(target=echo, daemon=True)
    thread.start()
    client = socket.create_connection(server.getsockname())
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        client.sendall(b"x")
        client.recv(1)
        times.append(time.perf_counter() - start)
    client.close()
    server.close()
    return statistics.median(times)


def run(mode, args):
    return run_job([sys.executable, os.path.join(HERE, "_ps_worker.py"), mode, *args], cwd=HERE)


def median_step(jobs):
    return statistics.median(j["step_seconds"] for j in jobs)


def main():
    opts = quick_options(__doc__)
    common = ["--steps", "5", "--epochs", "2"] if opts.quick else ["--steps", "40", "--epochs", "5"]
    order = ["ps", "dp"] if opts.quick else ["ps", "dp", "dp", "ps"]
    jobs = {"ps": [], "dp": []}
    for mode in order:
        job = run(mode, common)
        jobs[mode].append(job)
        print(f"{mode}: {job['step_seconds'] * 1e3:.1f} ms/step", flush=True)
    comm = [
        run("ps", common + ["--model", "mlp", "--global-batch", "8"] + ["--trace"] * (i == 0))
        for i, _ in enumerate(order[:2])
    ]
    overhead = run("ps", common + ["--model", "linear", "--global-batch", "8"])
    ps_step, dp_step, comm_step = (
        median_step(jobs["ps"]),
        median_step(jobs["dp"]),
        median_step(comm),
    )
    tcp = loopback_tcp_throughput()
    rtt = loopback_round_trip()
    variable_bytes = comm[0]["variable_bytes"]
    floor = 2 * variable_bytes / tcp + rtt
    print(
        f"CNN: PS {ps_step * 1e3:.1f} ms/step, DataParallel {dp_step * 1e3:.1f} ms/step", flush=True
    )
    print(
        f"MLP floor: 2 x {variable_bytes:,} bytes / {tcp / 1e9:.2f} GB/s + RTT {rtt * 1e6:.0f} us "
        f"= {floor * 1e3:.2f} ms; measured {comm_step * 1e3:.1f} ms/step",
        flush=True,
    )
    print(
        f"coordinator cost per step (7.9k-parameter linear model): "
        f"{overhead['step_seconds'] * 1e3:.1f} ms",
        flush=True,
    )
    mlp = common + ["--model", "mlp", "--global-batch", "8"]
    spe8 = run("ps", mlp + ["--steps-per-execution", "8"])["step_seconds"]
    two_ps = run("ps", mlp + ["--num-ps", "2"])["step_seconds"]
    linear_spe8 = run(
        "ps", common + ["--model", "linear", "--global-batch", "8", "--steps-per-execution", "8"]
    )
    print(
        "coordinator cost per step with steps_per_execution=8: "
        f"{linear_spe8['step_seconds'] * 1e3:.1f} ms",
        flush=True,
    )
    print(
        f"MLP breakdown, ms/step: measured {comm_step * 1e3:.1f} = "
        f"coordinator {overhead['step_seconds'] * 1e3:.1f} "
        f"+ the rest {(comm_step - overhead['step_seconds']) * 1e3:.1f} (floor {floor * 1e3:.2f}); "
        f"steps_per_execution=8: {spe8 * 1e3:.1f}; 2 ps: {two_ps * 1e3:.1f}",
        flush=True,
    )
    cpu = statistics.median(sum(job["cpu_per_step"].values()) for job in comm)
    cores = len(os.sched_getaffinity(0))
    print_trace(comm[0])
    print(
        f"MLP CPU per step, all processes: {cpu * 1e3:.1f} ms on {cores} cores: a CPU floor of "
        f"{cpu / cores * 1e3:.1f} ms/step, against the bandwidth floor of {floor * 1e3:.2f} ms",
        flush=True,
    )
    print(
        f"RESULT parameter_server steps_ratio={dp_step / ps_step:.3f} "
        f"model_ratio={comm_step / floor:.3f} "
        f"model_ratio_spe8={spe8 / floor:.3f} model_ratio_2ps={two_ps / floor:.3f} "
        f"model_ratio_cpu={comm_step / max(floor, cpu / cores):.3f}"
    )


def print_trace(job):
    """The profile of the MLP per task (ms per step) and each process' CPU per step."""
    print("MLP profile, thread-ms per step (ops on different threads add up):", flush=True)
    for task, parts in sorted(job["trace_ms_per_step"].items()):
        call = (
            (
                f"; its step function: {parts.pop('step function ms per call'):.1f} ms "
                "wall per call, "
                f"{parts.pop('steps run')} steps"
            )
            if "steps run" in parts
            else ""
        )
        ops = ", ".join(
            f"{what} {ms:.1f}" for what, ms in sorted(parts.items(), key=lambda kv: -kv[1])
        )
        print(
            f"  {task}: CPU {job['cpu_per_step'][task] * 1e3:.1f} ms/step; "
            f"ops: {ops or 'none'}{call}",
            flush=True,
        )


if __name__ == "__main__":
    main()
