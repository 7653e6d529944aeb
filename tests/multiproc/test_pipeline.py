"""Pipelines that need more devices than the test process has: 3 stages, 2 x 2 hybrid; the demo."""

import os
import re

import pytest

from tests.conftest import USER_SHELL, docs_command, run_command, run_json_script

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")


def test_three_stages_and_the_hybrid_train_exactly_like_the_plain_model():
    report = run_json_script(os.path.join(SCRIPTS, "pipeline_checks.py"), timeout=400)
    assert len(report) == 10
    for name, run in report.items():
        if name == "plain":
            continue
        assert run["max_difference"] < 1e-5, (name, run)
        assert run["loss"] == pytest.approx(report["plain"], rel=1e-5), name
        # Variables live on the stage devices (replica 0's for the hybrid).
        assert run["variable_devices"] == (
            ["CPU:0", "CPU:1", "CPU:2"] if name.startswith("3") else ["CPU:0", "CPU:1"]
        )


@pytest.mark.parametrize(
    "extra, header",
    [
        ((), "Pipeline (1f1b: 2 stages x 8 microbatches)"),
        (
            ("--replicas", "2", "--keras", "3"),
            "Pipeline (1f1b: 2 stages x 8 microbatches x 2 replicas)",
        ),
    ],
    ids=["tf_keras", "keras3-2-replicas"],
)
def test_demo_on_a_pipeline(extra, header, tmp_path):
    folder = tmp_path / "report"
    # as the CLI reference writes it, from a user's shell, with its timeline and plots
    command = docs_command("tfpar demo --strategy pipeline")
    result = run_command([*command, *extra, "--report", str(folder)], timeout=400, env=USER_SHELL)
    assert result.returncode == 0, result.output[-3000:]
    assert f"timeline: {folder / 'timeline.json'}" in result.output
    assert (
        f"plot:     {folder / 'pipeline.png'}" in result.output
        and (folder / "pipeline.png").exists()
    )
    assert header in result.output and "pipeline partition (2 stages" in result.output
    assert re.search(r"bubble: measured [0-9.]+ \(theory 0.111\)", result.output), result.output[
        -2000:
    ]
    accuracy = float(re.search(r"validation accuracy: ([0-9.]+)", result.output).group(1))
    assert accuracy >= 0.95, result.output[-3000:]
