"""tfpar.callbacks.FaultTolerance with real processes: kill a worker mid-epoch, relaunch, resume."""

import json
import os
import re
import sys

import numpy as np
import pytest

from tests.conftest import ROOT, run_command, tfpar_command
from tfpar.callbacks import FaultTolerance

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "fault_resume.py")


def _launch(backup, *args):
    return run_command(
        tfpar_command("launch", "-n", "2", "--", sys.executable, SCRIPT, str(backup), *args),
        timeout=300,
        env={"PYTHONPATH": ROOT},
    )


def _epochs(output):
    return [
        line.split("Epoch ")[1].split()[0] for line in output.splitlines() if "] Epoch " in line
    ]


def _losses(output):
    return json.loads(output.split("DONE ", 1)[1].splitlines()[0])["loss"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A Keras fit with no FaultTolerance, worker 1 killed in epoch 1, restarted once, watched:
    the restart trains from the first epoch, so its run is the undisturbed job the tests below
    compare their resumed runs with (one job for both claims)."""
    result = run_command(
        tfpar_command(
            "launch",
            "-n",
            "2",
            "--max-restarts",
            "1",
            "--heartbeat-timeout",
            "60",
            "--",
            sys.executable,
            SCRIPT,
            str(tmp_path_factory.mktemp("reference") / "b"),
            "--kill-at",
            "0:1:1:2",
            "--no-backup",
        ),
        timeout=400,
        env={"PYTHONPATH": ROOT},
    )
    assert result.returncode == 0, result.output[-4000:]
    assert _epochs_completed(result.output) == [1, 2, 3, 4, 5], result.output[-4000:]
    return result


def test_a_killed_worker_and_a_relaunch_resume_after_the_last_backed_up_epoch(tmp_path, reference):

    first = _launch(tmp_path / "backup", "--kill")
    # worker 1's SIGKILL, as a shell reports it
    assert first.returncode == 128 + 9, first.output[-3000:]
    # the dead worker, by name
    assert "tfpar launch: error: worker 1 was killed by SIGKILL" in first.output
    assert _epochs(first.output) == ["1/5", "2/5", "3/5"] and "DONE" not in first.output
    # Only the chief's backup is there, of epoch 2 (worker 1's own copies were temporary), with the
    # input's layout the chief recorded beside it (where the next run continues: epoch 3, step 1).
    backup = tmp_path / "backup"
    assert sorted(str(p.relative_to(backup)) for p in backup.rglob("*")) == [
        "chief",
        "chief/checkpoint",
        "chief/ckpt-2.data-00000-of-00001",
        "chief/ckpt-2.index",
        "tfpar_input.json",
    ]
    assert {
        k: v
        for k, v in json.loads((backup / "tfpar_input.json").read_text()).items()
        if k in ("epoch", "step", "num_workers")
    } == {"epoch": 2, "step": 0, "num_workers": 2}

    second = _launch(tmp_path / "backup")
    assert second.returncode == 0, second.output[-4000:]
    assert "tfpar: resumed from the backup" in second.output and "at epoch 3" in second.output
    # Epochs 1-2 are not done again: only the interrupted epoch 3 is, then 4 and 5.
    assert _epochs(second.output) == ["3/5", "4/5", "5/5"]
    # The backup holds the weights and the optimizer (its momentum) after epoch 2; the input has no
    # shuffle and SGD no randomness, so epochs 3-5 repeat those of the reference's run from the
    # first epoch (an uninterrupted run) to float rounding.
    resumed, uninterrupted = _losses(second.output), _losses(reference.output)
    assert len(resumed) == 3
    np.testing.assert_allclose(resumed, uninterrupted[2:], rtol=1e-5)
    assert not os.listdir(tmp_path / "backup") or all(
        n.startswith(".") for n in os.listdir(tmp_path / "backup")
    )


def test_an_unwritable_backup_directory_fails_at_once(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(
        ValueError, match=r"cannot be written .* Received: backup_dir=.*file/backup"
    ):
        FaultTolerance(str(blocker / "backup"))


def _epochs_completed(output):
    return [
        int(line.split("EPOCH_COMPLETE ")[1].split()[0])
        for line in output.splitlines()
        if "EPOCH_COMPLETE " in line
    ]


def test_max_restarts_relaunches_the_job_and_training_resumes_where_it_stopped(tmp_path, reference):
    """Worker 1 dies at step 4 of epoch 2, then (after the restart) worker 0 at step 2 of epoch 4:
    the launcher restarts the whole job twice on fresh ports; each run resumes after the last
    completed epoch, so no epoch completes twice, and the job ends like an undisturbed run. The
    job shards its parameters and their momentum (ZeRO stage 3): each run resumes the pieces from
    the chief's backup, which holds them whole, and nothing is lost."""
    # The reference was watched: at the end of its last run the launcher reports each task's mean
    # step time.
    steps = re.search(
        r"tfpar launch: mean step time per task \(÷ the median\): worker 0 ([0-9.]+) ms "
        r"\(([0-9.]+)x\), "
        r"worker 1 ([0-9.]+) ms \(([0-9.]+)x\)",
        reference.output,
    )
    assert steps and float(steps.group(1)) > 0 and float(steps.group(3)) > 0, reference.output[
        -2000:
    ]
    # two: the median is the mean
    assert float(steps.group(2)) + float(steps.group(4)) == pytest.approx(2.0, abs=0.02)
    result = run_command(
        tfpar_command(
            "launch",
            "-n",
            "2",
            "--max-restarts",
            "3",
            "--",
            sys.executable,
            SCRIPT,
            str(tmp_path / "backup"),
            "--kill-at",
            "0:1:2:3",
            "--kill-at",
            "1:0:4:1",
            "--zero-stage",
            "3",
        ),
        timeout=400,
        env={"PYTHONPATH": ROOT},
    )
    assert result.returncode == 0, result.output[-4000:]
    restarts = [
        line for line in result.output.splitlines() if line.startswith("tfpar launch: restart ")
    ]
    assert len(restarts) == 2, result.output[-4000:]
    assert re.match(
        r"tfpar launch: restart 1 of 3 at [0-9.]+ s: worker 1 was killed by SIGKILL; starting the "
        r"2 "
        r"task\(s\) again on fresh ports",
        restarts[0],
    )
    assert re.match(
        r"tfpar launch: restart 2 of 3 at [0-9.]+ s: worker 0 was killed by SIGKILL", restarts[1]
    )
    assert "warning: the command made no tfpar.callbacks.FaultTolerance backup" not in result.output
    # each epoch completed once, in order
    assert _epochs_completed(result.output) == [1, 2, 3, 4, 5]
    assert "at epoch 2" in result.output and "at epoch 4" in result.output  # where each run resumed
    np.testing.assert_allclose(_losses(result.output), _losses(reference.output)[3:], rtol=1e-4)
    # each worker held half of each parameter and of its momentum (161 float32 parameters; the
    # one-value bias's piece rounds up)
    held = "weights 644 B -> 324 B, gradients 644 B -> 324 B, optimizer state 644 B -> 324 B"
    assert held in result.output, result.output[-3000:]


def test_a_restart_without_a_backup_warns_and_trains_from_the_first_epoch(reference):
    """The reference job: the restart warns that training starts over, and it does. (Giving up
    after the last restart: tests/unit/test_launch.py.)"""
    assert "restart 1 of 1" in reference.output, reference.output[-3000:]
    assert (
        "warning: the command made no tfpar.callbacks.FaultTolerance backup, so training starts "
        "over" in reference.output
    )
    # The killed run completed no epoch: the five are the restart's, from the first.
    assert "] Epoch 1/5" in reference.output.split("restart 1 of 1", 1)[1]


@pytest.mark.parametrize("strategy", ["data_parallel", "horovod"])
def test_a_frozen_worker_is_named_its_stack_dumped_and_the_job_stopped(tmp_path, strategy):
    """Worker (rank) 1 SIGSTOPs itself at step 4 of epoch 2; its peer waits for it in the
    all-reduce. With --heartbeat-timeout 5 the launcher names it within the timeout plus a few
    seconds, dumps its stack and stops the job (code 124), long before any collective timeout."""
    if strategy == "horovod":
        from tests.conftest import HOROVOD_INSTALLED

        if not HOROVOD_INSTALLED and not os.environ.get("CI"):
            pytest.skip("Horovod is not installed (install it: tfpar install-horovod)")
        launcher, name, extra = ["--horovod"], "rank 1", ["--horovod"]
    else:
        launcher, name, extra = [], "worker 1", []
    result = run_command(
        tfpar_command(
            "launch",
            *launcher,
            "-n",
            "2",
            "--heartbeat-timeout",
            "5",
            "--",
            sys.executable,
            SCRIPT,
            str(tmp_path / "b"),
            "--freeze-at",
            "0:1:2:3",
            *extra,
        ),
        timeout=300,
        env={"PYTHONPATH": ROOT},
    )
    assert result.returncode == 124, result.output[-4000:]
    assert "FREEZING" in result.output
    line = next(
        printed for printed in result.output.splitlines() if "(--heartbeat-timeout 5)" in printed
    )
    assert line.startswith(
        f"tfpar launch: {name} is stopped (state T: SIGSTOP or a debugger): its last step "
    ), line
    # about when it froze
    waited = float(re.search(r"its last step ([0-9.]+) s ago", line).group(1))
    # the timeout, plus the poll and the last beat's age (on a loaded machine)
    assert 5 <= waited < 5 + 10, line
    assert f"tfpar launch: error: {name} hung: it is stopped" in result.output
    # faulthandler's dump of the frozen task's Python stacks (let run again to write them, it has
    # left the frame where it froze, or not, by then).
    after = result.output.split(line, 1)[1]
    assert re.search(r"(Current thread|Thread) 0x", after), after[-3000:]
    assert re.search(r'File ".*fault_resume.py", line \d+ in ', after), after[-3000:]
