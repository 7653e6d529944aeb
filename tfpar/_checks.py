"""Argument checks shared by tfpar's configs (pure Python)."""

import os

EPOCHS_VARIABLE = "TFPAR_EPOCHS"


def check_int(name, value, minimum, hint=""):
    """Raises ValueError unless ``value`` is an int (not a bool) >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}. Received: {name}={value!r}.{hint}")


def config_from(config_class, config, kwargs):
    """``config`` (checked to be a ``config_class``), or ``config_class(**kwargs)``; never both.

    Raises:
        TypeError: both given, or a config of another type.
    """
    if config is None:
        return config_class(**kwargs)
    if kwargs:
        raise TypeError(f"Pass either a {config_class.__name__} or keyword arguments, not both. "
                        f"Received: config and {sorted(kwargs)}.")
    if not isinstance(config, config_class):
        raise TypeError(f"config must be a {config_class.__name__}. Received: {type(config).__name__}.")
    return config


def default_epochs(default):
    """``default``, unless ``$TFPAR_EPOCHS`` is set: it shortens `tfpar demo` and every example
    at once (the README's own test sets it).

    Raises:
        ValueError: the variable is not a whole number >= 1.
    """
    text = os.environ.get(EPOCHS_VARIABLE)
    if text is None:
        return default
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(f"{EPOCHS_VARIABLE} must be a whole number >= 1. Received: {EPOCHS_VARIABLE}={text!r}. "
                         f"Unset it to train for the default {default} epochs.")
    return int(text)
