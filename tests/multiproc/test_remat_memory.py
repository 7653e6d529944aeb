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


def test_fully_sharded_parameters_keep_half_of_the_model_state_on_each_of_two_workers():
    """zero_stage=3 over 2 workers of `tfpar launch` (KerasHub's Llama, 2 blocks, 9.9 M
    parameters, Adam): what each worker's device keeps between steps is about half of the model's
    and optimizer's whole state (their weights and slots are pieces; the state counted as one
    device would hold it), where stage 0 keeps all of it (bench/memory.py: 0.47x on 67.6 M
    parameters). The whole copies go at compile (they sat in reference cycles until a later
    collection: 0.9x of the whole state here before)."""
    sizes = ["--layers", "2", "--hidden", "512", "--intermediate", "1376", "--heads", "8"]
    sizes += ["--vocabulary", "4000", "--sequence", "32", "--batch", "2", "--steps", "2"]
    worker = [sys.executable, WORKER, "--zero-stage", "3", *sizes, "--epochs", "1"]
    command = [sys.executable, "-m", "tfpar.cli", "launch", "-n", "2", "--", *worker]
    result = run_command(command, timeout=300, env={"TF_CPU_ALLOCATOR_USE_BFC": "true"})
    assert result.returncode == 0, result.output[-3000:]
    runs = [
        json.loads(line.split("BENCH ", 1)[1])
        for line in result.output.splitlines()
        if "BENCH " in line
    ]
    assert sorted(run["worker"] for run in runs) == [0, 1]
    for run in runs:
        held = run["zero"]
        whole = held["weights"][0] + held["optimizer state"][0]  # one device's: 12 B a parameter
        assert whole == 12 * run["parameters"]
        assert held["weights"][1] + held["optimizer state"][1] <= 0.51 * whole, held
        assert run["persistent"] < 0.6 * whole, run
