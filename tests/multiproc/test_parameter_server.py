"""ParameterServer on a local cluster: ps and worker servers as child processes on 127.0.0.1."""

import json
import math
import os
import re
import sys
import time

import pytest

from tests.conftest import (
    ROOT,
    USER_SHELL,
    docs_command,
    run_command,
    run_json_script,
    tfpar_command,
)

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")


def _servers_of(cluster):
    """The PIDs of the running ``tfpar._local.server`` processes whose TF_CONFIG names an address
    of ``cluster`` (read from /proc: nothing is sent)."""
    import psutil

    addresses = {address for group in cluster.values() for address in group}
    found = []
    for process in psutil.process_iter(["cmdline", "environ"]):
        command = " ".join(process.info["cmdline"] or [])
        config = (process.info["environ"] or {}).get("TF_CONFIG", "")
        if "tfpar._local.server" in command and any(a in config for a in addresses):
            found.append(process.pid)
    return found


def test_local_cluster_trains_places_and_shards_variables():
    report = run_json_script(os.path.join(SCRIPTS, "ps_checks.py"), timeout=300)
    assert report["steps_per_epoch"] == 16
    # The single-device run of this task reaches > 0.95 in 4 epochs; PS must land in that band.
    assert report["accuracy"][-1] > 0.9 and report["predict_accuracy"] > 0.9
    assert report["lars_accuracy"][-1] > 0.9  # tfpar.optimizers.LARS on the parameter servers
    # Warm-up from 0.01 to 4 x 0.01 over 2 epochs (32 steps), set at epoch starts under PS.
    assert report["lr"] == pytest.approx([0.01, 0.025, 0.04, 0.04], rel=1e-5)
    assert all(e > 0 for e in report["examples_per_second"])
    # model.evaluate on the workers lands where predicting the whole input on the chief does.
    # It reads `steps` batches that free workers draw from their own shuffled copies, so it
    # scores a sample of n = 512 examples, not each one once: the bound is five standard errors
    # of such a sample's mean (the loss is heavy-tailed: one badly placed example read twice
    # moves it by several times its mean). An untrained or wrongly averaged model lands far out.
    n = 512
    p = report["predict_accuracy"]
    assert abs(report["evaluate"]["accuracy"] - p) < 5 * math.sqrt(p * (1 - p) / n) + 0.01
    assert report["predict_loss_std"] > 0
    assert (
        abs(report["evaluate"]["loss"] - report["predict_loss"])
        < 5 * report["predict_loss_std"] / math.sqrt(n) + 0.01
    )
    assert (
        "Parameter-server training needs the number of steps: pass steps_per_epoch=16"
        in report["steps_error"]
    )
    assert "Received: steps=None" in report["steps_error"]
    placement = report["placement"]
    shards = placement["embedding/embeddings"]
    assert len(shards) == 2
    assert {d.split("/device")[0] for d in shards} == {
        "/job:ps/replica:0/task:0",
        "/job:ps/replica:0/task:1",
    }
    assert all("/job:ps/" in d for devices in placement.values() for d in devices)
    assert (
        "embedding/embeddings: 2 shard(s) on /job:ps/task:0, /job:ps/task:1" in report["describe"]
    )
    assert "needs a function that returns the dataset" in report["dataset_error"]
    assert (
        "BatchNormalization(synchronized=True) cannot run under parameter servers"
        in report["synchronized_batchnorm_error"]
    )
    # Keras 3's fit has no ClusterCoordinator: tfpar's input refuses it from tfpar's own code.
    assert report["keras3_error"], "Keras 3's fit under parameter servers was not refused"
    where, message = report["keras3_error"]
    assert where.endswith("/tfpar/data/_ps_input.py")
    assert "Parameter-server training in fit needs a tf_keras (Keras 2) model" in message
    assert "Build the model with tfpar.keras" in message
    # strategy.cluster_resolver: the cluster local() started (TensorFlow's PS strategy gives None).
    resolver = report["resolver"]
    assert resolver["task"] == ["chief", 0]
    assert {role: list(a) for role, a in resolver["cluster"].items()} == report["local_cluster"]
    assert len(resolver["cluster"]["ps"]) == 2 and len(resolver["cluster"]["worker"]) == 2
    assert all(
        a.startswith("127.0.0.1:") for addresses in resolver["cluster"].values() for a in addresses
    )
    # shutdown() stopped all 4 servers (2 ps, 2 workers) and closed their ports.
    assert report["shutdown"]["exited"] == {
        "ps 0": True,
        "ps 1": True,
        "worker 0": True,
        "worker 1": True,
    }
    assert report["shutdown"]["listening"] == [] and report["shutdown"]["left"] == {}
    # While it ran, every task of the cluster, the chief in this script's process included,
    # listened on loopback only (read from /proc/net/tcp*; the tests start it with tfpar's
    # loopback library, as `tfpar launch` and `tfpar demo` do).
    assert sorted(role for _, role in report["listening_while_running"]) == [
        "chief",
        "ps",
        "ps",
        "worker",
        "worker",
    ]
    assert {address for address, _ in report["listening_while_running"]} == {"127.0.0.1"}
    # The servers stop by themselves within a second of the coordinator's exit (this cluster's:
    # other tests' clusters may run beside it).
    deadline = time.monotonic() + 15
    while _servers_of(report["local_cluster"]):
        assert time.monotonic() < deadline, "the local ps/worker servers outlived their coordinator"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def ps_fault(tmp_path_factory):
    """scripts/ps_fault.py once: an undisturbed fit, a fit that loses worker 1, a fit after its
    restart."""
    log = tmp_path_factory.mktemp("ps_fault") / "worker1.log"
    result = run_command(
        [sys.executable, os.path.join(SCRIPTS, "ps_fault.py"), str(log)],
        timeout=520,
        env={"PYTHONPATH": ROOT},
    )
    assert result.returncode == 0, result.output[-4000:]
    report = json.loads(
        [line for line in result.output.splitlines() if line.startswith('{"undisturbed"')][-1]
    )
    return report, result.output, log


def test_a_worker_killed_mid_fit_has_its_steps_rescheduled(ps_fault):
    report, output, _ = ps_fault
    undisturbed, disturbed = report["undisturbed"], report["killed"]
    assert "killed worker 1" in output
    assert disturbed["alive"]["worker 1"] is False and disturbed["alive"]["worker 0"] is True
    # Every scheduled step ran (the lost worker's ones again on the survivor: at least
    # once, as TensorFlow's coordinator guarantees), so training is complete ...
    assert undisturbed["iterations"] == 4 * 32 and disturbed["iterations"] >= 4 * 32
    # ... and ends in the same loss band as the undisturbed run of the same model.
    assert disturbed["loss"][-1] < 0.05 and undisturbed["loss"][-1] < 0.05
    assert abs(disturbed["loss"][-1] - undisturbed["loss"][-1]) < 0.02


def test_a_restarted_worker_rejoins_and_runs_steps_again(ps_fault):
    report, output, log = ps_fault
    assert "restarted worker 1" in output
    assert all(report["restarted"]["alive"].values())
    # The new worker-1 process ran training steps (each prints a marker on its own stderr).
    assert report["restarted_steps"] >= 5, log.read_text()[-3000:]
    assert report["restarted"]["loss"][-1] < 0.05


def test_launch_roles_start_servers_and_stop_them_after_the_chief():
    from tests.conftest import tfpar_command

    result = run_command(
        tfpar_command(
            "launch",
            "--ps",
            "1",
            "-n",
            "2",
            "--",
            sys.executable,
            "examples/train_parameter_server.py",
            "--epochs",
            "2",
        ),
        timeout=300,
    )
    assert result.returncode == 0, result.output[-4000:]
    for line in (
        "[ps 0] tfpar server: ps 0 serving",
        "[worker 1] tfpar server: worker 1 serving",
        "[chief 0] validation accuracy after 2 epochs",
        "the chief finished; stopping the servers",
    ):
        assert line in result.output


def test_parameter_server_example_with_its_own_local_cluster():
    # As a user runs it: its 5 epochs (asynchronous steps: after 3, 0.64 to 0.94 by the machine's
    # load).
    result = run_command([sys.executable, "examples/train_parameter_server.py"], timeout=300)
    assert result.returncode == 0, result.output[-4000:]
    accuracy = float(result.output.split("validation accuracy after 5 epochs: ")[1].split()[0])
    assert accuracy > 0.9


def test_demo_on_a_local_parameter_server_cluster():
    import re

    # As the README writes it: the installed command, no --quiet. Keras allows no progress bar
    # under parameter servers, so the demo prints a line per epoch instead. Without the tests'
    # LD_PRELOAD: the demo runs itself again under tfpar's loopback library, so that its chief
    # keeps to loopback too (no warning about ports open on all interfaces).
    result = run_command(
        docs_command("tfpar demo --strategy parameter_server"),
        timeout=400,
        env={**USER_SHELL, "LD_PRELOAD": None},
    )
    assert result.returncode == 0, result.output[-3000:]
    assert "listens on all interfaces" not in result.output
    assert "ParameterServer (ParameterServerStrategy + ClusterCoordinator)" in result.output
    number = r"[0-9.]+(?:e[-+]\d+)?"  # Keras writes a small loss as 8.0283e-04
    assert (
        len(
            re.findall(
                rf"^45/45 - \d+m?s - loss: {number} - accuracy: {number} .*val_accuracy",
                result.output,
                re.MULTILINE,
            )
        )
        == 8
    ), result.output[-3000:]
    accuracy = float(re.search(r"validation accuracy: ([0-9.]+)", result.output).group(1))
    assert accuracy >= 0.95, result.output[-3000:]


def test_a_lost_ps_fails_the_chief_and_a_relaunch_resumes_from_the_backup(tmp_path):
    script = os.path.join(SCRIPTS, "ps_resume.py")
    first = run_command(
        [sys.executable, script, str(tmp_path), "--kill-ps"], timeout=300, env={"PYTHONPATH": ROOT}
    )
    tail = first.output[-6000:]
    assert first.returncode != 0, tail
    assert "Epoch 3/5" in first.output and "finished with loss" not in first.output, tail
    assert "ParameterServerLostError: Lost the parameter server ps 0 (127.0.0.1:" in first.output, (
        tail
    )
    assert "Restart that task and relaunch the job" in first.output, tail
    assert "lost tasks: ['ps 0']; an UnavailableError: True" in first.output, tail
    second = run_command(
        [sys.executable, script, str(tmp_path)], timeout=300, env={"PYTHONPATH": ROOT}
    )
    assert second.returncode == 0, second.output[-3000:]
    epochs = [line for line in second.output.splitlines() if line.startswith("Epoch ")]
    assert epochs[0] == "Epoch 3/5"  # resumed after the last completed epoch, not from epoch 1
    assert "finished with loss" in second.output


def test_a_frozen_worker_server_is_named_and_the_job_stopped():
    """The chief SIGSTOPs the worker 1 server at epoch 2: it keeps its steps, the chief waits at
    the epoch's end and stops beating; the launcher names the stopped worker, not the chief."""
    script = os.path.join(SCRIPTS, "ps_freeze.py")
    result = run_command(
        tfpar_command(
            "launch",
            "--ps",
            "1",
            "-n",
            "2",
            "--heartbeat-timeout",
            "5",
            "--",
            sys.executable,
            script,
        ),
        timeout=300,
        env={"PYTHONPATH": ROOT},
    )
    assert result.returncode == 124, result.output[-4000:]
    assert "[chief 0] FREEZING worker 1" in result.output
    line = next(
        printed for printed in result.output.splitlines() if "(--heartbeat-timeout 5)" in printed
    )
    assert line.startswith(
        "tfpar launch: worker 1 is stopped (state T: SIGSTOP or a debugger): the job's last step "
    ), line
    assert 5 <= float(re.search(r"last step ([0-9.]+) s ago", line).group(1)) < 5 + 10, line
    assert "stalled: chief 0." in line
    # its dump
    assert re.search(r"\[worker 1\] (Current thread|Thread) 0x", result.output.split(line, 1)[1])
