"""HorovodStrategy under `horovodrun --gloo` on loopback (real processes, bounded in time)."""

import json
import os
import re
import sys
import time

import numpy as np
import pytest

from tests.conftest import (
    ROOT,
    USER_SHELL,
    docs_command,
    in_turn_failure,
    run_command,
)
from tests.models import assert_started_from_worker_0, load_arrays

pytestmark = pytest.mark.usefixtures("horovod_installed")

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")
ENV = {"PYTHONPATH": ROOT}


def _horovodrun(np_, *args, timeout=300, env=None):
    return run_command(
        ["horovodrun", "-np", str(np_), "-H", f"localhost:{np_}", "--gloo", sys.executable, *args],
        timeout=timeout,
        env={**ENV, **(env or {})},
    )


# Every training case of this file's gloo tests, in one horovodrun (one TensorFlow and Horovod
# start for all): NAME: (GLOBAL_BATCH, EPOCHS, EXAMPLES, OP, COMPRESSION, BACKWARD_PASSES, KERAS
# [, ZERO_STAGE, OPTIMIZER]).
CASES = {
    "average": (16, 2, 96, "average", "none", 1, 2),
    "padded": (16, 2, 90, "average", "none", 1, 2),
    "sum": (16, 2, 96, "sum", "none", 1, 2),
    "fp16": (16, 2, 96, "average", "fp16", 1, 2),
    "accumulate-keras2": (8, 2, 96, "average", "none", 2, 2),
    "accumulate-keras3": (8, 2, 96, "average", "none", 2, 3),
    "zero-sgd": (16, 2, 96, "average", "none", 1, 2, 1, "sgd"),
    "zero-adam": (16, 2, 96, "average", "none", 1, 3, 2, "adam"),
    "zero-adamw-bf16": (16, 2, 96, "average", "bf16", 1, 2, 1, "adamw"),
    "zero-accumulate-keras3": (8, 2, 96, "average", "none", 2, 3, 2, "-"),
    "zero3-adam": (16, 2, 96, "average", "none", 1, 3, 3, "adam"),
    "zero3-sgd": (16, 2, 96, "average", "none", 1, 2, 3, "sgd"),
    "lamb": (16, 2, 96, "average", "none", 1, 2, 0, "lamb"),
}


def _case_arguments(cases):
    return [":".join(map(str, (name, *cases[name]))) for name in cases]


def _kernels(output):
    """{case: {rank: kernel}} from horovod_one_step.py's lines."""
    kernels = {}
    for case, rank, kernel in re.findall(r"KERNEL (\S+) (\d) (\[[^\]]*\])", output):
        kernels.setdefault(case, {})[rank] = np.array(json.loads(kernel))
    return kernels


# The one-step cases of horovod_one_step.py (OP:COMPRESSION[:embedding]), run after CASES in the
# same ranks.
ONE_STEP_CASES = [
    "average:none",
    "sum:none",
    "average:fp16",
    "average:bf16",
    "average:none:embedding",
    "sum:none:embedding",
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """{case: (each rank's weights, each rank's history, rank 1's strategy description)},
    "kernels": {one-step case: {rank: kernel}} and the job's "output": horovod_train.py's cases,
    then horovod_one_step.py's and which_strategy.py, in the same ranks (scripts/in_turn.py)."""
    out = tmp_path_factory.mktemp("horovod_train")
    result = _horovodrun(
        2,
        os.path.join(SCRIPTS, "in_turn.py"),
        "horovod_train.py",
        str(out),
        *_case_arguments(CASES),
        "--then",
        "horovod_one_step.py",
        *ONE_STEP_CASES,
        "--then",
        "which_strategy.py",
        timeout=450,
    )
    assert result.returncode == 0, in_turn_failure(result.output)
    runs = {}
    for name in CASES:
        assert_started_from_worker_0(out / name)  # the broadcast of rank 0's initial values
        runs[name] = (
            [load_arrays(out / name / f"rank_{r}.npz") for r in range(2)],
            [json.loads((out / name / f"rank_{r}.json").read_text()) for r in range(2)],
            (out / name / "describe_1.txt").read_text(),
        )
    runs["folder"] = out
    runs["kernels"] = _kernels(result.output)
    runs["output"] = result.output
    return runs


def _reference(lr=0.1, global_batch=16, epochs=2, strategy=None, examples=96, history=None):
    """The same model trained in this process (DataParallel on 2 virtual devices, or one device);
    ``history``: a dict that takes fit's history (with a strategy)."""
    import tensorflow as tf

    import tfpar
    from tests.models import (
        compile_for_equivalence,
        equivalence_data,
        equivalence_model,
        one_device_weights,
    )

    if strategy is None:
        return one_device_weights(examples, global_batch, epochs, lr)
    x, y = equivalence_data(examples)
    with strategy.scope():
        model = equivalence_model()
        compile_for_equivalence(model)
    train = tfpar.data.distribute(
        tf.data.Dataset.from_tensor_slices((x, y)), strategy, global_batch
    )
    logs = model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=epochs, verbose=0)
    if history is not None:
        history.update(logs.history)
    return model.get_weights()


def test_two_ranks_end_identical_and_equal_to_data_parallel(trained):
    import tfpar

    (rank0, rank1), logs, output = trained["average"]
    for a, b in zip(rank0, rank1):
        np.testing.assert_array_equal(a, b)
    history = {}
    reference = _reference(strategy=tfpar.DataParallel(), history=history)
    for a, b in zip(rank0, reference):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    # Metrics are global: both ranks log the same numbers (per-rank ones through MetricAverage),
    # DataParallel's, though their all-reduces wait for the gradients to travel in their cycle.
    assert logs[0] == logs[1]
    np.testing.assert_allclose(logs[0]["loss"], history["loss"], rtol=1e-5)
    reads = json.loads((trained["folder"] / "average" / "reads_0.json").read_text())
    assert reads["metrics"] >= 2 and reads["after_gradients"] == reads["metrics"], reads
    assert logs[0]["rank_number"] == [1.5, 1.5] and all(
        e > 0 for e in logs[0]["examples_per_second"]
    )
    assert "workers:    2 (this is rank 1" in output and "8 per replica, 16 global" in output


def test_a_padded_last_step_trains_like_one_device_fed_a_short_last_batch(trained):
    """90 examples, global batch 16: the sixth step holds 10 real examples (5 per rank) and 6
    padding rows; one device gets the same examples with a last batch of 10."""
    (rank0, rank1), _, _ = trained["padded"]
    for a, b in zip(rank0, rank1):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(rank0, _reference(examples=90)):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def test_sum_and_compression_change_the_numbers_as_they_should(trained):
    (average, _), _, _ = trained["average"]
    # Sum of the two ranks' mean gradients = twice the global mean: plain SGD at twice the rate.
    (summed, _), _, _ = trained["sum"]
    for a, b in zip(summed, _reference(lr=0.2)):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    # fp16 on the wire: close to the float32 run, but rounded.
    (fp16, _), _, _ = trained["fp16"]
    assert any(not np.array_equal(a, b) for a, b in zip(fp16, average))
    # After 2 epochs 1.4e-2 apart at most (measured): gradients below float16's normal range
    # (6e-5) lose most of their digits, and momentum carries that on. One step: the next test.
    for a, b in zip(fp16, average):
        np.testing.assert_allclose(a, b, atol=2e-2, rtol=0)


@pytest.mark.parametrize(
    "case", ["zero-sgd", "zero-adam", "zero-adamw-bf16", "zero3-adam", "zero3-sgd"]
)
def test_zero_over_two_ranks_trains_like_one_device_and_every_rank_writes_the_whole_optimizer_state(
    trained, case
):
    """HorovodStrategy(zero_stage=1 or 2): each rank keeps half of the optimizer state and updates
    half of the weights (an alltoall and an allgather per bucket: buckets of 1 KiB here, several
    named collectives a step); the ranks end identical and where one device does (SGD with
    Nesterov momentum under tf_keras, Adam clipped by the global norm under Keras 3; AdamW with
    bf16 on the wire to its rounding). zero_stage=3 (both Kerases): each rank also holds half of
    each parameter, allgathered by name where a layer reads it. The checkpoint each rank wrote holds
    the whole state: loaded into a plain optimizer on one device, it is one device's state."""
    import importlib

    from tests.models import equivalence_model, one_device_model, zero_optimizer

    _, _, _, _, compression, _, keras_version, stage, optimizer = CASES[case]
    (rank0, rank1), _, output = trained[case]
    for a, b in zip(rank0, rank1):
        np.testing.assert_array_equal(a, b)
    k = importlib.import_module("keras" if keras_version == 3 else "tf_keras")
    reference = one_device_model(96, 16, 2, k, optimizer)
    difference = max(float(np.abs(a - b).max()) for a, b in zip(rank0, reference.get_weights()))
    # Adam divides by sqrt(v), which magnifies the last bits of a loss summed over 2 ranks instead
    # of one batch: 1.4e-6 measured (Keras 3, 2 epochs); SGD's ends within 1e-6; bf16 rounds.
    assert (
        1e-4 < difference < 2e-2
        if compression == "bf16"
        else difference < (5e-6 if optimizer == "adam" else 1e-6)
    ), difference
    assert f"zero:       stage {stage}: each replica keeps and updates 1/2 of the " in output
    if stage == 3:
        assert "per replica: weights 9,644 B -> 4,824 B" in output
    slots = 1 if optimizer == "sgd" else 2
    params = sum(int(np.prod(v.shape)) for v in reference.trainable_weights)
    assert (
        f"optimizer state {4 * slots * params:,} B -> {4 * slots * -(-params // 2):,} B" in output
    )
    restored = equivalence_model(k=k)
    restored.compile(
        zero_optimizer(k, optimizer), k.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    restored.optimizer.build(restored.trainable_variables)
    restored.load_weights(
        str(trained["folder"] / case / ("ckpt_1.weights.h5" if keras_version == 3 else "ckpt_1"))
    )
    state = [_values(m.optimizer.variables) for m in (restored, reference)]
    assert len(state[0]) == len(state[1]) > slots * len(reference.trainable_weights), [
        len(s) for s in state
    ]
    for a, b in zip(*state):
        np.testing.assert_allclose(a, b, atol=2e-2 if compression == "bf16" else 1e-6, rtol=0)


def test_lamb_over_two_ranks_trains_like_one_device(trained):
    """tfpar.optimizers.LAMB under HorovodStrategy: the trust ratio of Horovod's averaged gradient,
    the same on both ranks, so they end identical and where one device ends with the whole
    batches."""
    from tests.models import one_device_model

    (rank0, rank1), _, _ = trained["lamb"]
    for a, b in zip(rank0, rank1):
        np.testing.assert_array_equal(a, b)
    import tfpar

    reference = one_device_model(96, 16, 2, tfpar.keras, "lamb").get_weights()
    assert max(float(np.abs(a - b).max()) for a, b in zip(rank0, reference)) < 5e-6


def test_zero_with_accumulation_over_two_ranks_trains_like_unsharded_accumulation(trained):
    """backward_passes_per_step=2 with zero_stage=2 (Keras 3): each rank reduce-scatters every step
    and sums its chunk, applied every 2nd step: the run ends where the unsharded accumulation
    does."""
    (sharded, other), _, output = trained["zero-accumulate-keras3"]
    (whole, _), _, _ = trained["accumulate-keras3"]
    for a, b in zip(sharded, other):
        np.testing.assert_array_equal(a, b)
    assert max(float(np.abs(a - b).max()) for a, b in zip(sharded, whole)) < 1e-6
    assert "zero:       stage 2" in output and "backward_passes_per_step=2" in output


def _values(variables):
    return [np.asarray(v) for v in (variables() if callable(variables) else variables)]


@pytest.fixture(scope="module")
def one_step(trained):
    """{"op:compression": {rank: kernel}}: every gloo case of one step, in the training job."""
    kernels = trained["kernels"]
    assert sorted(kernels) == sorted(ONE_STEP_CASES) and all(
        sorted(k) == ["0", "1"] for k in kernels.values()
    ), kernels
    return kernels


@pytest.mark.parametrize("compression, rounding", [("fp16", 2.0**-10), ("bf16", 2.0**-8)])
def test_compression_rounds_one_step_to_its_precision(one_step, compression, rounding):
    """fp16 goes through Horovod's all-reduce, bf16 through one allgather of bf16 bits: either way
    the step is the float32 one to within the format's rounding, and rounded."""
    a, b = np.array([0.1, 0.2]), np.array([0.3, 0.7])  # exact in neither format
    kernels = one_step[f"average:{compression}"]
    assert np.array_equal(kernels["0"], kernels["1"])
    exact = -(a + b) / 2
    np.testing.assert_allclose(kernels["0"], exact, atol=2e-3, rtol=0)
    np.testing.assert_allclose(kernels["0"], exact, rtol=rounding)  # within the format's rounding
    # and rounded: it went in 16 bits
    assert not np.allclose(kernels["0"], exact, rtol=1e-6, atol=0)


@pytest.mark.parametrize("keras_version", ["2", "3"])
def test_gradient_accumulation_trains_like_a_larger_batch(trained, keras_version):
    """2 ranks x 4 examples x 2 backward passes = one plain step of 16 examples, in either Keras
    (Keras 3 reduces its gradients in a replica context, tf_keras in a merge_call)."""
    import importlib

    from tests.models import one_device_weights

    (rank0, rank1), _, output = trained[f"accumulate-keras{keras_version}"]
    assert "backward_passes_per_step=2" in output
    for a, b in zip(rank0, rank1):
        np.testing.assert_array_equal(a, b)
    k = (
        importlib.import_module("keras")
        if keras_version == "3"
        else importlib.import_module("tfpar").keras
    )
    for a, b in zip(rank0, one_device_weights(96, 16, k=k)):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def test_adasum_is_refused_clearly_on_gloo(tmp_path):
    result = _horovodrun(
        2,
        os.path.join(SCRIPTS, "horovod_train.py"),
        str(tmp_path),
        *_case_arguments({"adasum": (16, 1, 96, "adasum", "none", 1, 2)}),
    )
    assert result.returncode != 0
    assert (
        "Adasum needs Horovod's MPI controller" in result.output
        and "Received: op='adasum'" in result.output
    )


@pytest.fixture(scope="module")
def over_mpi(tmp_path_factory):
    """Adasum under `horovodrun --mpi`, one job: the training case "adasum" (its folder) and the
    one-step case "adasum:none" (the job's output)."""
    import horovod.tensorflow as hvd

    if not hvd.mpi_built():  # Horovod runs Adasum over MPI only
        pytest.skip("this Horovod has no MPI (tfpar install-horovod builds it in where OpenMPI is)")
    out = tmp_path_factory.mktemp("over_mpi")
    result = run_command(
        [
            "horovodrun",
            "-np",
            "2",
            "-H",
            "localhost:2",
            "--mpi",
            sys.executable,
            os.path.join(SCRIPTS, "in_turn.py"),
            "horovod_train.py",
            str(out),
            *_case_arguments({"adasum": (16, 2, 96, "adasum", "none", 1, 2)}),
            "--then",
            "horovod_one_step.py",
            "adasum:none",
        ],
        timeout=400,
        env={**ENV, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"},
    )
    assert result.returncode == 0, in_turn_failure(result.output)
    return out / "adasum", result.output


def test_adasum_over_mpi_trains_with_its_own_combination_rule(over_mpi, trained):
    (average, _), _, _ = trained["average"]
    folder, _ = over_mpi
    adasum, rank1 = (load_arrays(folder / f"rank_{r}.npz") for r in range(2))
    for a, b in zip(adasum, rank1):
        np.testing.assert_array_equal(a, b)
    assert any(not np.allclose(a, b, atol=1e-4) for a, b in zip(adasum, average))
    loss = json.loads((folder / "rank_0.json").read_text())["loss"]
    assert loss[-1] < loss[0]


def _adasum(a, b):
    """Horovod's Adasum of two gradients (Maleki et al.): each scaled down by its share of the
    other."""
    dot = float(np.dot(a, b))
    return (1 - dot / (2 * np.dot(a, a))) * a + (1 - dot / (2 * np.dot(b, b))) * b


# rank 0's gradient, rank 1's, in the one-step tests
A, B = np.array([1.0, 0.0]), np.array([1.0, 1.0])


def _assert_one_sgd_step(kernels, expected):
    assert sorted(kernels) == ["0", "1"]
    for kernel in kernels.values():  # SGD at rate 1 from zero: the kernel is minus the update
        np.testing.assert_allclose(kernel, -expected, rtol=1e-6)


@pytest.mark.parametrize(
    "op, expected", [("average", (A + B) / 2), ("sum", A + B)], ids=["average", "sum"]
)
def test_one_step_applies_the_reduction_rule_to_known_gradients(one_step, op, expected):
    _assert_one_sgd_step(one_step[f"{op}:none"], expected)


def test_a_boolean_is_reduced_over_the_ranks_true_where_any_rank_s_is(trained):
    """Horovod adds no booleans (a KerasHub model's padding_mask, which Keras 3's fit reduces):
    counted as integers, true where any rank's is, and the same on every rank."""
    printed = re.findall(r"BOOLEAN (\w+) (\d) (\[.*\])", trained["output"])
    assert sorted(printed) == [
        (op, rank, "[True, False]") for op in ("MEAN", "SUM") for rank in ("0", "1")
    ], printed


@pytest.mark.parametrize(
    "op, expected",
    [("average", [0.5, 0.25, 0.25]), ("sum", [1.0, 0.5, 0.5])],
    ids=["average", "sum"],
)
def test_a_sparse_gradient_takes_the_reduction_rule_of_a_dense_one(one_step, op, expected):
    """An Embedding's sparse gradient, densified for op="sum" (Horovod scales dense tensors only):
    the loss is the mean of a rank's 2 looked-up rows over 2 replicas, so each lookup's gradient is
    1/4; row 0 is looked up on both ranks, rows 1 and 2 on one each. "sum" is twice "average"."""
    _assert_one_sgd_step(one_step[f"{op}:none:embedding"], np.array(expected))


def test_one_step_of_adasum_over_mpi_applies_its_combination_rule(over_mpi):
    expected = _adasum(A, B)
    assert not np.allclose(expected, (A + B) / 2) and not np.allclose(expected, A + B)
    _, output = over_mpi
    _assert_one_sgd_step(_kernels(output)["adasum:none"], expected)


def test_adasum_needs_a_power_of_two_ranks(tmp_path):
    code = "from tfpar.strategies.horovod import HorovodStrategy; HorovodStrategy(op='adasum')"
    result = _horovodrun(3, "-c", code, timeout=200)
    assert result.returncode != 0
    assert (
        "Adasum needs a number of ranks that is a power of two. Received: op='adasum' with 3 ranks"
        in result.output
    )


def test_a_dead_rank_fails_the_job_within_bounded_time():
    start = time.monotonic()
    result = _horovodrun(2, os.path.join(SCRIPTS, "horovod_die.py"), timeout=240)
    assert result.returncode != 0
    assert "rank 1 dies now" in result.output
    assert "rank finished all epochs" not in result.output
    # horovodrun names the rank that died and its code, and the job ends within a minute
    # (5 s here, start-up included) instead of the test's 240 s limit.
    assert "Process 1 exit with status code 9." in result.output
    assert (
        "Horovod detected that one or more processes exited with non-zero status" in result.output
    )
    assert time.monotonic() - start < 60


def test_doctor_reports_horovod(doctor):
    assert re.search(r"horovod:\s+0\.28\.1, controllers: Gloo", doctor.output), doctor.output


def test_horovodrun_starts_its_ranks_without_a_process_that_imports_tensorflow(doctor):
    """Horovod's runner asks a new process that imports TensorFlow which controllers are built
    (about 8 s of CPU before the ranks start, each time); tfpar's build answers from the note its
    install wrote. Every Python process of the job logs its imports (PYTHONPROFILEIMPORTTIME)."""
    imports_tensorflow = re.compile(
        r"^(\[\d\]<stderr>:)?import time:.*\| tensorflow$", re.MULTILINE
    )
    code = "import os; print('rank', os.environ['HOROVOD_RANK'], 'started')"
    started = run_command(
        ["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, "-c", code],
        timeout=120,
        env={"PYTHONPROFILEIMPORTTIME": "1"},
    )
    assert started.returncode == 0, started.output[-3000:]
    assert sorted(re.findall(r"rank (\d) started", started.output)) == ["0", "1"]
    assert "| horovod.runner.launch" in started.output  # the runner's imports are logged
    assert not imports_tensorflow.findall(started.output)
    check = run_command(
        ["horovodrun", "--check-build"], timeout=60, env={"PYTHONPROFILEIMPORTTIME": "1"}
    )
    assert check.returncode == 0 and not imports_tensorflow.findall(check.output), check.output[
        -3000:
    ]
    mpi = "MPI" in re.search(r"controllers: (.*)", doctor.output).group(1)
    for mark, name in (
        ("X", "TensorFlow"),
        (" ", "PyTorch"),
        (" ", "MXNet"),
        ("X", "Gloo"),
        ("X" if mpi else " ", "MPI"),
    ):
        assert f"[{mark}] {name}\n" in check.output, check.output


def test_demo_on_horovod_reaches_the_accuracy_target():
    result = run_command(docs_command("tfpar demo --strategy horovod"), timeout=400, env=USER_SHELL)
    assert result.returncode == 0, result.output[-3000:]
    assert "HorovodStrategy (Horovod ring all-reduce)" in result.output
    assert "workers:    2 (this is rank 0" in result.output
    accuracy = float(re.search(r"validation accuracy: ([0-9.]+)", result.output).group(1))
    assert accuracy >= 0.95, result.output[-3000:]
    assert result.output.count("validation accuracy:") == 1  # only rank 0 prints the summary


def test_demo_on_horovod_with_a_keras3_model_and_its_optimizer_state_sharded():
    result = run_command(
        [
            "tfpar",
            "demo",
            "--strategy",
            "horovod",
            "--keras",
            "3",
            "--epochs",
            "3",
            "--zero-stage",
            "1",
        ],
        timeout=400,
    )
    assert result.returncode == 0, result.output[-3000:]
    assert (
        "HorovodStrategy (Horovod ring all-reduce)" in result.output
        and "keras:      Keras 3 3." in result.output
    )
    assert (
        "zero:       stage 1: each replica keeps and updates 1/2 of the optimizer state"
        in result.output
    )
    accuracy = float(re.search(r"validation accuracy: ([0-9.]+)", result.output).group(1))
    # 3 epochs; the default 8 epochs' target is tested above
    assert accuracy >= 0.8, result.output[-3000:]
    assert result.output.count("validation accuracy:") == 1


def test_horovod_example_runs_under_horovodrun(tmp_path):
    """The Horovod guide's line, from a user's shell, with options of the example added."""
    command = docs_command(
        "horovodrun -np 2 -H localhost:2 --gloo python examples/train_horovod.py"
    )
    options = ["--epochs", "2", "--compression", "fp16", "--checkpoint-dir", str(tmp_path)]
    result = run_command([*command, *options], timeout=300, env=USER_SHELL)
    assert result.returncode == 0, result.output[-3000:]
    assert "HorovodStrategy (Horovod ring all-reduce)" in result.output
    accuracy = float(
        re.search(r"validation accuracy after 2 epochs: ([0-9.]+)", result.output).group(1)
    )
    assert accuracy > 0.5
    assert result.output.count("validation accuracy after") == 1
    # Keras' epoch lines come from rank 0 only.
    # 1e-3 x 2 ranks
    assert re.search(r"\[0\]<stdout>:.*val_accuracy.* - lr: 0.0020", result.output)
    assert not re.search(r"\[1\]<stdout>:.*val_accuracy", result.output)
    # Only rank 0 writes checkpoints; rank 1's temporary copies are removed.
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("epoch_2")) == [
        "epoch_2.data-00000-of-00001",
        "epoch_2.index",
    ]
    assert not [p for p in tmp_path.rglob("workertemp_*")]


def test_one_script_picks_horovod_under_horovodrun(trained):
    """scripts/which_strategy.py; the same script picks DataParallel elsewhere:
    tests/multiproc/test_data_parallel_multiworker.py."""
    assert trained["output"].count("strategy HorovodStrategy 2") == 2
