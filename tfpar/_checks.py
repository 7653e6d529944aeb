"""Argument checks shared by tfpar's configs (pure Python)."""


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
