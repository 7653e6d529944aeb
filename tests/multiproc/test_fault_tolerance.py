"""tfpar.callbacks.FaultTolerance with real processes: kill a worker mid-epoch, relaunch, resume."""

import json
import os
import sys

import numpy as np
import pytest

from tests.conftest import ROOT, run_command, tfpar_command
from tfpar.callbacks import FaultTolerance

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "fault_resume.py")


def _launch(backup, *args):
    return run_command(tfpar_command("launch", "-n", "2", "--", sys.executable, SCRIPT, str(backup), *args),
                       timeout=300, env={"PYTHONPATH": ROOT})


def _epochs(output):
    return [line.split("Epoch ")[1].split()[0] for line in output.splitlines() if "] Epoch " in line]


def _losses(output):
    return json.loads(output.split("DONE ", 1)[1].splitlines()[0])["loss"]


def test_a_killed_worker_and_a_relaunch_resume_after_the_last_backed_up_epoch(tmp_path):
    reference = _launch(tmp_path / "reference")
    assert reference.returncode == 0, reference.output[-4000:]
    assert _epochs(reference.output) == ["1/5", "2/5", "3/5", "4/5", "5/5"]

    first = _launch(tmp_path / "backup", "--kill")
    assert first.returncode == 128 + 9, first.output[-3000:]  # worker 1's SIGKILL, as a shell reports it
    assert "tfpar launch: error: worker 1 was killed by SIGKILL" in first.output  # the dead worker, by name
    assert _epochs(first.output) == ["1/5", "2/5", "3/5"] and "DONE" not in first.output
    # Only the chief's backup is there, of epoch 2 (worker 1's own copies were temporary).
    backup = tmp_path / "backup"
    assert sorted(str(p.relative_to(backup)) for p in backup.rglob("*")) == [
        "chief", "chief/checkpoint", "chief/ckpt-2.data-00000-of-00001", "chief/ckpt-2.index"]

    second = _launch(tmp_path / "backup")
    assert second.returncode == 0, second.output[-4000:]
    assert "tfpar: resumed from the backup" in second.output and "at epoch 3" in second.output
    # Epochs 1-2 are not done again: only the interrupted epoch 3 is, then 4 and 5.
    assert _epochs(second.output) == ["3/5", "4/5", "5/5"]
    # The backup holds the weights and the optimizer after epoch 2; the input has no shuffle and
    # SGD no randomness, so epochs 3-5 repeat the uninterrupted run's to float rounding.
    resumed, uninterrupted = _losses(second.output), _losses(reference.output)
    assert len(resumed) == 3
    np.testing.assert_allclose(resumed, uninterrupted[2:], rtol=1e-5)
    assert not os.listdir(tmp_path / "backup") or all(n.startswith(".") for n in os.listdir(tmp_path / "backup"))


def test_an_unwritable_backup_directory_fails_at_once(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ValueError, match=r"cannot be written .* Received: backup_dir=.*file/backup"):
        FaultTolerance(str(blocker / "backup"))
