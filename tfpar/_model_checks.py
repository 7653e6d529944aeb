"""What tfpar checks when a Keras model (either Keras) is compiled, fit, evaluated or predicts.

Neither Keras has a public hook there. ``Model.compile``, ``fit``, ``evaluate`` and ``predict`` of
tf_keras and of Keras 3 are wrapped once by a function that runs every check registered for that
method, before and after the original, with the call's arguments. `tfpar._keras` installs them
when it is first imported: on tf_keras then, and on Keras 3 then if it is loaded, else right
after it is imported. Installing twice changes nothing, so the order of imports does not matter.
"""

import functools
import importlib.abc
import importlib.machinery
import inspect
import sys

__all__ = ["METHODS", "install", "install_loaded", "on_install", "register_after", "register_before"]

METHODS = ("compile", "fit", "evaluate", "predict")
_checks = {(method, when): [] for method in METHODS for when in ("before", "after")}
_installers = []  # on_install's functions
_installed = []  # the Keras modules install has seen


def _register(method, when, check):
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}. Received: method={method!r}.")
    if check not in _checks[method, when]:
        _checks[method, when].append(check)


def register_before(check, method="compile"):
    """``check(model, arguments)`` runs before every call of ``Model.<method>`` (it may raise to
    refuse it); ``arguments`` maps the method's parameter names to the values of this call, and
    a value the check replaces there is what the method gets."""
    _register(method, "before", check)


def register_after(check, method="compile"):
    """``check(model, arguments)`` runs after every call of ``Model.<method>``."""
    _register(method, "after", check)


def _wrap(method, original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def checked(self, *args, **kwargs):
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError:  # arguments the method does not take: Keras itself says so
            return original(self, *args, **kwargs)
        bound.apply_defaults()
        arguments = bound.arguments
        given = dict(arguments)
        for check in _checks[method, "before"]:
            check(self, arguments)
        if any(arguments[name] is not value for name, value in given.items()):
            result = original(*bound.args, **bound.kwargs)  # a check changed an argument
        else:
            result = original(self, *args, **kwargs)
        for check in _checks[method, "after"]:
            check(self, arguments)
        return result

    checked._tfpar_checks = True
    return checked


def on_install(installer):
    """``installer(module)`` runs for each Keras module (tf_keras, Keras 3) now if installed, else
    when `install` sees it: for the other hooks tfpar needs in a Keras, whichever loads first."""
    if installer not in _installers:
        _installers.append(installer)
        for module in _installed:
            installer(module)


def install(module):
    """Wraps ``module.Model``'s checked methods (tf_keras or Keras 3) once per process, and runs
    the `on_install` functions on it."""
    for method in METHODS:
        original = getattr(module.Model, method)
        if not getattr(original, "_tfpar_checks", False):
            setattr(module.Model, method, _wrap(method, original))
    if module not in _installed:
        _installed.append(module)
        for installer in _installers:
            installer(module)


class _InstallWhenKeras3Loads(importlib.abc.MetaPathFinder):
    """Installs the checks on Keras 3 right after it is imported (if tfpar was imported first)."""

    def find_spec(self, name, path, target=None):
        if name != "keras":
            return None
        sys.meta_path.remove(self)  # one import of Keras 3, then out of the way
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            install(module)

        spec.loader.exec_module = exec_module
        return spec


def install_loaded():
    """`install` for tf_keras now, and for Keras 3 now if it is loaded, else when it is."""
    from tfpar._keras import keras

    install(keras)
    if "keras" in sys.modules:
        install(sys.modules["keras"])
    elif not any(isinstance(finder, _InstallWhenKeras3Loads) for finder in sys.meta_path):
        sys.meta_path.insert(0, _InstallWhenKeras3Loads())


def _add_heartbeat(model, arguments):
    """Under ``tfpar launch --heartbeat-timeout`` (``TFPAR_HEARTBEAT_FILE`` set): adds tfpar's
    `Heartbeat` to the call's callbacks, unless one is there."""
    import os

    from tfpar._heartbeat import HEARTBEAT_VARIABLE
    from tfpar.callbacks.heartbeat import Heartbeat

    callbacks = arguments.get("callbacks")
    if not os.environ.get(HEARTBEAT_VARIABLE) or not (callbacks is None or isinstance(callbacks, (list, tuple))):
        return
    if not any(isinstance(callback, Heartbeat) for callback in callbacks or ()):
        arguments["callbacks"] = [*(callbacks or ()), Heartbeat()]


def _add_timeline(model, arguments):
    """Before ``fit``: `tfpar.callbacks.timeline.add_timeline` (the Timeline's in-step timestamps,
    and a Timeline under ``tfpar launch --timeline``)."""
    from tfpar.callbacks.timeline import add_timeline

    add_timeline(model, arguments)


def _register_the_one_keras_checks():
    from tfpar._keras import check_callbacks_keras, check_one_keras

    register_before(check_one_keras, "compile")
    for method in ("fit", "evaluate", "predict"):
        register_before(check_callbacks_keras, method)
        register_before(_add_heartbeat, method)
    register_before(_add_timeline, "fit")


_register_the_one_keras_checks()  # once, at import: every model is checked for a mix of the Kerases
