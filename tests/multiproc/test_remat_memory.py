"""``remat="blocks"`` saves memory, measured by TensorFlow's allocator (issue 50): KerasHub's Llama
(6 blocks, random weights) trained with Adam on one CPU device, with and without, in one process
of bench/memory.py's worker (TF_CPU_ALLOCATOR_USE_BFC=true); the bench's own figures:
docs/benchmarks.md."""

import json
import os
import sys

from tests.conftest import ROOT, run_command

WORKER = os.path.join(ROOT, "bench", "_memory_worker.py")


def test_recomputed_blocks_cut_what_a_step_adds_to_the_device_and_keep_the_model_state():
    sizes = ["--layers", "6", "--sequence", "64", "--batch", "4", "--steps", "2", "--epochs", "1"]
    command = [sys.executable, WORKER, "--remat", "none", "--remat", "blocks", *sizes]
    result = run_command(command, timeout=300, env={"TF_CPU_ALLOCATOR_USE_BFC": "true"})
    assert result.returncode == 0, result.output[-3000:]
    line = next(x for x in result.output.splitlines() if x.startswith("BENCH "))
    none, blocks = json.loads(line.removeprefix("BENCH "))
    assert "6 block(s) recompute their activations" in blocks["described"], blocks["described"]
    assert none["activations"] > 4 * 2**20  # a step adds megabytes: there is something to save
    # the activations of 6 blocks become their 6 inputs, and one block's at a time
    assert blocks["activations"] < 0.4 * none["activations"], (none, blocks)
    # the model, its Adam slots: as they were (remat adds no variable), and the device holds them
    assert blocks["state"] == none["state"] > 0
    assert blocks["persistent"] >= blocks["state"] and none["persistent"] >= none["state"]
