"""Callbacks where workers matter, under `tfpar launch -n 2`: averaging, throughput, the NaN
guard."""

import json
import os
import sys

from tests.conftest import ROOT, run_command, tfpar_command

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "callbacks_multiworker.py")


def test_metric_average_throughput_and_nan_guard_on_two_workers():
    result = run_command(
        tfpar_command("launch", "-n", "2", "--", sys.executable, SCRIPT),
        timeout=300,
        env={"PYTHONPATH": ROOT},
    )
    assert result.returncode == 0, result.output[-4000:]
    reports = sorted(
        (
            json.loads(line.split("REPORT ", 1)[1])
            for line in result.output.splitlines()
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
