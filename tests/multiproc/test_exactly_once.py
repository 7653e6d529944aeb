"""Exactly once across a mid-epoch resume: the job of tests/multiproc/scripts/exactly_once.py,
killed at step 6 of epoch 2 with a backup every 5 steps, under tfpar launch --max-restarts 1 (both
Kerases) and under horovodrun run again as a scheduler would. Every epoch's example ids, counted
from what the replicas trained on, are each there exactly once."""

import collections
import json
import os
import re
import sys

import pytest

from tests.conftest import ROOT, run_command, tfpar_command

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "exactly_once.py")
EXAMPLES, EPOCHS = 320, 4


def trained_per_epoch(records, resumed_at):
    """epoch -> Counter of the ids the replicas trained on: the killed attempt's steps from the
    resume point on do not count (the backup rolled them back), the resumed attempt's all do."""
    counts = collections.defaultdict(collections.Counter)
    for path in sorted(records.iterdir()):
        attempt = int(re.match(r"attempt(\d+)-", path.name).group(1))
        for line in path.read_text().splitlines():
            step = json.loads(line)
            if attempt == 0 and (step["epoch"], step["step"]) >= resumed_at:
                continue
            counts[step["epoch"]].update(step["ids"])
    return counts


def assert_exactly_once(records, output):
    where = re.search(r"tfpar: resumed from the backup in \S+ at epoch (\d+), step (\d+)", output)
    assert where, output[-3000:]
    resumed_at = (int(where.group(1)) - 1, int(where.group(2)) - 1)
    assert resumed_at == (1, 5)  # the backup after step 5 of epoch 2 (save_freq=5, 10 steps an epoch)
    counts = trained_per_epoch(records, resumed_at)
    assert sorted(counts) == list(range(EPOCHS))
    for epoch, seen in counts.items():
        twice = sum(1 for n in seen.values() if n > 1)
        never = EXAMPLES - len(seen)
        assert (twice, never) == (0, 0), f"epoch {epoch + 1}: {twice} examples trained twice, {never} never"
        assert set(seen) == set(range(1, EXAMPLES + 1))


@pytest.mark.parametrize("keras_version", ["2", "3"])
def test_a_mid_epoch_resume_trains_every_example_exactly_once(tmp_path, keras_version):
    records = tmp_path / "records"
    records.mkdir()
    result = run_command(tfpar_command("launch", "-n", "2", "--max-restarts", "1", "--", sys.executable, SCRIPT,
                                       str(tmp_path / "backup"), str(records)),
                         timeout=300, env={"PYTHONPATH": ROOT, "TFPAR_TEST_KERAS": keras_version})
    assert result.returncode == 0, result.output[-4000:]
    assert "tfpar launch: restart 1 of 1" in result.output and "worker 1 was killed by SIGKILL" in result.output
    assert "DONE" in result.output
    assert_exactly_once(records, result.output)


def test_a_mid_epoch_resume_under_horovodrun_trains_every_example_exactly_once(tmp_path, horovod_installed):
    records = tmp_path / "records"
    records.mkdir()
    outputs = []
    for attempt in (0, 1):  # the scheduler starts the job again after the failure
        result = run_command(["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, SCRIPT,
                              str(tmp_path / "backup"), str(records), "--horovod", "--attempt", str(attempt)],
                             timeout=300, env={"PYTHONPATH": ROOT})
        outputs.append(result.output)
        assert (result.returncode != 0) == (attempt == 0), result.output[-4000:]
    assert "DONE" in outputs[1]
    assert_exactly_once(records, outputs[1])
