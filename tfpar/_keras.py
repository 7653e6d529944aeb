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

from typing import Any

import tensorflow as tf
import tf_keras as keras

from tfpar import _compat

__all__ = [
    "keras",
    "tf",
    "all_layers",
    "check_callbacks_keras",
    "check_keras_model",
    "check_one_keras",
    "check_tf_keras_model",
    "inner_optimizer",
    "is_keras3",
    "keras3",
    "keras_of",
]

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


def _family(obj):
    """ "keras" (Keras 3), "tf_keras", or None: the Keras whose class ``obj``'s class derives from
    (a user's subclass of ``keras.Model`` belongs to Keras 3 too)."""
    for cls in type(obj).__mro__:
        top = cls.__module__.split(".")[0]
        if top in ("keras", "tf_keras"):
            return top
    return None


def is_keras3(obj):
    """Whether ``obj`` (a model, layer, optimizer, callback...) belongs to Keras 3."""
    return _family(obj) == "keras"


def keras_of(obj):
    """The Keras module ``obj`` belongs to: ``tf_keras``, or Keras 3."""
    return keras3() if is_keras3(obj) else keras


def inner_optimizer(optimizer):
    """The optimizer a loss-scale optimizer wraps (either Keras'), or ``optimizer`` itself."""
    return getattr(optimizer, "inner_optimizer", optimizer)


def all_layers(model):
    """Every layer of ``model`` (either Keras), those of nested models and the layer inside a
    wrapper (QAT, pruning) included."""
    for layer in getattr(model, "layers", []):
        yield layer
        if hasattr(layer, "layer"):
            yield layer.layer
        if hasattr(layer, "layers"):
            yield from all_layers(layer)


def check_keras_model(model, name="model"):
    """Checks that ``model`` is a Keras model, of either Keras, and returns it.

    Raises:
        TypeError: anything else.
    """
    if isinstance(model, keras.Model) or (is_keras3(model) and isinstance(model, keras3().Model)):
        return model
    raise TypeError(
        f"{name} must be a Keras model (Keras 3, or tf_keras: tfpar.keras). Received: "
        f"{name}={type(model).__module__}.{type(model).__qualname__}."
    )


def check_tf_keras_model(model: Any, feature: str | None = None, why: str | None = None) -> Any:
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


# tfpar.keras is tf_keras
_NAMES = {
    "keras": ("Keras 3", "keras"),
    "tf_keras": ("tf_keras", "tf_keras"),
}


def _other_keras_layers(model, family):
    """``(path, layer)`` for each layer of the other Keras held by ``model`` or its layers."""
    found, seen = [], set()

    def visit(path, value, depth):
        if id(value) in seen or depth > 3:
            return
        seen.add(id(value))
        if isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                visit(f"{path}[{i}]", item, depth + 1)
        elif isinstance(value, dict):
            for key, item in value.items():
                visit(f"{path}[{key!r}]", item, depth + 1)
        elif hasattr(value, "trainable_weights") and _family(value) not in (None, family):
            found.append((path, value))

    for layer in _compat.flatten_layers(model):
        # The attributes a user sets first (Keras' own tracking holds the same layers again).
        for name, value in sorted(vars(layer).items(), key=lambda item: item[0].startswith("_")):
            visit(f"{layer.name}.{name}", value, 0)
    return found


def check_one_keras(model, arguments):
    """At ``compile`` of a model tfpar owns: refuses a model that holds layers, or is given an
    optimizer, of the other Keras (Keras 3 would leave a tf_keras layer untrained; tf_keras fails
    inside Keras)."""
    family = _family(model)
    if family is None:
        return
    name, module = _NAMES[family]
    for path, layer in _other_keras_layers(model, family):
        other = _NAMES[_family(layer)][0]
        raise TypeError(
            f"Model {model.name!r} is a {name} model but holds a {other} layer at {path}: a model "
            f"trains only the layers of its own Keras (that layer's weights would not be trained, "
            f"or Keras fails inside). Build every layer with {module}. Received: {path}="
            f"{type(layer).__module__}.{type(layer).__qualname__}."
        )
    optimizer = (arguments or {}).get("optimizer")
    if _family(optimizer) not in (None, family):
        kind = type(optimizer).__name__
        fix = (
            f"tfpar.optimizers.{kind}(..., keras_version={3 if family == 'keras' else 2})"
            if type(optimizer).__module__.startswith("tfpar.")
            else f"{module}.optimizers.{kind}"
        )
        raise TypeError(
            f"optimizer must be a {name} optimizer for {name} model {model.name!r}. Received: "
            f"optimizer={type(optimizer).__module__}.{type(optimizer).__qualname__} "
            f"({_NAMES[_family(optimizer)][0]}). Use {fix}."
        )


def _serves_both(callback):
    """tfpar's own callbacks (and subclasses of them) work under either Keras."""
    return any(cls.__module__.startswith("tfpar.") for cls in type(callback).__mro__)


def check_callbacks_keras(model, arguments):
    """At ``fit``/``evaluate``/``predict`` of a model tfpar owns: refuses callbacks of the other
    Keras (tfpar's serve both)."""
    family = _family(model)
    callbacks = (arguments or {}).get("callbacks")
    if family is None or not isinstance(callbacks, (list, tuple)):
        return
    name, module = _NAMES[family]
    for i, callback in enumerate(callbacks):
        other = _family(callback)
        if other not in (None, family) and not _serves_both(callback):
            raise TypeError(
                f"callbacks[{i}] is a {_NAMES[other][0]} callback and model {model.name!r} is a "
                f"{name} model: each Keras runs only its own callbacks. Use "
                f"{module}.callbacks.{type(callback).__name__} (or subclass {module}.callbacks."
                f"Callback); tfpar's callbacks serve both. Received: callbacks[{i}]="
                f"{type(callback).__module__}.{type(callback).__qualname__}."
            )
