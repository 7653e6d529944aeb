"""`tfpar launch --timeline DIR`: one trace for every worker, a slow input named (real
processes)."""

import json
import os
import sys

import numpy as np
import pytest

from tests.conftest import ROOT, run_command, tfpar_command
from tests.conftest import trace_tracks as _tracks

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "timeline_slow_input.py")


@pytest.mark.parametrize(
    "launcher", [["-n", "2"], ["--horovod", "-n", "2"]], ids=["data_parallel", "horovod"]
)
def test_one_trace_for_the_job_with_the_slow_worker_waiting_on_its_input(
    launcher, tmp_path, request
):
    if "--horovod" in launcher:
        request.getfixturevalue("horovod_installed")
    folder = tmp_path / "run"  # made by the launcher
    result = run_command(
        tfpar_command(
            "launch", *launcher, "--timeline", str(folder), "--", sys.executable, SCRIPT, "1"
        ),
        timeout=300,
        env={"PYTHONPATH": ROOT},
    )
    assert result.returncode == 0, result.output[-4000:]
    trace = json.loads((folder / "timeline.json").read_text())
    tracks = _tracks(trace)
    steps = [tracks[w, "step"] for w in (0, 1)]
    assert len(steps[0]) == len(steps[1]) == 6
    # each worker's (rank's) one replica: its recomputed Dense once a step, inside the step
    for w in (0, 1):
        recomputed = tracks[w, "recomputed forwards"]
        assert [e["name"] for e in recomputed] == ["dense"] * 6, recomputed
        for step, e in zip(steps[w], recomputed):
            assert step["ts"] <= e["ts"] <= step["ts"] + step["dur"]
    # the workers step together: step i of one overlaps step i of the other
    for a, b in zip(*steps):
        assert a["ts"] < b["ts"] + b["dur"] and b["ts"] < a["ts"] + a["dur"]
    wait = [np.median([e["dur"] for e in tracks[w, "input wait"]]) for w in (0, 1)]
    assert wait[1] > 3 * wait[0] and wait[1] > 200_000, wait  # 16 examples x 25 ms on worker 1
    plots = run_command(tfpar_command("report", str(folder)), timeout=120)
    assert plots.returncode == 0 and f"{folder / 'throughput.png'}" in plots.output, plots.output[
        -2000:
    ]
    if "--horovod" in launcher:  # Horovod's own timeline, merged on the same clock
        processes = [
            e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"
        ]
        assert any(name.startswith("Horovod ") and "Allreduce" in name for name in processes), (
            processes
        )
        allreduce = [e["ts"] for e in trace["traceEvents"] if e.get("name") == "ALLREDUCE"]
        inside = [t for t in allreduce if any(s["ts"] <= t <= s["ts"] + s["dur"] for s in steps[0])]
        assert len(inside) >= len(steps[0]), (len(allreduce), len(inside))


def test_a_timeline_folder_that_cannot_be_made_is_refused_before_anything_starts(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run_command(
        tfpar_command(
            "launch",
            "-n",
            "2",
            "--timeline",
            str(blocker / "run"),
            "--",
            sys.executable,
            "-c",
            "print('started')",
        ),
        timeout=60,
    )
    assert result.returncode == 3 and "started" not in result.output
    assert "tfpar launch: error: --timeline cannot make" in result.output, result.output
