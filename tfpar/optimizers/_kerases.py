"""The two Kerases' optimizer APIs, one shim class each, and the class a public optimizer (LARS,
LAMB) becomes in the Keras it is made for: a real optimizer of that Keras, made once and
registered for ``model.save``."""

from tfpar._keras import keras, keras3

__all__ = ["Keras3", "TfKeras", "keras_class"]


class TfKeras:
    """tf_keras' optimizer API (TF 2.11+ ``tf_keras.optimizers.Optimizer``)."""

    def _init_keras(self, learning_rate, name, kwargs):
        # weight_decay=None: tf_keras' own decay is decoupled;
        # LARS/LAMB's (their own argument) is inside
        keras.optimizers.Optimizer.__init__(self, name=name, weight_decay=None, **kwargs)
        self._learning_rate = self._build_learning_rate(learning_rate)

    def build(self, var_list):
        super().build(var_list)
        if getattr(self, "_built", False):
            return
        self._built = True
        for attribute, slot in self._SLOTS:
            setattr(
                self,
                attribute,
                [
                    self.add_variable_from_reference(model_variable=v, variable_name=slot)
                    for v in var_list
                ],
            )
        self._warn_unmatched(var_list)

    def update_step(self, gradient, variable):
        self._update(
            variable,
            gradient,
            self.learning_rate,
            self._index_dict[self._var_key(variable)],
            lambda ref, value: ref.assign(value),
        )

    def get_config(self):
        return {
            **super().get_config(),
            "learning_rate": self._serialize_hyperparameter(self._learning_rate),
            **self._layerwise_config(),
        }


class Keras3:
    """Keras 3's optimizer API (its TensorFlow back-end)."""

    def _init_keras(self, learning_rate, name, kwargs):
        # weight_decay=None: Keras 3's own decay is decoupled;
        # LARS/LAMB's (their own argument) is inside
        keras3().optimizers.Optimizer.__init__(
            self, learning_rate=learning_rate, name=name, weight_decay=None, **kwargs
        )

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        for attribute, slot in self._SLOTS:
            setattr(self, attribute, self.add_optimizer_variables(variables, slot))
        self._warn_unmatched(variables)

    def update_step(self, gradient, variable, learning_rate):
        self._update(
            variable, gradient, learning_rate, self._get_variable_index(variable), self.assign
        )

    def get_config(self):
        return {**super().get_config(), **self._layerwise_config()}


_CLASSES: dict = {}


def keras_class(public, version):
    """``public`` (LARS or LAMB) as an optimizer of Keras ``version``: made once, registered for
    ``model.save``/``load_model`` as "tfpar>LARS" in that Keras."""
    key = (public, version)
    if key not in _CLASSES:
        k = keras if version == 2 else keras3()
        shim = TfKeras if version == 2 else Keras3
        cls = type(
            public.__name__,
            (public, shim, k.optimizers.Optimizer),
            {
                "__module__": public.__module__,
                "__qualname__": public.__qualname__,
                "__doc__": public.__doc__,
            },
        )
        register = k.saving.register_keras_serializable(package="tfpar", name=public.__name__)
        _CLASSES[key] = register(cls)
    return _CLASSES[key]
