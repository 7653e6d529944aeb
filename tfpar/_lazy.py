"""Packages whose names load on first use: ``tfpar``, ``tfpar.data``, ``tfpar.strategies``, and
``tfpar.pipeline`` keep TensorFlow out of ``import tfpar`` and of the pure modules."""

import importlib
import sys

__all__ = ["exports"]


def exports(package, names):
    """The ``__getattr__``, ``__dir__`` and ``__all__`` of a lazy package.

    Args:
        package: the package's ``__name__``.
        names: exported name -> the module that defines it (a full module name), or None for a
            submodule of the package exported under its own name.
    """

    def __getattr__(name):
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if names[name] is None:
            return importlib.import_module(f"{package}.{name}")
        return getattr(importlib.import_module(names[name]), name)

    def __dir__():
        return sorted({*vars(sys.modules[package]), *names})

    return __getattr__, __dir__, sorted(names)
