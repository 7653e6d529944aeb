"""`tfpar verify` as a command: parameter servers, Horovod ranks and workers (real processes)."""

import pytest

from tests.conftest import ROOT, run_command, tfpar_command
from tests.gradient_paths import EXPECTED_DIFFERENCES, SAME_CODE_AS_ZERO1
from tfpar.verify._paths import PATHS

DEMO = [
    "--model",
    "tfpar.demo:compiled_model",
    "--data",
    "tfpar.demo:digits_dataset",
    "--steps",
    "4",
]
VERIFY = [*tfpar_command("verify"), *DEMO]


def test_the_demo_model_trains_like_one_replica_under_parameter_servers():
    """Over workers, the synchronized-BatchNorm check below runs the same command; under Horovod
    ranks, the image model's path job."""
    result = run_command(
        [*VERIFY, "--strategy", "parameter_server"], timeout=300, env={"PYTHONPATH": ROOT}
    )
    assert result.returncode == 0, result.output[-4000:]
    # the chief's
    assert result.output.count("PASSED: trains like one replica") == 1, result.output[-3000:]
    assert result.output.count(" ok   ") == 8 and "DIFF" not in result.output


def test_synchronized_batchnorm_trains_like_one_device_on_the_global_batch_across_workers():
    """Its moving statistics too: verify compares every variable (3 whole global batches). Under
    Horovod ranks, the image model's "plain" row below is this check: its BatchNormalization is
    synchronized, and the row compares every variable, the moving statistics included."""
    result = run_command(
        tfpar_command(
            "launch",
            "-n",
            "2",
            "--",
            *tfpar_command("verify"),
            "--model",
            "tests.models:verify_synchronized_batchnorm_model",
            "--data",
            "tests.models:equivalence_data",
            "--batch-size",
            "32",
            "--steps",
            "3",
        ),
        timeout=300,
        env={"PYTHONPATH": ROOT},
    )
    assert result.returncode == 0, result.output[-4000:]
    assert "moving_mean" in result.output and "moving_variance" in result.output
    assert "PASSED: trains like one replica" in result.output and "DIFF" not in result.output


def test_a_model_that_differs_exits_1_naming_the_cause():
    # the module from the folder it runs in
    result = run_command(
        [
            *tfpar_command("verify"),
            "--model",
            "tests.models:verify_batchnorm_model",
            "--data",
            "tests.models:equivalence_data",
            "--batch-size",
            "32",
            "--steps",
            "3",
        ],
        timeout=300,
        env={"PYTHONPATH": None},
        cwd=ROOT,
    )
    assert result.returncode == 1, result.output[-4000:]
    assert (
        "[1] BatchNormalization statistics taken per replica (layer 'batch_normalization')"
        in result.output
    )
    assert "FAILED: differs from one replica" in result.output


def _path_verdicts(output):
    """{path: verdict} of the rows the chief printed (tfpar launch's ``[worker 0]`` prefix, or
    horovodrun's ``[0]<stdout>:``)."""
    verdicts = {}
    for line in output.splitlines():
        for prefix in ("[worker 0] ", "[0]<stdout>:"):
            row = line[len(prefix) :].split() if line.startswith(prefix) else []
            if len(row) > 1 and row[1] in ("ok", "DIFF"):
                verdicts[row[0]] = row[1]
    return verdicts


# Both engines, both Kerases, both shapes, each once (CI time): the text model's embedding across
# workers (ZeRO's all-to-all of its rows), the image model's rows that differ under Horovod.
ENGINES = [("workers", "text", "keras3"), ("horovod", "image", "tf_keras")]


@pytest.mark.parametrize("engine, shape, keras", ENGINES)
def test_every_gradient_path_trains_like_one_device_across_processes(engine, shape, keras, request):
    """`tfpar verify --paths ...`, one job for the 16 paths that run code of their own (all but
    SAME_CODE_AS_ZERO1): over 2 workers of `tfpar launch` (a MultiWorkerDataParallel per path: the
    second keeps the server the first started, with collective keys of its own) and under 2 Horovod
    ranks, both Kerases and shapes. The rows of one host (tests/devices/test_gradient_paths.py), the
    same that differ."""
    paths = [path for path in PATHS if path not in SAME_CODE_AS_ZERO1]
    launcher = ["-n", "2"]
    strategy = []
    if engine == "horovod":
        request.getfixturevalue("horovod_installed")
        launcher = ["--horovod", "-n", "2"]
        strategy = ["--strategy", "horovod"]
    model = [
        "--model",
        f"tests.gradient_paths:{shape}_{keras}",
        "--data",
        f"tests.gradient_paths:{shape}_data",
    ]
    command = tfpar_command(
        "launch",
        *launcher,
        "--",
        *tfpar_command("verify"),
        *strategy,
        *model,
        "--batch-size",
        "16",
        "--steps",
        "4",
        "--paths",
        ",".join(paths),
    )
    result = run_command(command, timeout=400, env={"PYTHONPATH": ROOT})
    verdicts = _path_verdicts(result.output)
    assert sorted(verdicts) == sorted(paths), result.output[-4000:]
    for path, verdict in verdicts.items():
        expected = "DIFF" if (shape, keras, path) in EXPECTED_DIFFERENCES else "ok"
        assert verdict == expected, (path, result.output[-4000:])
    assert result.returncode == 1  # verify's exit code: a path differs (as on one host)


def test_keras_hub_gpt2_recomputed_trains_like_one_device_under_horovod_ranks(request):
    """``remat="blocks"`` under HorovodStrategy, 2 ranks: GPT-2's transformer layers recompute
    their activations, and it trains like one device (`DataParallel`'s on one host:
    tests/devices/test_remat.py). Its ``padding_mask``, a boolean Keras 3's ``fit`` reduces to read
    its shape, reaches Horovod's all-reduce as this rank's (it took no booleans)."""
    request.getfixturevalue("horovod_installed")
    models = "tests.gradient_paths"
    command = tfpar_command(
        "launch",
        "--horovod",
        "-n",
        "2",
        "--",
        *tfpar_command("verify"),
        "--strategy",
        "horovod",
        *("--model", f"{models}:gpt2_keras_hub", "--data", f"{models}:gpt2_data"),
        *("--batch-size", "16", "--steps", "3", "--remat", "blocks"),
    )
    result = run_command(command, timeout=300, env={"PYTHONPATH": ROOT})
    assert result.returncode == 0, result.output[-4000:]
    assert "2 block(s) recompute their activations" in result.output, result.output[-3000:]
    assert result.output.count("PASSED: trains like one replica") == 1, result.output[-3000:]
