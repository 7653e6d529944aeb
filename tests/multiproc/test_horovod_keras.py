"""Horovod's own Keras API (``horovod.tensorflow.keras``) on the Horovod tfpar builds.

Scripts written for that API, in the shape of Horovod's examples, run unchanged under
``horovodrun -np 2 -H localhost:2 --gloo`` with nothing in the environment: the build picks
tf_keras by itself (`tfpar.install_horovod._copied_into_horovod.keras`). Real processes, bounded in
time.
"""

import json
import os
import re
import sys

import numpy as np
import pytest

from tests.conftest import ROOT, USER_SHELL, run_command
from tests.models import load_arrays
from tfpar.demo import DIGITS_FILE

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")
RANKS = 2


def _horovodrun(*args, timeout=300, env=USER_SHELL):
    return run_command(
        [
            "horovodrun",
            "-np",
            str(RANKS),
            "-H",
            f"localhost:{RANKS}",
            "--gloo",
            sys.executable,
            *args,
        ],
        timeout=timeout,
        env=env,
    )


def _expected_rates(initial_lr, size, warmup_epochs, steps_per_epoch, epochs, then=0.5):
    """Horovod's documented warm-up: from initial_lr / size to initial_lr over warmup_epochs,
    set at every batch (epoch + (batch + 1) / steps); then the schedule: initial_lr x ``then``."""
    rates = []
    for epoch in range(epochs):
        for batch in range(steps_per_epoch):
            if epoch < warmup_epochs:
                progress = epoch + (batch + 1) / steps_per_epoch
                rates.append(initial_lr / size * (progress * (size - 1) / warmup_epochs + 1))
            else:
                rates.append(initial_lr * then)
    return rates


@pytest.mark.usefixtures("horovod_installed")
def test_mnist_shaped_keras_script_runs_unchanged(tmp_path):
    epochs = 3
    result = _horovodrun(
        os.path.join(SCRIPTS, "hvd_keras_digits.py"), str(tmp_path), str(epochs), DIGITS_FILE
    )
    assert result.returncode == 0, result.output[-4000:]
    logs = [json.loads((tmp_path / f"rank_{r}.json").read_text()) for r in range(RANKS)]
    assert [log["keras"] for log in logs] == ["tf_keras"] * RANKS

    # Every rank starts from its own random weights; the broadcast makes them rank 0's, and
    # the averaged gradients keep them identical.
    initial = [load_arrays(tmp_path / f"initial_{r}.npz") for r in range(RANKS)]
    assert any(not np.array_equal(a, b) for a, b in zip(*initial))
    final = [load_arrays(tmp_path / f"rank_{r}.npz") for r in range(RANKS)]
    for a, b in zip(*final):
        np.testing.assert_array_equal(a, b)

    # MetricAverageCallback: each rank's own numbers differ; after it every rank holds their mean.
    for epoch in range(epochs):
        local = [log["local"][epoch] for log in logs]
        averaged = [log["averaged"][epoch] for log in logs]
        assert local[0]["loss"] != local[1]["loss"]
        for key in ("loss", "accuracy"):
            mean = np.mean([entry[key] for entry in local])
            assert averaged[0][key] == pytest.approx(mean, rel=1e-6)
            assert averaged[1][key] == averaged[0][key]

    # LearningRateWarmupCallback: the rate at every batch, from 0.004 / 2 up to 0.004 over 2 epochs;
    # then LearningRateScheduleCallback halves it.
    expected = _expected_rates(logs[0]["initial_lr"], RANKS, 2, logs[0]["steps_per_epoch"], epochs)
    for log in logs:
        np.testing.assert_allclose(log["lr"], expected, rtol=1e-6)
    # 0.004 / 2 ranks
    assert expected[0] == pytest.approx(0.002 * (1 + 1 / (2 * logs[0]["steps_per_epoch"])))
    assert "finished gradual learning rate warmup to 0.004" in result.output

    # Checkpoints: rank 0 writes one per epoch, and the last holds the final weights.
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == [
        f"checkpoint-{e}.h5" for e in (1, 2, 3)
    ]
    import tf_keras

    saved = tf_keras.models.load_model(
        str(tmp_path / "checkpoint-3.h5"), compile=False
    ).get_weights()
    for a, b in zip(saved, final[0]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.usefixtures("horovod_installed")
# Nothing set (the import picks tf_keras), and the variable set as Horovod's own docs say.
@pytest.mark.parametrize(
    "options, env",
    [
        ([], USER_SHELL),
        (
            ["--fp16-allreduce", "--backward-passes-per-step", "2"],
            {**USER_SHELL, "TF_USE_LEGACY_KERAS": "1"},
        ),
    ],
    ids=["plain", "fp16-accumulate2-variable-set"],
)
def test_synthetic_benchmark_shaped_keras_script_runs_unchanged(tmp_path, options, env):
    result = _horovodrun(
        os.path.join(SCRIPTS, "hvd_keras_synthetic.py"), "--out", str(tmp_path), *options, env=env
    )
    assert result.returncode == 0, result.output[-4000:]
    assert "Total img/sec on 2 CPU(s)" in result.output
    # the import statement too
    assert "Keras of the model: tf_keras, of applications: tf_keras" in result.output
    final = [load_arrays(tmp_path / f"rank_{r}.npz") for r in range(RANKS)]
    for a, b in zip(*final):
        np.testing.assert_array_equal(a, b)
    assert all(np.isfinite(w).all() for w in final[0])


# The selection itself (tfpar/install_horovod/_copied_into_horovod/keras.py, copied into Horovod by
# the installer) runs without Horovod: each case in a fresh process, as the order of imports is the
# point.
_SELECT = (
    "import tfpar.install_horovod._copied_into_horovod.keras as m; print('selected', "
    "m.keras.Model.__module__.split('.')[0])"
)


@pytest.mark.parametrize(
    "code, env, expected",
    [
        (_SELECT, {}, "selected tf_keras"),
        (
            "import tensorflow as tf; tf.keras.Model; " + _SELECT,
            {},
            "tf.keras is already Keras 3 in this process: set TF_USE_LEGACY_KERAS=1",
        ),
        (_SELECT, {"TF_USE_LEGACY_KERAS": "0"}, "tf.keras is already Keras 3 in this process"),
        (_SELECT, {"TF_USE_LEGACY_KERAS": "1"}, "selected tf_keras"),
    ],
    ids=["picks-tf_keras", "keras3-already-active", "keras3-asked-for", "legacy-asked-for"],
)
def test_horovod_keras_selection(code, env, expected):
    result = run_command(
        [sys.executable, "-c", code],
        timeout=120,
        env={**USER_SHELL, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "3", **env},
    )
    assert expected in result.output, result.output[-2000:]
    if not expected.startswith("selected"):
        assert result.returncode != 0
        error_lines = [
            line for line in result.output.splitlines() if line.startswith("ImportError")
        ]
        assert (
            len(error_lines) == 1 and "horovod.tensorflow.keras runs on tf_keras" in error_lines[0]
        )


@pytest.mark.usefixtures("horovod_installed")
def test_installed_horovod_keras_refuses_keras3_in_one_line():
    code = "import tensorflow as tf; tf.keras.Model; import horovod.tensorflow.keras"
    result = run_command(
        [sys.executable, "-c", code], timeout=120, env={**USER_SHELL, "TF_CPP_MIN_LOG_LEVEL": "3"}
    )
    assert result.returncode != 0
    assert (
        "ImportError: horovod.tensorflow.keras runs on tf_keras (the Keras 2 API), but tf.keras is "
        "already "
        "Keras 3 in this process: set TF_USE_LEGACY_KERAS=1" in result.output
    ), result.output[-2000:]


@pytest.mark.usefixtures("horovod_installed")
def test_doctor_says_horovod_keras_works(doctor):
    assert "horovod.tensorflow.keras: works, unchanged scripts run on tf_keras" in doctor.output, (
        doctor.output[-2000:]
    )


def _elastic_example(tmp_path, *options):
    """Horovod's elastic Keras example (scripts/hvd_keras_elastic.py) under `horovodrun --min-np 1
    --max-np 2
    --host-discovery-script`, localhost and 127.0.0.1 its two hosts, nothing set: (output, what each
    (rank, size) ran, the out folder)."""
    hosts, discover, out = tmp_path / "hosts", tmp_path / "discover.sh", tmp_path / "out"
    out.mkdir()
    hosts.write_text("localhost:1\n127.0.0.1:1\n")
    discover.write_text(f"#!/bin/sh\ncat {hosts}\n")
    discover.chmod(0o755)
    # A failed host stays out for 1-2 s (Horovod's own option; by default it stays out for good).
    # The ranks that go on wait for a joining rank in Gloo's rendezvous, 30 s by default: a new
    # rank's
    # TensorFlow start on a loaded 2-core CI machine can take longer (Horovod's own option again).
    result = run_command(
        [
            "horovodrun",
            "-np",
            "2",
            "--min-np",
            "1",
            "--max-np",
            "2",
            "--host-discovery-script",
            str(discover),
            "--blacklist-cooldown-range",
            "1",
            "2",
            "--gloo-timeout-seconds",
            "120",
            sys.executable,
            os.path.join(SCRIPTS, "hvd_keras_elastic.py"),
            str(hosts),
            str(out),
            *options,
        ],
        timeout=300,
        env={"TF_USE_LEGACY_KERAS": None, "PYTHONPATH": None},
    )
    assert result.returncode == 0, result.output[-4000:]
    assert "Process 1 exit with status code 137" in result.output  # the SIGKILL
    return result.output, {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}, out


@pytest.mark.usefixtures("horovod_installed")
def test_horovods_elastic_keras_example_survives_a_killed_rank_and_grows_back(tmp_path):
    """Horovod Elastic on tfpar's Horovod build, Keras 3 (tf.keras, nothing set): Horovod's elastic
    Keras example shape. Rank 1 is SIGKILLed in epoch 3 with its host gone from discovery: the
    survivor rolls back to its last commit (epoch 3 after batch 5: the state callbacks commit every
    batch) and goes on alone; the host comes back in epoch 5, the job grows to 2 ranks, which finish
    epoch 8 together."""
    output, ran, _ = _elastic_example(tmp_path)
    resets = re.findall(r"RESET size (\d) epoch (\d) batch (\d+)", output)
    assert resets == [("1", "2", "4"), ("2", "4", "0")], output[-3000:]
    done = sorted(re.findall(r"DONE rank (\d) size (\d) epoch (\d)", output))
    assert done == [("0", "2", "8"), ("1", "2", "8")], output[-3000:]
    assert ran["rank0-size1"] == [2, 3, 4]  # epoch 3 again from its commit, alone, into epoch 5
    # together, then again
    assert ran["rank0-size2"] == [0, 1, 2, 4, 5, 6, 7] == ran["rank1-size2"], ran


@pytest.mark.usefixtures("horovod_installed")
def test_horovods_elastic_example_with_tfpars_input_trains_every_example_once_across_the_resets(
    tmp_path,
):
    """The same job with tfpar's input (tfpar.integrations.horovod.ElasticInput, a global batch of
    32, commits every 3 batches): 2 ranks, then 1 from a rollback in the middle of epoch 3 (rank 1
    killed, its host gone), then 2 again from epoch 5 (the host back). Counted by id from what each
    process trained, the steps after a reset's position and before it dropped (the rollback
    discarded them): every epoch's 320 examples exactly once, and every step's examples those the
    steps of an undisturbed 2-rank job hold."""
    import collections

    output, ran, out = _elastic_example(tmp_path, "--tfpar-data")
    resets = [
        tuple(map(int, r)) for r in re.findall(r"RESET size (\d) epoch (\d) batch (\d+)", output)
    ]
    assert [size for size, _, _ in resets] == [1, 2], output[-3000:]
    (_, lost_epoch, lost_step), (_, grown_epoch, _) = resets
    assert (lost_epoch, grown_epoch) == (
        2,
        4,
    ) and 0 < lost_step < 5  # rolled back into epoch 3, before the kill
    done = sorted(re.findall(r"DONE rank (\d) size (\d) epoch (\d)", output))
    assert done == [("0", "2", "6"), ("1", "2", "6")], output[-3000:]
    lines = [
        json.loads(line)
        for path in out.glob("pid*.jsonl")
        for line in path.read_text().splitlines()
    ]
    rollbacks = [(line["time"], tuple(line["reset"])) for line in lines if "reset" in line]
    steps = [line for line in lines if "ids" in line]
    kept = [
        s
        for s in steps
        if not any(t > s["time"] and (s["epoch"], s["step"]) >= at for t, at in rollbacks)
    ]
    assert len(kept) < len(steps)  # the rollback discarded trained steps
    for epoch in range(6):
        counts = collections.Counter(i for s in kept if s["epoch"] == epoch for i in s["ids"])
        assert counts == collections.Counter(range(1, 321)), (epoch, sorted(counts.items())[:10])
    by_step = collections.defaultdict(list)
    for s in kept:
        by_step[s["epoch"], s["step"]] += s["ids"]
    assert sorted(by_step) == [(e, s) for e in range(6) for s in range(10)]
    assert all(len(ids) == 32 for ids in by_step.values())


@pytest.mark.usefixtures("horovod_installed")
def test_horovod_strategy_refuses_an_elastic_horovodrun_at_once(tmp_path):
    """Horovod's elastic mode re-forms the ring in memory, which HorovodStrategy's fixed replicas
    cannot follow: the rank refuses at once, naming Horovod's elastic API and an elastic tfpar
    launch."""
    discover = tmp_path / "discover.sh"
    discover.write_text("#!/bin/sh\necho localhost:1\n")
    discover.chmod(0o755)
    # One host: Horovod's elastic mode then needs the interface named (it compares two hosts'
    # otherwise).
    result = run_command(
        [
            "horovodrun",
            "-np",
            "1",
            "--min-np",
            "1",
            "--max-np",
            "1",
            "--host-discovery-script",
            str(discover),
            "--network-interface",
            "lo",
            sys.executable,
            "-c",
            "import tfpar; tfpar.HorovodStrategy()",
        ],
        timeout=120,
        env={"PYTHONPATH": ROOT},
    )
    assert result.returncode != 0
    assert "HorovodStrategy cannot follow a change of Horovod's ranks" in result.output, (
        result.output[-3000:]
    )
    assert "Received: an elastic horovodrun (HOROVOD_ELASTIC=1" in result.output
