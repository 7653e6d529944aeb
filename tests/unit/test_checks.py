"""tfpar._checks: the argument checks every config shares."""

import dataclasses

import pytest

from tfpar._checks import check_int, config_from


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Config:
    size: int = 1


def test_config_from_takes_a_config_or_keywords_never_both():
    assert config_from(_Config, None, {"size": 3}) == _Config(size=3)
    given = _Config(size=2)
    assert config_from(_Config, given, {}) is given
    with pytest.raises(TypeError, match=r"Pass either a _Config or keyword arguments, not both. Received: config and \['size'\]"):
        config_from(_Config, given, {"size": 3})
    with pytest.raises(TypeError, match=r"config must be a _Config. Received: dict"):
        config_from(_Config, {"size": 3}, {})


def test_check_int_refuses_bools_floats_and_small_values():
    check_int("n", 3, 1)
    for value in (True, 2.0, 0):
        with pytest.raises(ValueError, match=r"n must be an int >= 1. Received: n="):
            check_int("n", value, 1)
