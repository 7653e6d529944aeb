"""tfpar._checks: the argument checks every config shares."""

import dataclasses

import pytest

from tfpar._checks import check_choice, check_int, check_names, check_number, config_from


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Config:
    size: int = 1


def test_config_from_takes_a_config_or_keywords_never_both():
    assert config_from(_Config, None, {"size": 3}) == _Config(size=3)
    given = _Config(size=2)
    assert config_from(_Config, given, {}) is given
    with pytest.raises(
        TypeError,
        match=r"Pass either a _Config or keyword arguments, not both. Received: config and "
        r"\['size'\]",
    ):
        config_from(_Config, given, {"size": 3})
    with pytest.raises(TypeError, match=r"config must be a _Config. Received: dict"):
        config_from(_Config, {"size": 3}, {})


def test_check_int_refuses_bools_and_floats_by_type_and_small_values_by_value():
    assert check_int("n", 3, 1) == 3
    for value in (True, 2.0, "3"):
        with pytest.raises(TypeError, match=r"n must be an int. Received: n="):
            check_int("n", value, 1)
    with pytest.raises(ValueError, match=r"n must be an int >= 1. Received: n=0"):
        check_int("n", 0, 1)


@pytest.mark.parametrize(
    "kwargs, value, error, match",
    [
        (dict(above=0), 0, ValueError, r"t must be a number > 0. Received: t=0"),
        (dict(above=0), True, TypeError, r"t must be a number. Received: t=True \(bool\)"),
        (dict(above=0), float("inf"), ValueError, r"t must be a finite number. Received: t=inf"),
        (dict(above=0), float("nan"), ValueError, r"t must be a finite number. Received: t=nan"),
        (
            dict(above=0, maximum=1),
            1.5,
            ValueError,
            r"t must be a number in \(0, 1\]. Received: t=1.5",
        ),
        (
            dict(minimum=0, maximum=5),
            -1,
            ValueError,
            r"t must be a number in \[0, 5\]. Received: t=-1",
        ),
        (dict(maximum=5), 6, ValueError, r"t must be a number <= 5. Received: t=6"),
        (
            dict(minimum=0, hint=" Use 0 for none."),
            -1,
            ValueError,
            r"t must be a number >= 0. Received: t=-1. Use 0",
        ),
        (dict(above=0), None, TypeError, r"t must be a number. Received: t=None"),
        (
            dict(above=0, allow_none=True),
            "5",
            TypeError,
            r"t must be a number or None. Received: t='5' \(str\)",
        ),
    ],
)
def test_check_number(kwargs, value, error, match):
    with pytest.raises(error, match=match):
        check_number("t", value, **kwargs)


def test_check_number_returns_what_passes():
    assert check_number("t", 0.5, above=0, maximum=1) == 0.5
    assert check_number("t", None, above=0, allow_none=True) is None


def test_check_choice_and_names():
    assert check_choice("mode", "a", ("a", "b")) == "a"
    with pytest.raises(
        ValueError, match=r"Unknown policy 'c'. Received: mode='c'. Use one of \['a', 'b'\]"
    ):
        check_choice("mode", "c", ("a", "b"), what="policy")
    assert check_names("keys", ["x", "y"]) == ("x", "y")
    with pytest.raises(
        TypeError, match=r"keys must be a list of names. Received: keys='loss'. Write \['loss'\]"
    ):
        check_names("keys", "loss")
    with pytest.raises(TypeError, match=r"keys must be a list of names. Received: keys=\[1\]"):
        check_names("keys", [1])


def test_env_int(monkeypatch):
    from tfpar._checks import env_int

    monkeypatch.delenv("TFPAR_TEST_INT", raising=False)
    assert env_int("TFPAR_TEST_INT", 7) == 7
    monkeypatch.setenv("TFPAR_TEST_INT", "3")
    assert env_int("TFPAR_TEST_INT", 7) == 3
    for text in ("two", "0", "1.5", ""):
        monkeypatch.setenv("TFPAR_TEST_INT", text)
        with pytest.raises(
            ValueError,
            match=rf"TFPAR_TEST_INT must be a whole number >= 1. Received: "
            rf"TFPAR_TEST_INT={text!r}. Unset it",
        ):
            env_int("TFPAR_TEST_INT", 7, hint=" Unset it.")
