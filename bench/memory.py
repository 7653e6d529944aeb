"""Memory benchmark: activation checkpointing (``remat="blocks"``) against none, peak bytes
measured by TensorFlow's allocator.

    python bench/memory.py [--quick]

Each configuration runs in a process of its own (`_memory_worker.py`, TF_CPU_ALLOCATOR_USE_BFC=true,
one CPU device under `tfpar.DataParallel`), in turns (a b b a), on KerasHub's LlamaCausalLM with
random weights: 12 blocks, width 128, MLP 512, 4 query and 2 key/value heads, vocabulary 1,000,
3.2 M parameters, batch 8 of 128 tokens, Adam.

Last line:
    RESULT memory remat_activation_ratio=<a> remat_peak_ratio=<p> remat_step_ratio=<s>
           blocks=<n> parameters=<n> activations_none=<bytes> activations_remat=<bytes>
           cpu=<extensions> onednn=<on|off>

- remat_activation_ratio: what one training step adds to the device's bytes (its peak less what it
  holds between steps) with remat="blocks" ÷ without (goal <= 0.4);
- remat_peak_ratio: the model's bytes and a step's, with ÷ without;
- remat_step_ratio: a step with ÷ without, each the fastest of its epochs in its turns (goal <= 1.4:
  one more forward of each block).
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

from common import machine_keys, quick_options, run_job  # noqa: E402


def main():
    opts = quick_options(__doc__)
    sizes = ["--layers", "2", "--sequence", "32", "--epochs", "1"] if opts.quick else []
    env = {**os.environ, "TF_CPU_ALLOCATOR_USE_BFC": "true"}
    runs = {"none": [], "blocks": []}
    for remat in ("none", "blocks", "blocks", "none")[: 2 if opts.quick else 4]:
        cmd = [sys.executable, os.path.join(HERE, "_memory_worker.py"), "--remat", remat, *sizes]
        runs[remat].append(run_job(cmd, cwd=HERE, env=env, timeout=900))
        print(f"{remat:>6}: {runs[remat][-1]['activations']:,} B a step", flush=True)
    none = runs["none"][0]
    remat = runs["blocks"][0]
    step = {name: min(run["step"] for run in done) for name, done in runs.items()}
    print(remat["described"], flush=True)
    print(
        f"RESULT memory remat_activation_ratio={remat['activations'] / none['activations']:.3f} "
        f"remat_peak_ratio={_peak(remat) / _peak(none):.3f} "
        f"remat_step_ratio={step['blocks'] / step['none']:.3f} "
        f"blocks={remat['blocks']} "
        f"parameters={none['parameters']} activations_none={none['activations']} "
        f"activations_remat={remat['activations']} {machine_keys()}",
        flush=True,
    )


def _peak(run):
    """The model's bytes and what a step adds: its peak over an empty device."""
    return run["persistent"] + run["activations"]


if __name__ == "__main__":
    main()
