"""tfpar.tune's search-space checks (pure Python)."""

import pytest

from tfpar.tune import TuneResult, check_space


def test_a_valid_space_is_normalised_to_lists():
    assert check_space({"per_replica_batch": [16, 32], "steps_per_execution": 4}) == {
        "per_replica_batch": [16, 32], "steps_per_execution": [4]}


@pytest.mark.parametrize("space, match", [
    ({}, r"non-empty dict"),
    ([1, 2], r"non-empty dict"),
    ({"batch": [16]}, r"Unknown tune axis 'batch'"),
    ({"per_replica_batch": []}, r"The tune axis 'per_replica_batch' is empty"),
    ({"steps_per_execution": [0]}, r"'steps_per_execution' takes ints >= 1. Received: steps_per_execution=\[0\]"),
    ({"bytes_per_pack": [1.5]}, r"'bytes_per_pack' takes ints >= 0"),
])
def test_bad_spaces_are_refused(space, match):
    with pytest.raises(ValueError, match=match):
        check_space(space)


def test_the_best_trial_is_the_fastest_successful_one():
    result = TuneResult((
        {"config": {"per_replica_batch": 8}, "status": "ok", "examples_per_second": 100.0},
        {"config": {"per_replica_batch": 64}, "status": "failed", "error": "Traceback\nValueError: no"},
        {"config": {"per_replica_batch": 32}, "status": "ok", "examples_per_second": 250.0},
    ))
    assert result.best["config"] == {"per_replica_batch": 32}
    assert "failed: ValueError: no" in result.table() and "fastest: {'per_replica_batch': 32}" in result.table()
