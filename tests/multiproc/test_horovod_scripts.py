"""Horovod's core API (``horovod.tensorflow``) on the Horovod tfpar builds, with Keras 3 models.

Scripts in the shape of Horovod's tensorflow2_synthetic_benchmark.py and of the cases of its
test_tensorflow.py that fail upstream on Keras 3 (horovod/horovod#4290), run as a user starts them:
``horovodrun -np 2 -H localhost:2 --gloo python SCRIPT``, nothing of tfpar imported. Real processes,
bounded in time.
"""

import json
import os
import re
import sys

import numpy as np
import pytest

from tests.conftest import run_command
from tests.models import load_arrays

pytestmark = pytest.mark.usefixtures("horovod_installed")

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")
KERAS3 = {"TF_USE_LEGACY_KERAS": None, "PYTHONPATH": None}  # as a user starts it: nothing set


def _horovodrun(env, *args, timeout=300):
    return run_command(
        ["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, *args],
        timeout=timeout,
        env=env,
    )


def test_the_synthetic_benchmark_shape_trains_on_keras3(tmp_path):
    """DistributedGradientTape and broadcast_variables on a tensorflow.keras.applications model:
    the ranks draw their own weights, the broadcast after the first step makes them rank 0's, and
    the averaged gradients keep them identical. Keras 3 only, the Keras that failed upstream: with
    TF_USE_LEGACY_KERAS=1 the script is on upstream Horovod's own tf_keras path (the CI budget)."""
    # MobileNet: the smallest application model to trace (45 s for this job here; MobileNetV2, the
    # script's default, 70 s); the fewest batches that still time two iterations.
    result = _horovodrun(
        KERAS3,
        os.path.join(SCRIPTS, "hvd_tf2_synthetic.py"),
        "--model",
        "MobileNet",
        "--num-warmup-batches",
        "1",
        "--num-iters",
        "2",
        "--num-batches-per-iter",
        "2",
        "--out",
        str(tmp_path),
    )
    assert result.returncode == 0, result.output[-4000:]
    rate = re.search(r"Total img/sec on 2 CPU\(s\): ([0-9.]+)", result.output)
    assert rate and float(rate.group(1)) > 0, result.output[-3000:]
    assert [json.loads((tmp_path / f"rank_{r}.json").read_text())["keras"] for r in range(2)] == [
        "keras"
    ] * 2  # the model's top package
    initial = [load_arrays(tmp_path / f"initial_{r}.npz") for r in range(2)]
    assert any(not np.array_equal(a, b) for a, b in zip(*initial))
    ranks = [load_arrays(tmp_path / f"rank_{r}.npz") for r in range(2)]
    assert len(ranks[0]) > 50  # MobileNet's trainable weights
    for a, b in zip(*ranks):
        np.testing.assert_array_equal(a, b)


def test_doctor_says_which_keras_horovod_tensorflow_scripts_get(doctor):
    # The doctor fixture runs from a user's shell: TF_USE_LEGACY_KERAS unset.
    assert (
        "horovod.tensorflow: takes the script's own Keras; tf.keras is Keras 3 "
        "(TF_USE_LEGACY_KERAS is not "
        "set). Keras 3 variables, optimizers (DistributedOptimizer), tapes and "
        "SyncBatchNormalization work as "
        "tf_keras ones do"
    ) in doctor.output, doctor.output


def test_horovods_failing_keras3_cases_pass():
    result = _horovodrun(KERAS3, os.path.join(SCRIPTS, "hvd_keras3_cases.py"))
    assert result.returncode == 0, result.output[-4000:]
    cases = [re.search(r"CASE (\S+) (\d) (\{.*\})", line) for line in result.output.splitlines()]
    cases = [(m.group(1), int(m.group(2)), json.loads(m.group(3))) for m in cases if m]
    syncbn = [values for name, _, values in cases if name == "syncbn"]
    assert len(syncbn) == 4 and {v["keras"] for v in syncbn} == {"keras"}
    for values in syncbn:  # 2 ranks x 2 shapes: equal to BatchNormalization on the whole batch
        assert max(values["output"], values["moving_mean"], values["moving_variance"]) < 1e-5, (
            values
        )
    tapes = [values for name, _, values in cases if name == "partial-tape"]
    assert len(tapes) == 2 and {v["keras"] for v in tapes} == {"keras"}
    for values in tapes:
        assert values["local_differs"]  # the local layer's gradients differ between the ranks
        assert sorted(is_local for is_local, _ in values["errors"].values()) == [
            False,
            False,
            True,
            True,
        ]
        assert max(error for _, error in values["errors"].values()) < 1e-5, values
    parallel = [values for name, _, values in cases if name == "model-parallel"]
    assert len(parallel) == 2 and {v["keras"] for v in parallel} == {"keras"}
    for (
        values
    ) in parallel:  # each rank's part and the shared layer after one step, the forward pass
        assert values["error"] < 1e-5 and values["output"] < 1e-5, values
    optimizers = [values for name, _, values in cases if name == "optimizer"]
    assert len(optimizers) == 2 and {v["keras"] for v in optimizers} == {"keras"}
    for (
        values
    ) in optimizers:  # a Keras 3 optimizer still (its own class, wrapped), like one process
        assert values["wrapped"] == "SGD" and values["error"] < 1e-5, values
