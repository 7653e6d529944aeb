"""Real processes on 127.0.0.1: tfpar launch + MultiWorkerMirroredStrategy."""

import collections
import json
import os
import re
import signal
import subprocess
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
    tfpar_command,
)
from tests.models import assert_started_from_worker_0, load_arrays
from tfpar.cluster import ClusterInfo, local_cluster

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")


def _launch(workers, script, *args, timeout=300, env=None):
    """``tfpar launch -n WORKERS -- python scripts/SCRIPT ARGS...``: a `Finished`."""
    command = [sys.executable, os.path.join(SCRIPTS, script), *map(str, args)]
    launch = tfpar_command("launch", "-n", str(workers), "--", *command)
    return run_command(launch, timeout=timeout, env=env)


def test_launch_nproc_per_node_trains_two_workers_a_device_each_to_identical_weights(tmp_path):
    """The README's launch line, torchrun's spelling: each worker gets its own device (here, one
    virtual CPU device each: no GPU on this machine; the GPU ids each would get are tested in
    tests/unit/test_nodes.py)."""
    command = docs_command(
        "tfpar launch --nproc-per-node 2 -- python examples/train_data_parallel.py"
    )
    result = run_command(
        [*command, "--epochs", "3", "--out", str(tmp_path)],
        timeout=300,
        env={**USER_SHELL, "TFPAR_NUM_CPU_DEVICES": None},
    )
    assert result.returncode == 0, result.output[-4000:]
    assert "MultiWorkerDataParallel (MultiWorkerMirroredStrategy)" in result.output
    weights = [np.load(tmp_path / f"worker_{i}.npz") for i in range(2)]
    assert len(weights[0].files) == 8
    for name in weights[0].files:
        np.testing.assert_array_equal(weights[0][name], weights[1][name])
    logs = [json.loads((tmp_path / f"worker_{i}.json").read_text()) for i in range(2)]
    assert all(log["replicas"] == 2 for log in logs)
    assert [log["devices"] for log in logs] == [["/device:CPU:0"]] * 2  # its own, not the host's 2
    losses = logs[0]["loss"]
    assert losses[-1] < 0.7 * losses[0]


# Groups of multiworker_train.py: (DataParallel's options, its cases
# NAME:EXAMPLES:KERAS[:OPTIMIZER]). The cases of a group share a strategy; the groups share one job,
# one TensorFlow start for them all.
EQUIVALENCE_JOBS = {
    "default": ([], ["whole-steps:96:2", "padded-last-step-keras3:90:3", "lars-keras3:96:3:lars"]),
    "ring-4KiB-packs-accumulate-2": (
        ["all_reduce=ring", "bytes_per_pack=4096", "gradient_accumulation_steps=2"],
        ["ring-accumulate-keras3:96:3"],
    ),
    "zero-2": (
        ["zero_stage=2", "zero_bucket_bytes=1024"],
        ["zero-sgd:90:2:sgd", "zero-adam-keras3:96:3:adam", "zero-adamw:96:2:adamw"],
    ),
    "zero-1-bf16": (["zero_stage=1", "compression=bf16"], ["zero-adamw-bf16-keras3:96:3:adamw"]),
    "zero-3": (["zero_stage=3"], ["zero3-adam-keras3:96:3:adam", "zero3-adamw:96:2:adamw"]),
    "remat-conv": (["remat=[conv2d*]"], ["remat-conv:96:2", "remat-conv-keras3:96:3"]),
}


FILE_SIZES = [5, 9, 3, 6]


def _joined(parts, separator):
    """The lists ``parts`` as one argument list, ``separator`` between them."""
    joined = list(parts[0])
    for part in parts[1:]:
        joined += [separator, *part]
    return joined


@pytest.fixture(scope="module")
def two_worker_job(tmp_path_factory):
    """One job of 2 workers for the scripts of the tests below, in turn (scripts/in_turn.py), one
    TensorFlow start for them all: the equivalence groups of EQUIVALENCE_JOBS, every example of 23
    reaching one worker, KerasTuner's search, the callbacks, the strategy auto() picks, the
    examples of 4 uneven files (last: it turns on tfpar.data's log). Returns the job's output and
    {script's folder: path}."""
    root = tmp_path_factory.mktemp("two_workers")
    folders = {name: root / name for name in ("equivalence", "coverage", "tuner", "files")}
    for folder in folders.values():
        folder.mkdir()
    from tests.models import write_id_files

    write_id_files(folders["files"], FILE_SIZES)
    groups = [[",".join(cases), *options] for options, cases in EQUIVALENCE_JOBS.values()]
    runs = [
        ["multiworker_train.py", folders["equivalence"], 16, 2, *_joined(groups, "+")],
        ["coverage_worker.py", 23, 4, folders["coverage"]],
        ["tuner_multiworker.py", folders["tuner"]],
        ["callbacks_multiworker.py"],
        ["which_strategy.py"],
        [
            "coverage_worker.py",
            sum(FILE_SIZES),
            4,
            folders["files"],
            "--files",
            ",".join(map(str, FILE_SIZES)),
        ],
    ]
    result = _launch(
        2, "in_turn.py", *_joined(runs, "--then"), timeout=600, env={"PYTHONPATH": ROOT}
    )
    assert result.returncode == 0, in_turn_failure(result.output)
    return result.output, folders


@pytest.fixture(scope="module")
def equivalence_jobs(two_worker_job):
    """The groups of EQUIVALENCE_JOBS, each under a strategy of its options, in the same 2
    processes: {group: (the job's output, its folder)}."""
    output, folders = two_worker_job
    return {job: (output, folders["equivalence"]) for job in EQUIVALENCE_JOBS}


@pytest.mark.parametrize(
    "job, case",
    [
        pytest.param(job, case, id=case.split(":")[0])
        for job, (_, cases) in EQUIVALENCE_JOBS.items()
        for case in cases
    ],
)
def test_two_workers_train_exactly_like_one_device(equivalence_jobs, job, case):
    """2 workers, global batch 16 (8 per replica), against one device with the same batches:
    90 examples leave the last step 10 real examples and 6 padding rows, trained in Keras 3 beside
    a tf_keras model in the same processes; the second job splits the ring all-reduce into packs of
    4 KiB (the model's gradients are 9.6 KiB) and accumulates 2 steps per update, so one device
    takes batches of 32; the third shards the optimizer state over the workers (ZeRO: SGD with
    Nesterov momentum, Adam clipped by the global norm, AdamW excluding the biases from its decay;
    in buckets of at most 1 KiB, each exchanged in turn),
    the fourth with bf16 on the wire (to its rounding); the fifth recomputes the Conv2D's
    activations in the backward pass (``remat``, both Kerases). LARS (Keras 3) takes its trust
    ratio from the workers' all-reduced gradient, as one device from its whole batch."""
    import importlib

    from tests.models import (
        equivalence_data,
        equivalence_model,
        one_device_model,
        one_device_weights,
    )
    from tfpar import keras as tfpar_keras

    output, folder = equivalence_jobs[job]
    options = EQUIVALENCE_JOBS[job][0]
    name, examples, keras_version, *optimizer = case.split(":")
    examples, tmp_path = int(examples), folder / name
    assert "8 per replica, 16 global" in output
    if "all_reduce=ring" in options:
        assert "all_reduce='ring'" in output and "bytes_per_pack=4096" in output
    if "remat=[conv2d*]" in options:  # its Conv2D forward again in the backward, on each worker
        assert "1 block(s) recompute their activations" in output, output[-3000:]
    assert_started_from_worker_0(tmp_path)
    workers = [load_arrays(tmp_path / f"worker_{i}.npz") for i in range(2)]
    for a, b in zip(*workers):
        np.testing.assert_array_equal(a, b)
    k = importlib.import_module("keras") if keras_version == "3" else tfpar_keras
    accumulated = 2 if "gradient_accumulation_steps=2" in options else 1
    reference = (
        one_device_model(examples, 16 * accumulated, 2, k, optimizer[0]).get_weights()
        if optimizer
        else one_device_weights(examples, 16 * accumulated, k=k)
    )
    difference = max(float(np.abs(a - b).max()) for a, b in zip(workers[0], reference))
    # sharded (ZeRO): SGD within 1e-6; Adam and AdamW magnify the last bits of a loss summed over 2
    # workers instead of one batch by its 1/sqrt(v) (as over Horovod's ranks)
    if "compression=bf16" in options:  # the reduce-scatter's all-to-all carries bf16: its rounding
        assert 1e-4 < difference < 2e-2, difference
    else:
        assert difference < ((1e-6 if optimizer == ["sgd"] else 5e-6) if optimizer else 1e-5), (
            difference
        )
    print(f"{case}: {difference:.2e} from one device")
    if optimizer:
        return  # evaluate and predict: the other jobs
    # evaluate ignores the padding rows (weight 0): its loss is the mean of the steps' means over
    # their real examples (README); predict returns one row per example, in order. Both as the
    # trained model gives them on one device.
    trained = equivalence_model(k=k)
    trained.set_weights(workers[0])
    x, y = equivalence_data(examples)
    losses = k.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")(
        y, trained(x)
    )
    loss = np.mean(
        [np.mean(step) for step in np.array_split(np.asarray(losses), range(16, examples, 16))]
    )
    for i in range(2):
        with np.load(tmp_path / f"scored_{i}.npz") as scored:
            assert float(scored["loss"]) == pytest.approx(loss, rel=1e-5)
            np.testing.assert_allclose(
                scored["predictions"], trained.predict(x, verbose=0), atol=1e-5
            )


@pytest.mark.parametrize("job", ["zero-2", "zero-3"])
def test_zero_over_two_workers_writes_the_whole_optimizer_state_each_worker(equivalence_jobs, job):
    """zero_stage=2 (and 3) across 2 workers: each keeps half of the optimizer state (describe's
    bytes; at stage 3 half of the parameters too), and the checkpoint each wrote (gathered from
    both) holds one device's whole state: loaded into a plain optimizer on one device, it is the
    state one device reaches. So does FaultTolerance's last backup, which the chief alone keeps
    (Keras 3's, a .weights.h5; the other worker gathers with it, in step)."""
    import importlib

    from tests.models import equivalence_model, one_device_model, zero_optimizer

    output, folder = equivalence_jobs[job]
    stage = job.split("-")[1]
    assert f"zero:       stage {stage}: each replica keeps and updates 1/2 of the " in output
    if stage == "3":
        assert "per replica: weights 9,644 B -> 4,824 B" in output
    for case in EQUIVALENCE_JOBS[job][1]:
        name, examples, keras_version, optimizer = case.split(":")
        k = importlib.import_module("keras" if keras_version == "3" else "tf_keras")
        reference = one_device_model(int(examples), 16, 2, k, optimizer)
        written = [
            f"ckpt_{worker}" + (".weights.h5" if keras_version == "3" else "") for worker in (0, 1)
        ]
        backup = folder / name / "backup"
        assert backup.is_dir() and any(backup.iterdir()), case
        if keras_version == "3":
            written.append("backup/latest.weights.h5")
        for path in written:
            restored = equivalence_model(k=k)
            restored.compile(
                zero_optimizer(k, optimizer),
                k.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
            restored.optimizer.build(restored.trainable_variables)
            restored.load_weights(str(folder / name / path))
            state = [[np.asarray(v) for v in m.optimizer.variables] for m in (restored, reference)]
            slots = 1 if optimizer == "sgd" else 2
            assert len(state[0]) == len(state[1]) > slots * len(reference.trainable_weights), (
                case,
                path,
            )
            for a, b in zip(*state):
                np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def _assert_each_example_once(folder, workers, n, global_batch):
    logs = [json.loads((folder / f"worker_{i}.json").read_text()) for i in range(workers)]
    counts = collections.Counter(i for log in logs for i in log["seen"])
    assert counts == collections.Counter(range(n))
    assert {log["steps"] for log in logs} == {-(-n // global_batch)}
    assert all(log["epochs"] == 3 for log in logs)


def test_each_example_reaches_exactly_one_worker_and_epochs_end_cleanly(two_worker_job):
    _, folders = two_worker_job
    _assert_each_example_once(folders["coverage"], 2, 23, 4)


def test_each_example_reaches_exactly_one_of_three_workers_and_epochs_end_cleanly(tmp_path):
    result = _launch(3, "coverage_worker.py", 31, 6, tmp_path)
    assert result.returncode == 0, result.output[-4000:]
    _assert_each_example_once(tmp_path, 3, 31, 6)


def test_files_are_counted_once_for_the_job_and_every_example_is_read_once(two_worker_job):
    """4 uneven files, 2 workers: each worker counts 2 of them, the counts are summed over the
    workers, and both plan the same steps from them: every example is read exactly once."""
    output, folders = two_worker_job
    for worker in range(2):
        assert (
            f"[worker {worker}] INFO:tfpar.data:counted 2 of the 4 input files here; the other "
            "worker(s) counted the rest and the 2 workers summed the counts"
        ) in output
    logs = [json.loads((folders["files"] / f"worker_{i}.json").read_text()) for i in range(2)]
    assert collections.Counter(i for log in logs for i in log["seen"]) == collections.Counter(
        range(sum(FILE_SIZES))
    )
    assert logs[0]["steps"] == logs[1]["steps"]


def test_a_lost_peer_makes_the_survivor_fail_instead_of_hanging(tmp_path):
    """No launcher here: the surviving worker must notice the dead peer by itself."""
    cluster = local_cluster({"worker": 2})
    procs = []
    env = dict(os.environ, COLLECTIVE_TIMEOUT="20", PYTHONUNBUFFERED="1")
    try:
        for index in range(2):
            info = ClusterInfo(cluster=cluster, task_type="worker", task_index=index)
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        os.path.join(SCRIPTS, "coverage_worker.py"),
                        "23",
                        "4",
                        str(tmp_path),
                        "--die-after-epoch",
                        "1",
                    ],
                    cwd=ROOT,
                    env=dict(env, TF_CONFIG=info.to_tf_config()),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        assert procs[1].wait(timeout=240) == 9
        start = time.monotonic()
        code = procs[0].wait(timeout=240)
        waited = time.monotonic() - start
        output = procs[0].stdout.read().decode(errors="replace")
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert code != 0, output[-3000:]
    assert "done" not in output
    # The survivor learns of the death whichever way comes first: the coordination service misses
    # the peer's heartbeats (about 11 s here), or the pending collective's gRPC connection to the
    # peer is reset or closed (both seen in CI, depending on where the peer's kill found the
    # connection). Either way the wait is bounded (under the 20 s collective timeout plus
    # start-up), and the error names the peer.
    assert waited < 20 + 20, f"survivor failed {waited:.1f} s after its peer died"
    assert "UnavailableError" in output, output[-3000:]
    assert re.search(
        r"stopped sending heartbeats|Connection reset by peer|Socket closed", output
    ), output[-3000:]
    assert re.search(r"/job:worker/(replica:0/)?task:1\b", output), output[-3000:]


def test_a_multi_worker_strategy_made_after_tensorflow_ran_says_to_create_it_first():
    cluster = local_cluster({"worker": 2})
    tf_config = ClusterInfo(cluster=cluster, task_type="worker", task_index=0).to_tf_config()
    code = (
        "import tfpar, tensorflow as tf; tf.constant(1.0) + 1\n"
        "try:\n    tfpar.DataParallel()\nexcept RuntimeError as e:\n    print('REFUSED', e)"
    )
    result = run_command([sys.executable, "-c", code], timeout=120, env={"TF_CONFIG": tf_config})
    assert (
        "REFUSED A multi-worker DataParallel must be created before TensorFlow runs anything"
        in result.output
    )
    assert "Create the strategy first, at the top of the script" in result.output


def test_keras_tuner_searches_under_two_workers_with_tfpar_callbacks(two_worker_job):
    """KerasTuner (Keras 3) under `tfpar launch -n 2`: both workers run the same trials in step
    under MultiWorkerDataParallel, with tfpar's callbacks, and agree on every score."""
    _, folders = two_worker_job
    folder = folders["tuner"]
    seen = [json.loads((folder / f"tuner_{i}.json").read_text()) for i in range(2)]
    trials = seen[0]["trials"]
    assert sorted(t["lr"] for t in trials) == [0.01, 0.03] and all(
        t["status"] == "COMPLETED" for t in trials
    )
    assert all(0 < t["score"] <= 1 for t in trials)
    assert seen[1]["trials"] == trials and seen[1]["best"] == seen[0]["best"]
    for worker in seen:
        assert len(worker["runs"]) == 2
        for run in worker["runs"]:
            assert run["strategy"] == "MultiWorkerDataParallel" and run["replicas"] == 2
            assert all(v > 0 for v in run["history"]["examples_per_second"])
        # Both workers logged the same losses: one model, trained together.
        assert [r["history"]["loss"] for r in worker["runs"]] == [
            r["history"]["loss"] for r in seen[0]["runs"]
        ]
    # Only the chief reported and saved: one oracle, one checkpoint per trial, in the shared folder.
    assert sorted(p.name for p in (folder / "search").iterdir()) == [
        "oracle.json",
        "trial_0",
        "trial_1",
        "tuner0.json",
    ]


def test_metric_average_throughput_and_nan_guard_on_two_workers(two_worker_job):
    """scripts/callbacks_multiworker.py: averaging, throughput and the NaN guard, where workers
    matter."""
    output, _ = two_worker_job
    reports = sorted(
        (
            json.loads(line.split("REPORT ", 1)[1])
            for line in output.splitlines()
            if "REPORT " in line
        ),
        key=lambda r: r["worker"],
    )
    assert [r["worker"] for r in reports] == [0, 1]
    for report in reports:
        assert report["worker_number"] == [1.5, 1.5]  # (1 + 2) / 2 on both workers
        # not in keys: per worker
        assert report["kept_number"] == [10.0 * (report["worker"] + 1)] * 2
        assert all(e > 0 for e in report["examples_per_second"])
        # Each worker measures its own wall time; per worker = total / 2 workers.
        assert report["per_worker"] == [e / 2 for e in report["examples_per_second"]]
        assert report["finite_after_stop"]
    # Both workers stopped at the same step (neither was left waiting in a collective).
    assert reports[0]["stopped_at_step"] is not None
    assert reports[0]["stopped_at_step"] == reports[1]["stopped_at_step"]


def test_one_script_picks_data_parallel_without_horovod(two_worker_job):
    """`tfpar.strategies.auto()` (scripts/which_strategy.py): multi-worker under `tfpar launch`, one
    host under plain python (under horovodrun it picks HorovodStrategy:
    tests/multiproc/test_horovod.py)."""
    output, _ = two_worker_job
    assert output.count("strategy MultiWorkerDataParallel 2") == 2
    script = os.path.join(SCRIPTS, "which_strategy.py")
    alone = run_command([sys.executable, script], timeout=200, env={"PYTHONPATH": ROOT})
    assert alone.returncode == 0 and alone.output.count("strategy MirroredDataParallel 2") == 1
