"""The one seam between tfpar and the two Kerases: ``tf_keras`` (Keras 2) and Keras 3.

tfpar's own code builds on ``tf_keras`` (`keras` here); a user's model may be either. Code
that handles a user's model asks this module which Keras it belongs to (`keras_of`) and
takes that Keras' classes from it, instead of branching on versions itself.

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

__all__ = ["keras", "tf", "check_keras_model", "check_tf_keras_model", "is_keras3", "keras3", "keras_of"]

_FIX = (
    "tfpar trains tf_keras (Keras 2) models. Build the model with "
    "`import tf_keras as keras` (or `tfpar.keras`), or set the environment "
    "variable TF_USE_LEGACY_KERAS=1 before TensorFlow is imported (importing "
    "tfpar first does that) so that `tf.keras` is tf_keras."
)


def keras3():
    """The Keras 3 package (imported on first use)."""
    import keras as keras_3

    return keras_3


def is_keras3(obj):
    """Whether ``obj`` (a model, layer, optimizer, callback...) belongs to Keras 3."""
    return type(obj).__module__.split(".")[0] == "keras"


def keras_of(obj):
    """The Keras module ``obj`` belongs to: ``tf_keras``, or Keras 3."""
    return keras3() if is_keras3(obj) else keras


def check_keras_model(model, name="model"):
    """Checks that ``model`` is a Keras model, of either Keras, and returns it.

    Raises:
        TypeError: anything else.
    """
    if isinstance(model, keras.Model) or (is_keras3(model) and isinstance(model, keras3().Model)):
        return model
    raise TypeError(f"{name} must be a Keras model (Keras 3, or tf_keras: tfpar.keras). Received: "
                    f"{name}={type(model).__module__}.{type(model).__qualname__}.")


def check_tf_keras_model(model, feature=None, why=None):
    """Checks that ``model`` is a tf_keras model and returns it.

    Args:
        model: the object handed to a tfpar API as a Keras model.
        feature: what needs tf_keras (named in the message), e.g. "Quantization-aware training".
        why: why that feature cannot take a Keras 3 model.

    Returns:
        ``model`` itself.

    Raises:
        TypeError: if ``model`` is a Keras 3 model or not a Keras model at all.
    """
    if isinstance(model, keras.Model):
        return model
    kind = f"{type(model).__module__}.{type(model).__qualname__}"
    if is_keras3(model):
        needs = f"{feature} needs a tf_keras (Keras 2) model: {why}. " if feature else ""
        raise TypeError(f"Received a Keras 3 model ({kind}). {needs}{_FIX}")
    raise TypeError(f"Expected a tf_keras.Model, received {kind}. {_FIX}")
