"""Kubernetes without Kubernetes: the TF_CONFIG the Kubeflow training operator gives each pod of a
TFJob (chief, worker, ps, evaluator), set on local processes on 127.0.0.1; and the manifests."""

import json
import os
import signal
import subprocess
import sys

import pytest
import yaml

from tests.conftest import ROOT
from tests.models import assert_trained_together_like_one_device
from tfpar.cluster import local_cluster

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")


def _pods(roles, argv):
    """Starts one process per task of ``roles`` ({"chief": 1, ...}), each with the TF_CONFIG a TFJob
    pod of that replica type gets; returns {"chief 0": Popen, ...}."""
    cluster = local_cluster(roles)
    pods = {}
    for role, addresses in cluster.items():
        for index in range(len(addresses)):
            tf_config = json.dumps({"cluster": cluster, "task": {"type": role, "index": index}})
            pods[f"{role} {index}"] = subprocess.Popen(
                argv,
                cwd=ROOT,
                env={**os.environ, "TF_CONFIG": tf_config, "PYTHONPATH": ROOT},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
    return pods


def _stop(pods):
    for pod in pods.values():
        if pod.poll() is None:
            os.killpg(pod.pid, signal.SIGKILL)
            pod.wait()


def _output(pod):
    return pod.stdout.read().decode(errors="replace")


def test_a_chief_and_a_worker_train_under_data_parallel_like_one_device(tmp_path):
    """TFJob Chief 1 + Worker 1: the chief is worker 0 of the collective, the worker is worker 1."""
    pods = _pods(
        {"chief": 1, "worker": 1},
        [
            sys.executable,
            os.path.join(SCRIPTS, "multiworker_train.py"),
            str(tmp_path),
            "16",
            "2",
            "padded:90:2",
        ],
    )
    try:
        codes = {name: pod.wait(timeout=300) for name, pod in pods.items()}
        outputs = {name: _output(pod) for name, pod in pods.items()}
    finally:
        _stop(pods)
    for name, code in codes.items():
        assert code == 0, outputs[name][-4000:]
    assert "2 (this is chief 0, chief)" in outputs["chief 0"]
    assert "2 (this is worker 0, not chief)" in outputs["worker 0"]
    assert_trained_together_like_one_device(tmp_path / "padded", 90)


def test_one_script_in_every_pod_of_a_parameter_server_tfjob():
    """Chief + Worker 2 + PS 1 + Evaluator 1, all running one script: ps and workers serve, the
    chief trains, the evaluator is refused with the way to evaluate; the serving pods run until
    the job stops them (the operator does once the chief succeeds)."""
    pods = _pods(
        {"chief": 1, "worker": 2, "ps": 1, "evaluator": 1},
        [sys.executable, os.path.join(SCRIPTS, "ps_tfjob.py")],
    )
    try:
        chief = pods["chief 0"].wait(timeout=300)
        evaluator = pods["evaluator 0"].wait(timeout=120)
        serving = {name: pods[name].poll() for name in ("worker 0", "worker 1", "ps 0")}
    finally:
        _stop(pods)
    outputs = {name: _output(pod) for name, pod in pods.items()}
    assert chief == 0, outputs["chief 0"][-4000:]
    losses = [
        float(v) for v in outputs["chief 0"].split("chief finished: loss ")[1].split()[::2][:2]
    ]
    assert losses[1] < losses[0]
    assert serving == {"worker 0": None, "worker 1": None, "ps 0": None}  # still serving
    for name in ("worker 0", "worker 1", "ps 0"):
        assert f"tfpar server: {name} serving at 127.0.0.1:" in outputs[name], outputs[name][-2000:]
        assert "chief finished" not in outputs[name]
    assert evaluator != 0
    assert (
        "ValueError: ParameterServer trains on the chief and workers; an evaluator task only "
        "evaluates" in outputs["evaluator 0"]
    ), outputs["evaluator 0"][-2000:]
    assert "keras.utils.SidecarEvaluator" in outputs["evaluator 0"]


@pytest.mark.parametrize(
    "manifest, replicas",
    [
        ("tfjob-data-parallel.yaml", {"Chief": 1, "Worker": 2}),
        ("tfjob-parameter-server.yaml", {"Chief": 1, "Worker": 2, "PS": 1}),
    ],
)
def test_the_tfjob_manifests_parse_and_name_the_replica_types(manifest, replicas):
    with open(os.path.join(ROOT, "examples", "kubernetes", manifest)) as f:
        job = yaml.safe_load(f)
    assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "TFJob"
    specs = job["spec"]["tfReplicaSpecs"]
    assert {kind: spec["replicas"] for kind, spec in specs.items()} == replicas
    for spec in specs.values():
        (container,) = spec["template"]["spec"]["containers"]
        assert container["name"] == "tensorflow"  # the operator sets TF_CONFIG in this container
        assert container["image"] == "REGISTRY/tfpar-train:TAG"  # the placeholder to replace
        script = container["command"][1]
        assert container["command"][0] == "python" and os.path.exists(os.path.join(ROOT, script)), (
            script
        )
