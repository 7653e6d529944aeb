"""ParameterServer on a local cluster: ps and worker servers as child processes on 127.0.0.1."""

import json
import os
import sys
import time

from tests.conftest import ROOT, run_command

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")


def test_local_cluster_trains_places_and_shards_variables():
    result = run_command([sys.executable, os.path.join(SCRIPTS, "ps_checks.py")], timeout=300,
                         env={"PYTHONPATH": ROOT})
    assert result.returncode == 0, result.output[-4000:]
    report = json.loads([l for l in result.output.splitlines() if l.startswith("{")][-1])
    assert report["steps_per_epoch"] == 16
    # The single-device run of this task reaches > 0.95 in 4 epochs; PS must land in that band.
    assert report["accuracy"][-1] > 0.9 and report["predict_accuracy"] > 0.9
    placement = report["placement"]
    shards = placement["embedding/embeddings"]
    assert len(shards) == 2
    assert {d.split("/device")[0] for d in shards} == {"/job:ps/replica:0/task:0", "/job:ps/replica:0/task:1"}
    assert all("/job:ps/" in d for devices in placement.values() for d in devices)
    assert "embedding/embeddings: 2 shard(s) on /job:ps/task:0, /job:ps/task:1" in report["describe"]
    assert "needs a function that returns the dataset" in report["dataset_error"]
    # The servers stop by themselves within a second of the coordinator's exit.
    deadline = time.monotonic() + 15
    while "tfpar._server" in run_command(["ps", "ax"], timeout=30).output:
        assert time.monotonic() < deadline, "the local ps/worker servers outlived their coordinator"
        time.sleep(0.5)
