"""ZeRO over 3 replicas, more devices than the test process has
(tests/multiproc/scripts/zero_checks.py)."""

import os

from tests.conftest import run_json_script


def test_three_replicas_shard_the_optimizer_state_train_like_one_device_and_reshard_checkpoints():
    report = run_json_script(
        os.path.join(os.path.dirname(__file__), "scripts", "zero_checks.py"), timeout=600
    )
    # SGD (Nesterov), Adam (global-norm clipping), AdamW (exclusions); 2 resumes
    assert len(report) == 3 + 2
    for run, result in report.items():
        if " resume " in run:
            assert result["difference"] < 1e-6, (run, result)  # the checkpoint's state resharded
            continue
        assert result["difference"] < 1e-6, (run, result)
        # 58 parameters: 20, 20 and 18 + 2 padding
        assert (result["total"], result["chunk"]) == (58, 20), run
        assert result["slot_devices"] == ["CPU:0", "CPU:1", "CPU:2"], run
