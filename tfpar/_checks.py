"""Argument checks shared by tfpar's configs (pure Python)."""


def check_int(name, value, minimum, hint=""):
    """Raises ValueError unless ``value`` is an int (not a bool) >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}. Received: {name}={value!r}.{hint}")
