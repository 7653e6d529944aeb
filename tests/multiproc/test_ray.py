"""Ray Train for real: a local Ray cluster on 127.0.0.1 (started by the script, 2 CPUs), tfpar
inside TensorflowTrainer's train_loop_per_worker with 2 workers."""

import glob
import importlib.util
import json
import os
import sys

import numpy as np
import pytest

from tests.conftest import ROOT, run_command
from tests.models import load_arrays

if importlib.util.find_spec("ray") is None:
    # Under CI ([dev] installs Ray) a missing Ray is a broken install: fail, never skip.
    if os.environ.get("CI"):
        raise ImportError("Ray is not installed, but [dev] installs it: the install is broken")
    pytest.skip("Ray is not installed (pip install '.[ray]')", allow_module_level=True)
# with the README's Ray block: one local Ray cluster at a time
pytestmark = pytest.mark.xdist_group("ray")
SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "ray_train.py")
# Ray takes this machine's outward address for its nodes and for TF_CONFIG unless told it runs on
# one machine: then every Ray and TensorFlow address is 127.0.0.1.
LOCAL_RAY = {"PYTHONPATH": ROOT, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_DEDUP_LOGS": "0"}


def _ray(out, *args, timeout=400):
    result = run_command([sys.executable, SCRIPT, str(out), *args], timeout=timeout, env=LOCAL_RAY)
    report = [line for line in result.output.splitlines() if line.startswith("RESULT ")]
    return result, json.loads(report[-1][len("RESULT ") :]) if report else None


def _epochs(out):
    """{start epoch: [losses]} of each run of the loop, per worker."""
    runs = {}
    for path in glob.glob(os.path.join(out, "epochs_*_*.json")):
        worker = int(os.path.basename(path).split("_")[1])
        with open(path) as f:
            run = json.load(f)
        runs.setdefault(worker, {})[run["start"]] = run["loss"]
    return runs


@pytest.fixture(scope="module")
def killed_job(tmp_path_factory):
    """One local Ray cluster (2 CPUs) for both tests below (a cluster start is 20 s here): it
    refuses 3 workers, then runs the job of 2 with a worker killed."""
    out = tmp_path_factory.mktemp("ray")
    result, report = _ray(out, "--kill-worker", "--zero", "--refuse-workers", "3")
    return out, result, report


def test_a_killed_ray_worker_restarts_the_group_which_resumes_from_the_last_checkpoint(killed_job):
    """Two Ray workers train as one job on 127.0.0.1, their optimizer state sharded over them
    (zero_stage=1), and report checkpoints; one is killed in epoch 3 and Ray restarts the group from
    the last one. Each checkpoint holds the whole optimizer state: the last one loads into a plain
    model and optimizer on one device. (The README's Ray block runs an unsharded job
    undisturbed.)"""
    tmp_path, result, report = killed_job
    assert result.returncode == 0 and report, result.output[-4000:]
    assert (
        "127.0.0.1:" in result.output and "cluster_spec = {'worker': ['127.0.0.1:" in result.output
    )
    assert (tmp_path / "killed").exists()
    runs = _epochs(tmp_path)
    # Only the restarted run finished (the first was killed in epoch 3); it started after a
    # reported checkpoint (epoch 1 or 2, as far as Ray had registered one), not from scratch.
    assert runs[0].keys() == runs[1].keys() and len(runs[0]) == 1
    (start,) = runs[0]
    assert 1 <= start <= 2 and len(runs[0][start]) == 4 - start
    assert runs[0][start][-1] < runs[0][start][0]  # the resumed run trains on
    # The checkpoints reached Ray: the last one, of epoch 4, with the model, optimizer and epoch.
    assert (
        report["metrics"]["epoch"] == 4
        and report["metrics"]["loss"] > 0
        and "examples_per_second" in report["metrics"]
    )
    with open(os.path.join(report["checkpoint"], "epoch.json")) as f:
        assert json.load(f) == {"epoch": 4}
    workers = [load_arrays(tmp_path / f"worker_{i}.npz") for i in range(2)]
    for a, b in zip(*workers):
        np.testing.assert_array_equal(a, b)  # one model, trained together
    assert "zero:       stage 1" in result.output
    import tensorflow as tf

    import tfpar

    keras = tfpar.keras
    plain = keras.Sequential(
        [keras.layers.Input((8,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(1)]
    )
    plain.compile(keras.optimizers.SGD(0.02, momentum=0.9), "mse")
    plain.optimizer.build(plain.trainable_variables)
    tf.train.Checkpoint(model=plain, optimizer=plain.optimizer).read(
        os.path.join(report["checkpoint"], "state")
    ).assert_existing_objects_matched()
    for a, b in zip(plain.get_weights(), workers[0]):
        np.testing.assert_array_equal(a, b)  # the checkpoint of the last epoch
    momenta = [np.asarray(v) for v in plain.optimizer.variables if v.name.startswith("m/")]
    assert [m.shape for m in momenta] == [v.shape for v in plain.trainable_variables]
    # every variable's whole momentum, from both workers' halves
    assert all(np.abs(m).max() > 0 for m in momenta)
    print(
        f"Ray start-up {report['ray_start_seconds']:.1f} s, whole job "
        f"{report['total_seconds']:.1f} s"
    )


def test_a_ray_cluster_smaller_than_the_workers_is_refused_at_once(killed_job):
    """Checked before the trainer starts anything: Ray itself would wait for the third CPU without
    end."""
    _, result, _ = killed_job
    refused = [line for line in result.output.splitlines() if line.startswith("REFUSED after ")]
    assert len(refused) == 1, result.output[-3000:]
    assert (
        "The Ray cluster has 2 CPU in all, and ScalingConfig(num_workers=3) asks for 1 per "
        "worker (3); Ray would wait for them without end"
    ) in refused[0]
    assert float(refused[0].split()[2]) < 5  # seconds after the cluster was up
    assert result.output.index(refused[0]) < result.output.index("worker 0 starts at epoch")
