"""Horovod's Keras API on tf_keras: the module `tfpar install-horovod` adds to Horovod.

The installer copies this file into the Horovod sdist as ``horovod/_tfpar_keras.py``
and points ``horovod.tensorflow.keras`` (and its callbacks) at it, instead of the
``import keras`` that Horovod 0.28.1 does: on TensorFlow >= 2.16 that is Keras 3,
whose optimizers and backend Horovod's ``DistributedOptimizer`` and callbacks were
not written for (``keras.backend.constant`` is gone, for one).

The choice: Horovod's Keras API runs on tf_keras, the Keras 2 API, and ``tf.keras``
must be the same Keras, or the user's model and Horovod's optimizer would come from
two libraries. ``tf.keras`` is resolved by TensorFlow on its first use, from
``TF_USE_LEGACY_KERAS``. So when ``import horovod.tensorflow.keras`` comes before
that first use (as in Horovod's own examples), this module sets the variable (unless
the environment already says otherwise) and a script written for Horovod runs
unchanged. When ``tf.keras`` was already resolved to Keras 3, or tf_keras is not
installed, the import fails with one line that says what to do.

The installer also makes ``horovod.tensorflow.SyncBatchNormalization`` load on first
use, so that ``import horovod.tensorflow`` no longer resolves ``tf.keras`` early.

It imports nothing of tfpar: it becomes part of Horovod.
"""

import importlib
import importlib.util
import os
import sys

import tensorflow as tf

__all__ = ["keras"]

_SET = "set TF_USE_LEGACY_KERAS=1 in the environment before Python starts"


def _select():
    try:
        import tf_keras  # noqa: F401  (only whether it is there)
    except ImportError:
        raise ImportError(
            "horovod.tensorflow.keras runs on tf_keras (the Keras 2 API), which is not installed: "
            f"pip install 'tf_keras~={tf.__version__.rsplit('.', 1)[0]}.0' and {_SET}.") from None
    loader = tf.keras  # TensorFlow's lazy loader; reading its own __dict__ resolves nothing
    imported = [module for name, module in sys.modules.items() if name.split(".")[:2] == ["tensorflow", "keras"]]
    if vars(loader).get("_tfll_initialized") is False and not imported:
        os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    legacy = os.path.dirname(importlib.util.find_spec("tf_keras").origin)
    if loader.Model.__module__.split(".")[0] != "tf_keras" or not all(
            (getattr(module, "__file__", None) or legacy).startswith(legacy + os.sep) for module in imported):
        raise ImportError(
            "horovod.tensorflow.keras runs on tf_keras (the Keras 2 API), but tf.keras is already "
            f"Keras 3 in this process: {_SET} (or import horovod.tensorflow.keras before the first "
            "use of tf.keras and of `from tensorflow.keras import ...`).")
    _route_imports_to(importlib.import_module("tf_keras.api._v2.keras"))
    return loader


def _route_imports_to(api):
    """Makes the import statement reach ``api`` too: ``from tensorflow.keras import applications``
    looks in ``sys.modules``, then in ``tensorflow.__path__``, which TensorFlow pointed at the Keras
    it picked when it was imported (Keras 3, the variable unset then), and not through ``tf.keras``."""
    sys.modules.setdefault("tensorflow.keras", api)
    spec = importlib.util.find_spec("keras")
    keras3 = os.path.dirname(spec.origin) + os.sep if spec and spec.origin else None
    first = os.path.dirname(os.path.dirname(api.__file__))  # .../tf_keras/api/_v2, holding keras/
    tf.__path__[:] = [first] + [path for path in tf.__path__
                                if path != first and not (keras3 and (path + os.sep).startswith(keras3))]


keras = _select()
