"""The main job and every example run as a user would run them (tiny settings)."""

import json
import re
import sys

import numpy as np
import pytest

from tests.conftest import USER_SHELL, docs_command, run_command, tfpar_command


@pytest.mark.parametrize("keras_version, named", [("2", "tf_keras 2."), ("3", "Keras 3 3.")])
def test_demo_flags_pick_devices_and_epochs(keras_version, named):
    result = run_command(
        tfpar_command("demo", "--devices", "3", "--epochs", "2", "--keras", keras_version),
        timeout=300,
    )
    assert result.returncode == 0, result.output[-3000:]
    assert f"keras:      {named}" in result.output
    assert "replicas:   3" in result.output and "32 per replica, 96 global" in result.output
    assert "Epoch 2/2" in result.output and "epochs:              2" in result.output
    # The demo's callbacks: warm-up (lr) and throughput in the progress bar.
    assert " - lr: " in result.output and " - examples_per_second: " in result.output


def test_data_parallel_example_on_one_host(tmp_path):
    """The one-host guide's command, from a user's shell, with its results written out."""
    result = run_command(
        [
            *docs_command("python examples/train_data_parallel.py"),
            "--epochs",
            "2",
            "--out",
            str(tmp_path),
        ],
        timeout=300,
        env=USER_SHELL,
    )
    assert result.returncode == 0, result.output[-3000:]
    assert "MirroredDataParallel" in result.output
    report = json.loads((tmp_path / "worker_0.json").read_text())
    assert report["replicas"] == 2 and len(report["loss"]) == 2
    # The digits' 10 classes start near ln(10) = 2.3; the second epoch ends 40 % lower here.
    assert report["loss"][1] < 0.75 * report["loss"][0] < 0.75 * 2.31, report
    with np.load(tmp_path / "worker_0.npz") as saved:
        assert len(saved.files) == 8 and all(np.isfinite(saved[k]).all() for k in saved.files)


def test_pipeline_example_saves_a_plain_model(tmp_path):
    result = run_command(
        [
            sys.executable,
            "examples/train_pipeline.py",
            "--epochs",
            "2",
            "--schedule",
            "gpipe",
            "--recompute",
        ],
        timeout=300,
    )
    assert result.returncode == 0, result.output[-3000:]
    assert "Pipeline (gpipe: 2 stages x 8 microbatches)" in result.output
    assert "bubble_theory: 0.1111" in result.output
    accuracy = float(
        re.search(r"saved plain model after 2 epochs: ([0-9.]+)", result.output).group(1)
    )
    assert accuracy > 0.8, result.output[-3000:]


def test_demo_with_mixed_bfloat16():
    result = run_command(
        ["tfpar", "demo", "--precision", "mixed_bfloat16", "--epochs", "4"],  # 0.971 measured
        timeout=400,
    )
    assert result.returncode == 0, result.output[-3000:]
    assert "precision:  mixed_bfloat16" in result.output
    assert float(re.search(r"validation accuracy: ([0-9.]+)", result.output).group(1)) >= 0.95


def test_demo_qat_and_compress_export_int8_tflite_with_the_deployment_report():
    # float: 0.975
    result = run_command(["tfpar", "demo", "--qat", "--compress", "--epochs", "4"], timeout=400)
    assert result.returncode == 0, result.output[-3000:]
    accuracy = {
        name: float(value)
        for name, value in re.findall(r"TFLite (float32|int8) .*?accuracy ([0-9.]+)", result.output)
    }
    assert accuracy["float32"] >= 0.95 and accuracy["int8"] >= accuracy["float32"] - 0.03, (
        result.output[-2000:]
    )
    assert (
        float(re.search(r"TFLite size ratio float/int8: ([0-9.]+)", result.output).group(1)) >= 3.5
    )
    # --compress: pruned, clustered, int8; written only within 1 point of the float model.
    assert "compressed (pruned 75 %, 16 clusters, int8), against the float model:" in result.output
    smaller = float(re.search(r"gzipped: ([0-9.]+)x smaller gzipped", result.output).group(1))
    drop = float(
        re.search(
            r"held-out examples: drop ([-+0-9.]+) \(max_accuracy_drop 0.01\)", result.output
        ).group(1)
    )
    sparsity = float(
        re.search(r"sparsity: +([0-9.]+)% of the weights are zero", result.output).group(1)
    )
    assert smaller >= 8 and drop <= 0.01 and 74 <= sparsity <= 76, result.output[-2000:]
    assert len(re.findall(r"int8\[.*\]: \d+ distinct values, 7[45]\.\d% zero", result.output)) == 4


def test_doctor_reports_versions_and_devices(doctor):
    result = doctor
    assert re.search(r"^tensorflow:\s+2\.21\.", result.output, re.M)
    assert re.search(r"^tf_keras:\s+2\.21\.\d+ \(tf\.keras is tf_keras\)", result.output, re.M)
    assert re.search(r"^devices:\s+\d+ GPU\(s\), \d+ CPU\(s\), \d+ cores", result.output, re.M)
    assert re.search(
        r"^cpu:\s+.*(int8 dot products in hardware|no int8 dot-product instructions)",
        result.output,
        re.M,
    )
    # no GPU here
    assert re.search(r"^precision:\s+'auto' picks (float32|mixed_bfloat16): ", result.output, re.M)
    assert re.search(r"^kernels:\s+(oneDNN's|Eigen's) ", result.output, re.M)
    # its state either way (test_horovod.py: installed)
    assert re.search(r"^horovod:\s+", result.output, re.M)
