"""Tensor parallelism over more devices than the test process has: T = 4, and tensor x pipeline x
data on one host (8 virtual CPU devices in a process of its own)."""

import os

from tests.conftest import run_json_script

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")


def test_tensor_4_and_the_one_host_compositions_train_exactly_like_the_plain_model():
    report = run_json_script(os.path.join(SCRIPTS, "tensor_parallel_checks.py"), timeout=600)
    layouts = ("tensor 4", "pipeline 2 x tensor 2", "data 2 x tensor 2", "data 2 x pipeline 2 x tensor 2")
    assert len(report) == 2 * (3 * 2 + 3 * 2)  # both Kerases: 3 models x 2 optimizers alone, the block in 3 layouts
    for keras_name in ("tf_keras", "keras"):
        for layout in layouts:
            assert any(run.startswith(f"{keras_name} {layout} ") for run in report), (keras_name, layout)
    for run, result in report.items():
        assert result["moved"] > 1e-2, run  # it trained
        worst = max(result["differences"].values())
        assert worst < 1e-5, (run, sorted(result["differences"].items(), key=lambda kv: -kv[1])[:3])
