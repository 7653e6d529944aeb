"""The validation layer: the argument checks every config, callback and command of tfpar uses.

One convention: a value of the wrong type (a bool is not a number) raises TypeError, a value
out of range ValueError; both name the parameter, give ``Received: name=value`` and the fix.
Pure Python.
"""

import dataclasses
import math
import os

EPOCHS_VARIABLE = "TFPAR_EPOCHS"


def check_number(
    name, value, *, minimum=None, above=None, maximum=None, integer=False, allow_none=False, hint=""
):
    """Checks a number and returns it.

    Args:
        name: the parameter, as the user writes it.
        value: what was received.
        minimum / above / maximum: ``value >= minimum``, ``value > above``, ``value <= maximum``.
        integer: an int is required (else an int or a float, finite).
        allow_none: None is accepted (and returned).
        hint: a sentence appended to the message (the fix).

    Raises:
        TypeError: not an int (or float), or a bool.
        ValueError: not finite, or out of range.

    Examples:
        >>> check_number("timeout_seconds", 30, above=0)
        30
        >>> check_number("timeout_seconds", True, above=0)
        Traceback (most recent call last):
        TypeError: timeout_seconds must be a number. Received: timeout_seconds=True (bool).
    """
    if value is None and allow_none:
        return value
    kind = "an int" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, (int,) if integer else (int, float)):
        raise TypeError(
            f"{name} must be {kind}{' or None' if allow_none else ''}. Received: {name}={value!r} "
            f"({type(value).__name__}).{hint}"
        )
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number. Received: {name}={value!r}.{hint}")
    low_ok = (minimum is None or value >= minimum) and (above is None or value > above)
    if not low_ok or (maximum is not None and value > maximum):
        low = (
            f">= {minimum}" if minimum is not None else f"> {above}" if above is not None else None
        )
        if low and maximum is not None:  # the whole interval: (0, 1], [0, 5]
            opening = "[" if minimum is not None else "("
            lowest = minimum if minimum is not None else above
            rule = f"in {opening}{lowest}, {maximum}]"
        else:
            rule = low or f"<= {maximum}"
        raise ValueError(f"{name} must be {kind} {rule}. Received: {name}={value!r}.{hint}")
    return value


def whole_number(text):
    """An argparse ``type``: the int ``text`` spells, or argparse's usage error naming it."""
    import argparse

    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, received {text!r}") from None


def check_int(name, value, minimum, hint=""):
    """``check_number(name, value, minimum=minimum, integer=True)``."""
    return check_number(name, value, minimum=minimum, integer=True, hint=hint)


def check_choice(name, value, choices, what=None):
    """Raises ValueError unless ``value`` is one of ``choices``; returns it.

    Args:
        what: how the message names the value ("precision policy"); default ``name``.
    """
    try:
        known = value in choices
    except TypeError:  # unhashable (a list, a dict): not one of them
        known = False
    if not known:
        raise ValueError(
            f"Unknown {what or name} {value!r}. Received: {name}={value!r}. "
            f"Use one of {list(choices)}."
        )
    return value


def check_names(name, value):
    """A list (or tuple) of strings, as a tuple; a single string is refused (it is not a list of
    names).

    Raises:
        TypeError: a string, or not a list of strings.
    """
    if (
        isinstance(value, str)
        or not isinstance(value, (list, tuple))
        or not all(isinstance(v, str) for v in value)
    ):
        raise TypeError(
            f"{name} must be a list of names. Received: {name}={value!r}. "
            f"Write [{value!r}] for one name."
            if isinstance(value, str)
            else f"{name} must be a list of names. Received: {name}={value!r}."
        )
    return tuple(value)


def options_signature(config_class):
    """The signature ``(config=None, *, <each field of config_class>=<its default>)``: what a
    constructor taking ``(config=None, **kwargs)`` accepts, so that ``help()`` and an IDE list the
    options (set as the class's ``__signature__``)."""
    import dataclasses
    import inspect

    fields = [f for f in dataclasses.fields(config_class) if f.init]
    parameters = [
        inspect.Parameter(
            "config",
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            default=None,
            annotation=f"{config_class.__name__} | None",
        )
    ]
    for field in fields:
        default = (
            field.default
            if field.default is not dataclasses.MISSING
            else (
                field.default_factory()
                if field.default_factory is not dataclasses.MISSING
                else inspect.Parameter.empty
            )
        )
        parameters.append(
            inspect.Parameter(
                field.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=field.type
            )
        )
    return inspect.Signature(parameters)


def config_from(config_class, config, kwargs):
    """``config`` (checked to be a ``config_class``), or ``config_class(**kwargs)``; never both.

    Raises:
        TypeError: both given, a config of another type, or an option ``config_class`` does not have
            (its ``UNSUPPORTED`` may say why: option -> reason).
    """
    if config is None:
        options = [f.name for f in dataclasses.fields(config_class)]
        unknown = sorted(set(kwargs) - set(options))
        if unknown:
            why = getattr(config_class, "UNSUPPORTED", {}).get(unknown[0], "")
            raise TypeError(
                f"{config_class.__name__} has no option {unknown[0]!r}{': ' + why if why else ''}. "
                f"Received: {unknown[0]}={kwargs[unknown[0]]!r}. Its options are {options}."
            )
        return config_class(**kwargs)
    if kwargs:
        raise TypeError(
            f"Pass either a {config_class.__name__} or keyword arguments, not both. "
            f"Received: config and {sorted(kwargs)}."
        )
    if not isinstance(config, config_class):
        raise TypeError(
            f"config must be a {config_class.__name__}. Received: {type(config).__name__}."
        )
    return config


def env_int(variable, default, minimum=1, hint=""):
    """The environment variable ``variable`` as an int >= ``minimum``, or ``default`` when it is
    unset.

    Raises:
        ValueError: set, but not a whole number >= ``minimum`` (``hint`` says what to do).
    """
    text = os.environ.get(variable)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise ValueError(
            f"{variable} must be a whole number >= {minimum}. Received: {variable}={text!r}.{hint}"
        )
    return value


def default_epochs(default: int) -> int:
    """``default``, unless ``$TFPAR_EPOCHS`` is set: it shortens `tfpar demo` and every example
    at once (the README's own test sets it).

    Raises:
        ValueError: the variable is not a whole number >= 1.
    """
    return env_int(
        EPOCHS_VARIABLE, default, 1, f" Unset it to train for the default {default} epochs."
    )
