"""What tfpar checks when a Keras model (either Keras) is compiled: one registration per Keras.

Neither Keras has a public hook at ``compile``. ``Model.compile`` of tf_keras (at import) and of
Keras 3 (when it is loaded: at import if it already is, else at a tfpar strategy's creation or
``precision.use``) is wrapped once by a function that runs every registered check before and
after the original. Installing twice changes nothing, so the order of calls does not matter.
"""

import functools
import sys

__all__ = ["install", "install_loaded", "register_after", "register_before"]

_before, _after = [], []


def register_before(check):
    """``check(model)`` runs before every compile (it may raise to refuse it)."""
    if check not in _before:
        _before.append(check)


def register_after(check):
    """``check(model)`` runs after every compile."""
    if check not in _after:
        _after.append(check)


def install(module):
    """Wraps ``module.Model.compile`` (tf_keras or Keras 3) once per process."""
    original = module.Model.compile
    if getattr(original, "_tfpar_compile_checks", False):
        return

    @functools.wraps(original)
    def compile(self, *args, **kwargs):
        for check in _before:
            check(self)
        result = original(self, *args, **kwargs)
        for check in _after:
            check(self)
        return result

    compile._tfpar_compile_checks = True
    module.Model.compile = compile


def install_loaded():
    """`install` for tf_keras, and for Keras 3 where it is loaded."""
    from tfpar._keras import keras, keras3

    install(keras)
    if "keras" in sys.modules:
        install(keras3())
