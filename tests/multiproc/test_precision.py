"""Precision and QAT across processes: one worker's overflow makes every worker skip the step;
QAT, and TFMOT's collaborative chain (pruning, PQAT, clustering, CQAT), under multi-worker
DataParallel end with the same weights, ranges, masks and centroids on every worker."""

import json
import os
import sys

import numpy as np
import pytest

from tests.conftest import ROOT, run_command, tfpar_command

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "precision_multiworker.py")


def _reports(output):
    reports = [
        json.loads(line.split("REPORT ", 1)[1]) for line in output.splitlines() if "REPORT " in line
    ]
    return sorted(reports, key=lambda r: r["worker"])


def _assert_same_arrays(first, second):
    assert len(first) == len(second)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.fixture(scope="module")
def precision_job(tmp_path_factory):
    """``run(launcher, request)``: the script's checks on 2 workers (tfpar launch) or on 2 Horovod
    ranks (horovodrun), each job once; its output and [worker 0's compression report, worker
    1's]."""
    jobs = {}

    def run(launcher, request):
        if launcher == "horovod":
            request.getfixturevalue("horovod_installed")
        if launcher not in jobs:
            out = tmp_path_factory.mktemp(f"precision_{launcher}")
            if launcher == "horovod":
                hosts = ["-np", "2", "-H", "localhost:2", "--gloo"]
                command = ["horovodrun", *hosts, sys.executable, SCRIPT, str(out), "--horovod"]
            else:
                command = tfpar_command("launch", "-n", "2", "--", sys.executable, SCRIPT, str(out))
            result = run_command(command, timeout=400, env={"PYTHONPATH": ROOT})
            jobs[launcher] = (out, result)
        out, result = jobs[launcher]  # a failed job fails each test that reads it, run once
        assert result.returncode == 0, result.output[-4000:]
        reports = [json.loads((out / f"worker_{i}.json").read_text()) for i in range(2)]
        return result.output, reports

    return run


@pytest.mark.parametrize("keras_version", ["2", "3"], ids=["tf_keras", "keras3"])
@pytest.mark.parametrize("launcher", ["data_parallel", "horovod"])
def test_an_overflow_on_one_worker_skips_the_step_everywhere(
    precision_job, launcher, keras_version, request
):
    output, _ = precision_job(launcher, request)
    reports = [r for r in _reports(output) if r["keras"] == keras_version and "zero" not in r]
    assert [r["worker"] for r in reports] == [0, 1]
    for report in reports:
        optimizer = "LossScaleOptimizer" if keras_version == "3" else "LossScaleOptimizerV3"
        assert report["optimizer"] == optimizer and report["inner"] == "SGD"
        assert report["skipped"] and report["updated"]
        assert report["loss_scale"] == [32768.0, 16384.0, 16384.0]
    # identical weights on both workers
    _assert_same_arrays(reports[0]["weights"], reports[1]["weights"])


def test_an_overflow_on_one_rank_skips_the_sharded_step_on_every_rank(precision_job, request):
    """HorovodStrategy(zero_stage=1) under mixed_float16: the loss-scale optimizer wraps the sharded
    Adam, an inf gradient on rank 0 only skips the step on both ranks, the scale halves, and the
    next step ends where the unsharded run's does (both Kerases)."""
    output, _ = precision_job("horovod", request)
    for keras_version in ("2", "3"):
        runs = {
            zero: [
                r for r in _reports(output) if r["keras"] == keras_version and r.get("zero") == zero
            ]
            for zero in (0, 1)
        }
        assert (
            [r["worker"] for r in runs[1]] == [0, 1]
            and runs[1][0]["sharded"]
            and runs[1][0]["inner"] == "Adam"
        )
        for sharded, whole in zip(runs[1], runs[0]):
            assert sharded["skipped"] and sharded["updated"] and not whole["sharded"]
            assert sharded["loss_scale"] == whole["loss_scale"] == [32768.0, 16384.0, 16384.0]
            numeric = [
                (a, b)
                for a, b in zip(whole["weights"], sharded["weights"])
                if np.asarray(a).dtype != bool
            ]
            assert (
                max(
                    float(np.abs(np.asarray(a, float) - np.asarray(b, float)).max())
                    for a, b in numeric
                )
                < 1e-6
            )
        _assert_same_arrays(runs[1][0]["weights"], runs[1][1]["weights"])


@pytest.mark.parametrize("launcher", ["data_parallel", "horovod"])
def test_qat_across_processes_ends_identical_on_both_workers(precision_job, launcher, request):
    _, reports = precision_job(launcher, request)
    assert [r["worker"] for r in reports] == [0, 1]
    assert (
        reports[0]["qat_ranges"]
        and reports[0]["qat_ranges"].keys() == reports[1]["qat_ranges"].keys()
    )
    for name in reports[0]["qat_ranges"]:
        _assert_same_arrays(reports[0]["qat_ranges"][name], reports[1]["qat_ranges"][name])
    _assert_same_arrays(reports[0]["qat_weights"], reports[1]["qat_weights"])


@pytest.mark.parametrize("launcher", ["data_parallel", "horovod"])
def test_collaborative_compression_across_processes_agrees_on_both_workers(
    precision_job, launcher, request
):
    _, reports = precision_job(launcher, request)
    assert [r["worker"] for r in reports] == [0, 1]
    for part in ("masks", "centroids", "pqat", "cqat"):
        first, second = reports[0][part], reports[1][part]
        assert first and first.keys() == second.keys(), part
        for name in first:
            np.testing.assert_array_equal(
                np.asarray(first[name]), np.asarray(second[name]), err_msg=name
            )
    masks = [np.asarray(m) for m in reports[0]["masks"].values()]
    assert len(masks) == 3 and all(0.45 <= 1 - m.mean() <= 0.55 for m in masks)  # pruned to 50 %
    assert sum("cluster_centroids" in name for name in reports[0]["centroids"]) == 3
