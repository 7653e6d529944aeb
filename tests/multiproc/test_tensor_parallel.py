"""Tensor parallelism over more devices than the test process has: T = 4, and tensor x pipeline x
data on one host (8 virtual CPU devices in a process of its own); pipeline x data, tensor x data and
all three across 2 workers."""

import os
import re
import sys

from tests.conftest import run_json_script

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")


def test_tensor_4_and_the_one_host_compositions_train_exactly_like_the_plain_model():
    report = run_json_script(os.path.join(SCRIPTS, "tensor_parallel_checks.py"), timeout=600)
    # 3 models at T = 4, the block in 3 layouts, 2 x 2 x 2 under both Kerases
    assert len(report) == 7
    assert {run.split()[-2] for run in report if " tensor 4 " in run} == {
        "mlp",
        "block",
        "embedding",
    }
    for layout in ("pipeline 2 x tensor 2", "data 2 x tensor 2", "data 2 x pipeline 2 x tensor 2"):
        assert any(f" {layout} block " in run for run in report), layout
    assert {run.split()[0] for run in report} == {"tf_keras", "keras"}
    assert {run.split()[-1] for run in report} == {"sgd", "adam"}
    for run, result in report.items():
        assert result["moved"] > 5e-3, run  # it trained
        worst = max(result["differences"].values())
        assert worst < 1e-5, (run, sorted(result["differences"].items(), key=lambda kv: -kv[1])[:3])


# Each layout once (the CI budget): both Kerases and both optimizers among them, and Horovod's ranks
# run 2 x 2 x 2 again below. 40 examples: a last global batch of 8, padded by tfpar.data.
CASES = [
    "pipeline:tf_keras:adam",
    "gpt2:keras:adam",
    "gpt2_pipeline_tensor:keras:sgd",
    "tensor_alone:tf_keras:sgd:40",
]


def test_two_workers_of_pipelines_and_tensor_parallel_models_train_like_one_device(tmp_path):
    """`tfpar launch -n 2`, each worker with 4 virtual devices: pipeline x data (2 stages), tensor x
    data (T = 2, TensorParallel written alone: on KerasHub's GPT-2, split inside its blocks, and on
    the block with a padded last batch) and 2 x 2 x 2 on GPT-2 (cut between its backbone's blocks,
    each stage split), each fed by tfpar.data, against the plain model trained on one device on
    the same global batches."""
    from tests.conftest import ROOT, run_command, tfpar_command

    script = os.path.join(SCRIPTS, "model_parallel_workers.py")
    result = run_command(
        tfpar_command(
            "launch", "-n", "2", "--", sys.executable, script, str(tmp_path), ",".join(CASES)
        ),
        timeout=600,
        env={"PYTHONPATH": ROOT},
    )
    assert result.returncode == 0, result.output[-4000:]
    assert (
        "mesh:       data 2 x pipeline 2 x tensor 2 (2 workers x 1 replicas; this is worker 0)"
        in result.output
    )
    assert re.search(
        r"/CPU:3: weights [0-9,]+ B, optimizer [0-9,]+ B \(\d+% of one device's", result.output
    )
    styles = re.search(r"gpt2 styles: (.*)", result.output).group(1)  # split inside every block
    inside = [
        ("self_attention", "heads"),
        ("feedforward_intermediate_dense", "column"),
        ("feedforward_output_dense", "row"),
    ]
    for block in range(2):
        for path, style in inside:
            planned = f"('gpt2_backbone/transformer_layer_{block}/{path}', '{style}')"
            assert planned in styles, styles
    _assert_like_one_device(tmp_path, CASES)


HOROVOD_CASES = ["pipeline_tensor:tf_keras:adam", "tensor_alone:keras:sgd"]


def test_two_horovod_ranks_of_a_pipeline_and_a_tensor_parallel_model_train_like_one_device(
    tmp_path, horovod_installed
):
    """The same under `horovodrun -np 2 --gloo`: Horovod's all-reduce and all-gather sum the
    gradients."""
    from tests.conftest import ROOT, run_command

    script = os.path.join(SCRIPTS, "model_parallel_workers.py")
    result = run_command(
        [
            "horovodrun",
            "-np",
            "2",
            "-H",
            "localhost:2",
            "--gloo",
            sys.executable,
            script,
            str(tmp_path),
            ",".join(HOROVOD_CASES),
        ],
        timeout=600,
        env={"PYTHONPATH": ROOT},
    )
    assert result.returncode == 0, result.output[-4000:]
    assert (
        "mesh:       data 2 x pipeline 2 x tensor 2 (2 workers x 1 replicas; this is worker 0)"
        in result.output
    )
    _assert_like_one_device(tmp_path, HOROVOD_CASES)


def _assert_like_one_device(tmp_path, cases, workers=2):
    import importlib

    import numpy as np

    from tests.models import case_model, load_arrays, weight_differences

    for case in cases:
        layout, keras_name, optimizer, *examples = case.split(":")
        folder = tmp_path / "-".join([layout, keras_name, optimizer, *examples])
        trained = [load_arrays(str(folder / f"worker_{i}.npz")) for i in range(workers)]
        for a, b in zip(trained[0], trained[-1]):
            # the replicas agree exactly: worker 1 started from worker 0's
            np.testing.assert_array_equal(a, b)
        k = importlib.import_module(keras_name)
        plain, x, y = case_model(layout, k, int(examples[0]) if examples else 32)
        plain.compile(
            k.optimizers.SGD(0.1, momentum=0.9) if optimizer == "sgd" else k.optimizers.Adam(0.003),
            k.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        initial = plain.get_weights()
        plain.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
        assert max(float(np.abs(a - b).max()) for a, b in zip(initial, plain.get_weights())) > 5e-3
        differences = weight_differences(plain, plain.get_weights(), trained[0], optimizer)
        assert max(differences.values()) < 1e-5, (
            case,
            sorted(differences.items(), key=lambda kv: -kv[1])[:3],
        )


SPAN_CASES = ["span:keras:adam", "span_tensor:tf_keras:sgd"]


def test_a_pipeline_over_two_workers_trains_like_one_device(tmp_path):
    """`Pipeline(span_workers=True)` under `tfpar launch -n 2`: 4 stages over the 2 workers' 2
    devices each, and 2 stages each 2-way tensor-parallel inside one worker; worker 0 trains, worker
    1 serves its devices and ends with it (the job's exit code is 0 only if both end so)."""
    from tests.conftest import ROOT, run_command, tfpar_command

    script = os.path.join(SCRIPTS, "model_parallel_workers.py")
    result = run_command(
        tfpar_command(
            "launch", "-n", "2", "--", sys.executable, script, str(tmp_path), ",".join(SPAN_CASES)
        ),
        timeout=600,
        env={"PYTHONPATH": ROOT},
    )
    assert result.returncode == 0, result.output[-4000:]
    assert "tfpar server: worker 1 serving at 127.0.0.1:" in result.output
    assert result.output.count("(stages over the devices of 2 workers; worker 0 runs it)") == len(
        SPAN_CASES
    )
    assert (
        "devices:    [['/job:worker/replica:0/task:0/device:CPU:0', "
        "'/job:worker/replica:0/task:0/device:CPU:1', "
        "'/job:worker/replica:0/task:1/device:CPU:0', '/job:worker/replica:0/task:1/device:CPU:1']]"
    ) in result.output
    assert (
        "devices:    [[('/job:worker/replica:0/task:0/device:CPU:0', "
        "'/job:worker/replica:0/task:0/device:CPU:1'), "
        "('/job:worker/replica:0/task:1/device:CPU:0', "
        "'/job:worker/replica:0/task:1/device:CPU:1')]]"
    ) in result.output
    # worker 1 ran no training
    assert not any(f.name == "worker_1.npz" for f in tmp_path.rglob("*.npz"))
    _assert_like_one_device(tmp_path, SPAN_CASES, workers=1)


def test_a_lost_worker_of_a_pipeline_over_two_workers_fails_the_job_at_once():
    """Worker 1, holding stage 1, killed mid-fit: worker 0's step fails with TensorFlow's
    UnavailableError within seconds (not a hang), and the launcher ends the job with the cause."""
    from tests.conftest import ROOT, run_command, tfpar_command

    result = run_command(
        tfpar_command(
            "launch", "-n", "2", "--", sys.executable, os.path.join(SCRIPTS, "span_lost_worker.py")
        ),
        timeout=300,
        env={"PYTHONPATH": ROOT},
    )
    assert result.returncode != 0
    assert "worker 1 was killed by SIGKILL" in result.output, result.output[-3000:]
    # Worker 0 fails its step at once, unless the launcher, which stops the other tasks as soon as
    # one dies, got there first (CI saw both); either way the job ended, within run_command's
    # timeout.
    lost = re.search(r"LOST after ([0-9.]+) s: (\w+)", result.output)
    assert lost is None or (lost.group(2) == "UnavailableError" and float(lost.group(1)) < 30), (
        lost.group(0)
    )
    assert "FINISHED without noticing" not in result.output
