"""Memory benchmark: activation checkpointing (``remat="blocks"``) against none on one device, then
ZeRO stages 2 and 3, alone and with remat, against stage 0 on 2 workers (and stages 0 and 2
accumulating 2 steps),
peak bytes measured by TensorFlow's allocator; and the largest Llama-shaped model a 16 GiB and an
80 GiB device can train under each, derived from the bytes measured.

    python bench/memory.py [--quick]

Each configuration runs in processes of its own (`_memory_worker.py`, TF_CPU_ALLOCATOR_USE_BFC=true,
one CPU device each under `tfpar.DataParallel`), on KerasHub's LlamaCausalLM with random weights and
Adam:
- one device, in turns (a b b a): 12 blocks, width 128, MLP 512, 4 query and 2 key/value heads,
  vocabulary 1,000, 3.2 M parameters, batch 8 of 128 tokens;
- 2 workers of `tfpar launch` (a job each): 12 blocks, width 512, MLP 1,376, 8 query and 4
  key/value heads, vocabulary 32,000, 67 M parameters, batch 4 of 128 tokens per worker.

Last line:
    RESULT memory remat_activation_ratio=<a> remat_peak_ratio=<p> remat_step_ratio=<s>
           zero2_persistent_ratio=<r> zero2_peak_ratio=<r> zero2_step_ratio=<s>
           zero2_remat_peak_ratio=<r> zero2_remat_step_ratio=<s>
           zero2_accumulate_persistent_ratio=<r> zero2_accumulate_peak_ratio=<r>
           zero3_persistent_ratio=<r> zero3_peak_ratio=<r> zero3_step_ratio=<s>
           zero3_wire_ratio=<r> zero3_remat_peak_ratio=<r> zero3_remat_step_ratio=<s> blocks=<n>
           parameters=<n> parameters_workers=<n> activations_none=<bytes> activations_remat=<bytes>
           cpu=<extensions> onednn=<on|off>

- remat_activation_ratio: what one training step adds to the device's bytes (its peak less what it
  holds between steps) with remat="blocks" ÷ without (goal <= 0.4);
- remat_peak_ratio: the model's bytes and a step's, with ÷ without;
- remat_step_ratio: a step with ÷ without, each the fastest of its epochs in its turns (goal <= 1.4:
  one more forward of each block);
- zero2_*: on 2 workers, the worker that holds the most: what it keeps between steps (persistent),
  that and a step's (peak), and a step's seconds, stage 2 ÷ stage 0; zero2_remat_*: stage 2 with
  remat="blocks" ÷ stage 2; zero2_accumulate_*: both with gradient_accumulation_steps=2 (stage 0's
  accumulator holds a whole model, stage 2's a replica's pieces), stage 2 ÷ stage 0;
- zero3_*: stage 3 (and stage 3 with remat="blocks") ÷ stage 0, its step ÷ stage 2's (goals:
  persistent <= 0.52, peak <= 0.65, step <= 1.3), and the bytes a replica sent in a step ÷ a ring
  all-reduce's of the same gradients (goal <= 1.5).
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

from common import machine_keys, quick_options, run_job, run_job_lines  # noqa: E402

WORKERS_MODEL = [
    *("--layers", "12", "--hidden", "512", "--intermediate", "1376", "--heads", "8"),
    *("--vocabulary", "32000", "--sequence", "128", "--batch", "4", "--steps", "2"),
    *("--epochs", "2"),
]
QUICK_WORKERS_MODEL = ["--layers", "2", "--sequence", "32", "--steps", "2", "--epochs", "1"]
# name: (zero stage, remat, gradient_accumulation_steps), on 2 workers
WORKER_CONFIGS = {
    "stage 0": ("0", "none", "1"),
    "stage 2": ("2", "none", "1"),
    "stage 2 + remat": ("2", "blocks", "1"),
    "stage 3": ("3", "none", "1"),
    "stage 3 + remat": ("3", "blocks", "1"),
    "stage 0, accumulating 2": ("0", "none", "2"),
    "stage 2, accumulating 2": ("2", "none", "2"),
}
ENV = {**os.environ, "TF_CPU_ALLOCATOR_USE_BFC": "true"}
DEVICES = {"16 GiB": 16 * 2**30, "80 GiB": 80 * 2**30}


def one_device(quick):
    """``(none, remat, step)``: the one-device runs, remat none and blocks in turns, and each one's
    fastest step."""
    sizes = ["--layers", "2", "--sequence", "32", "--epochs", "1"] if quick else []
    runs = {"none": [], "blocks": []}
    for remat in ("none", "blocks", "blocks", "none")[: 2 if quick else 4]:
        cmd = [sys.executable, os.path.join(HERE, "_memory_worker.py"), "--remat", remat, *sizes]
        runs[remat].append(run_job(cmd, cwd=HERE, env=ENV, timeout=900))
        print(f"{remat:>6}: {runs[remat][-1]['activations']:,} B a step", flush=True)
    step = {name: min(run["step"] for run in done) for name, done in runs.items()}
    return runs["none"][0], runs["blocks"][0], step


def two_workers(quick):
    """``{config: the run of its worker that holds the most, with the slower worker's step}`` on 2
    workers of `tfpar launch`."""
    results = {}
    for name, (stage, remat, accumulate) in WORKER_CONFIGS.items():
        worker = [sys.executable, "_memory_worker.py", "--zero-stage", stage, "--remat", remat]
        worker += ["--accumulate", accumulate]
        sizes = QUICK_WORKERS_MODEL if quick else WORKERS_MODEL
        cmd = [sys.executable, "-m", "tfpar.cli", "launch", "-n", "2", "--", *worker, *sizes]
        runs = run_job_lines(cmd, cwd=HERE, env=ENV, timeout=1800)
        step = max(run["step"] for run in runs)
        results[name] = {**max(runs, key=_peak), "step": step}
        print(
            f"2 workers, {name:>23}: keeps {results[name]['persistent']:,} B, peaks at "
            f"{_peak(results[name]):,} B over an empty device, {step:.3f} s a step",
            flush=True,
        )
    return results


def main():
    opts = quick_options(__doc__)
    none, remat, step = one_device(opts.quick)
    print(remat["described"], flush=True)
    workers = two_workers(opts.quick)
    # the table's configurations update at every step
    print(largest_models_table({k: v for k, v in workers.items() if "accum" not in k}), flush=True)
    zero0 = workers["stage 0"]
    zero2 = workers["stage 2"]
    zero2_remat = workers["stage 2 + remat"]
    accumulated0 = workers["stage 0, accumulating 2"]
    accumulated2 = workers["stage 2, accumulating 2"]
    zero3 = workers["stage 3"]
    zero3_remat = workers["stage 3 + remat"]
    # a ring all-reduce sends 2 (N-1)/N of the float32 gradients from each replica
    all_reduce = 2 * 4 * zero0["parameters"] * (zero0["replicas"] - 1) / zero0["replicas"]
    print(
        f"RESULT memory remat_activation_ratio={remat['activations'] / none['activations']:.3f} "
        f"remat_peak_ratio={_peak(remat) / _peak(none):.3f} "
        f"remat_step_ratio={step['blocks'] / step['none']:.3f} "
        f"zero2_persistent_ratio={zero2['persistent'] / zero0['persistent']:.3f} "
        f"zero2_peak_ratio={_peak(zero2) / _peak(zero0):.3f} "
        f"zero2_step_ratio={zero2['step'] / zero0['step']:.3f} "
        f"zero2_remat_peak_ratio={_peak(zero2_remat) / _peak(zero2):.3f} "
        f"zero2_remat_step_ratio={zero2_remat['step'] / zero2['step']:.3f} "
        f"zero2_accumulate_persistent_ratio="
        f"{accumulated2['persistent'] / accumulated0['persistent']:.3f} "
        f"zero2_accumulate_peak_ratio={_peak(accumulated2) / _peak(accumulated0):.3f} "
        f"zero3_persistent_ratio={zero3['persistent'] / zero0['persistent']:.3f} "
        f"zero3_peak_ratio={_peak(zero3) / _peak(zero0):.3f} "
        f"zero3_step_ratio={zero3['step'] / zero2['step']:.3f} "
        f"zero3_wire_ratio={zero3['sent'] / all_reduce:.3f} "
        f"zero3_remat_peak_ratio={_peak(zero3_remat) / _peak(zero0):.3f} "
        f"zero3_remat_step_ratio={zero3_remat['step'] / zero2['step']:.3f} "
        f"blocks={remat['blocks']} parameters={none['parameters']} "
        f"parameters_workers={zero0['parameters']} activations_none={none['activations']} "
        f"activations_remat={remat['activations']} {machine_keys()}",
        flush=True,
    )


def llama_shape(hidden):
    """``(parameters, blocks)`` of a Llama-2-shaped model ``hidden`` wide (7 B: 4,096 wide, 32
    blocks): hidden/128 blocks, an MLP 8/3 as wide, a vocabulary of 32,000, an untied output."""
    blocks = hidden / 128
    per_block = 4 * hidden**2 + 3 * hidden * (8 * hidden / 3) + 2 * hidden
    return blocks * per_block + 2 * 32000 * hidden + hidden, blocks


def largest_parameters(run, capacity):
    """The parameters of the largest `llama_shape` model one replica of ``run``'s configuration
    can train in ``capacity`` bytes: its model state at the bytes per parameter ``run`` kept
    between steps, a step's gradients at 4 bytes per parameter (float32, whole before they are
    reduced; stage 3: a replica's pieces, 4/N), its activations at the bytes per block, token and
    width the rest of ``run``'s step took, on as many tokens per replica."""
    per_parameter = run["persistent"] / run["parameters"]
    gradient = 4 / run["replicas"] if run["zero_stage"] == 3 else 4
    rest = max(0, run["activations"] - gradient * run["parameters"])
    per_unit = rest / (run["layers"] * run["tokens"] * run["hidden"])

    def needed(hidden):
        parameters, blocks = llama_shape(hidden)
        return parameters * (per_parameter + gradient) + per_unit * blocks * run["tokens"] * hidden

    low = 64.0
    high = 2.0**17
    for _ in range(60):
        middle = (low + high) / 2
        if needed(middle) <= capacity:
            low = middle
        else:
            high = middle
    return llama_shape(low)[0]


def largest_models_table(runs):
    """The text of the table: the largest model each configuration of ``runs`` trains on each of
    `DEVICES`."""
    tokens = next(iter(runs.values()))["tokens"]
    lines = [
        f"the largest Llama-shaped model one replica trains (N = 2, {tokens} tokens a step per "
        "replica, Adam; derived from the bytes above):",
        f"{'':>17}" + "".join(f"{name:>12}" for name in DEVICES),
    ]
    for name, run in runs.items():
        sizes = [largest_parameters(run, capacity) / 1e9 for capacity in DEVICES.values()]
        lines.append(f"{name:>17}" + "".join(f"{size:>10.2f} B" for size in sizes))
    return "\n".join(lines)


def _peak(run):
    """The model's bytes and what a step adds: its peak over an empty device."""
    return run["persistent"] + run["activations"]


if __name__ == "__main__":
    main()
