"""The one place that picks the Keras implementation: tfpar runs on ``tf_keras``.

TensorFlow 2.16+ ships Keras 3 as ``tf.keras`` unless ``TF_USE_LEGACY_KERAS=1``
is set before TensorFlow is first imported. ParameterServerStrategy in ``fit``,
tensorflow-model-optimization and Horovod all need the Keras 2 API, so
``import tfpar`` sets that variable when TensorFlow is not loaded yet (as
tensorflow-model-optimization does; the line sits in ``tfpar/__init__.py`` so
that it runs before any submodule). tfpar itself always imports ``tf_keras``,
so it keeps working on ``tf_keras`` models even when TensorFlow was imported
earlier with Keras 3. Every other module takes ``tf`` and ``keras`` from here.
"""

import tensorflow as tf
import tf_keras as keras

__all__ = ["keras", "tf", "check_tf_keras_model"]

_FIX = (
    "tfpar trains tf_keras (Keras 2) models. Build the model with "
    "`import tf_keras as keras` (or `tfpar.keras`), or set the environment "
    "variable TF_USE_LEGACY_KERAS=1 before TensorFlow is imported (importing "
    "tfpar first does that) so that `tf.keras` is tf_keras."
)


def check_tf_keras_model(model):
    """Checks that ``model`` is a tf_keras model and returns it.

    Args:
        model: the object handed to a tfpar API as a Keras model.

    Returns:
        ``model`` itself.

    Raises:
        TypeError: if ``model`` is a Keras 3 model or not a Keras model at all.
    """
    if isinstance(model, keras.Model):
        return model
    kind = f"{type(model).__module__}.{type(model).__qualname__}"
    if type(model).__module__.split(".")[0] == "keras":
        raise TypeError(f"Received a Keras 3 model ({kind}). {_FIX}")
    raise TypeError(f"Expected a tf_keras.Model, received {kind}. {_FIX}")
