"""LARS and LAMB, layer-wise adaptive optimizers for large global batches, for both Kerases.

Each is one class whose rule (`tfpar.optimizers._rules`) is written once; ``keras_version``
picks the Keras it is an optimizer of (2: tf_keras, `tfpar.keras`, the default; 3: Keras 3), as
``model.compile`` needs an optimizer of the model's own Keras. The object is then a real
optimizer of that Keras (``isinstance(opt, keras.optimizers.Optimizer)``), so everything that
takes one takes it: ``compile``, the loss-scale optimizers of ``mixed_float16``, every tfpar
strategy, gradient compression and accumulation, checkpoints and ``model.save``.

Under several replicas the update runs after the strategy's all-reduce (or Horovod's), so the
trust ratio is computed from the whole global batch's gradient, the same on every replica.
"""

import re
import warnings
from collections.abc import Callable
from typing import Any

from tfpar._checks import check_choice, check_names, check_number
from tfpar._keras import tf
from tfpar.optimizers import _rules
from tfpar.optimizers._kerases import keras_class

__all__ = ["LAMB", "LARS"]

_KERAS_VERSIONS = (2, 3)


def _patterns(name, value):
    """Name patterns (regular expressions, searched in each variable's path), compiled."""
    if value is None:
        return ()
    compiled = []
    for pattern in check_names(name, value):
        try:
            compiled.append(re.compile(pattern))
        except re.error as error:
            raise ValueError(
                f"{name} holds an invalid regular expression: {error}. Received: {name}={value!r}. "
                r"Patterns are searched in each variable's path, e.g. ['bias', r'layer_norm\w*/']."
            ) from None
    return tuple(compiled)


def _below_one(name, value, hint=""):
    """A rate in [0, 1) (a momentum, a moment's decay): checked and returned as a float."""
    check_number(name, value, minimum=0, hint=hint)
    if value >= 1:
        raise ValueError(f"{name} must be in [0, 1). Received: {name}={value!r}.{hint}")
    return float(value)


def _path(variable):
    """What the patterns are searched in: Keras 3's path ("dense/bias"), tf_keras' name
    ("dense/bias:0")."""
    return getattr(variable, "path", None) or variable.name


class _LayerWise:
    """What LARS and LAMB share in both Kerases: their options, the patterns, the slots, the
    step."""

    _SLOTS: tuple = ()
    """(attribute, slot name) of each slot: LARS' velocity is ``momentums``, as Keras' SGD's, so the
    learning-rate callbacks' momentum correction rescales it (it carries the rate)."""
    # each Keras' shim (`tfpar.optimizers._kerases`), after this class in the MRO
    _init_keras: Callable[..., None]

    def __new__(cls, *args, keras_version=2, **kwargs):
        if cls in (LARS, LAMB):  # the public class: the Keras' own subclass
            check_choice("keras_version", keras_version, _KERAS_VERSIONS)
            cls = keras_class(cls, keras_version)
        return super().__new__(cls)

    def __repr__(self):  # Keras' refusal of an optimizer of the other Keras prints it
        version = 3 if "keras" in [c.__module__.split(".")[0] for c in type(self).__mro__] else 2
        return (
            f"tfpar.optimizers.{type(self).__name__} for Keras {version} (keras_version={version}; "
            f"a model of the other Keras takes keras_version={5 - version})"
        )

    def _layerwise_options(
        self, weight_decay, exclude_from_weight_decay, exclude_from_layer_adaptation
    ):
        self.weight_decay_rate = check_number("weight_decay", weight_decay, minimum=0)
        self._decay_patterns = _patterns("exclude_from_weight_decay", exclude_from_weight_decay)
        self._adaptation_patterns = (
            self._decay_patterns
            if exclude_from_layer_adaptation is None
            else _patterns("exclude_from_layer_adaptation", exclude_from_layer_adaptation)
        )
        self._adaptation_given = exclude_from_layer_adaptation is not None

    def _decay_of(self, variable):
        """The weight-decay rate of ``variable``: 0 if a pattern (or Keras' own exclusion) excludes
        it."""
        path = _path(variable)
        if any(p.search(path) for p in self._decay_patterns) or not self._use_weight_decay(
            variable
        ):
            return 0.0
        return self.weight_decay_rate

    def _adapts(self, variable):
        return not any(p.search(_path(variable)) for p in self._adaptation_patterns)

    def _warn_unmatched(self, variables):
        """A pattern that matches none of the variables the optimizer is built for is a typo, or a
        layer of another name: say which, with the paths it was searched in."""
        paths = [_path(v) for v in variables]
        options = [("exclude_from_weight_decay", self._decay_patterns)]
        if self._adaptation_given:
            options.append(("exclude_from_layer_adaptation", self._adaptation_patterns))
        for option, patterns in options:
            for pattern in patterns:
                if paths and not any(pattern.search(p) for p in paths):
                    shown = ", ".join(paths[:8]) + (", ..." if len(paths) > 8 else "")
                    warnings.warn(
                        f"{type(self).__name__}: the {option} pattern {pattern.pattern!r} matches "
                        f"no variable, so it excludes nothing. The variables: {shown}.",
                        stacklevel=3,
                    )

    def _layerwise_config(self):
        def given(patterns):
            return [p.pattern for p in patterns] or None

        return {
            "weight_decay": self.weight_decay_rate,
            "exclude_from_weight_decay": given(self._decay_patterns),
            "exclude_from_layer_adaptation": given(self._adaptation_patterns)
            if self._adaptation_given
            else None,
            **self._rule_config(),
        }

    def _rule_config(self):  # pragma: no cover - each rule has its own
        raise NotImplementedError

    def _update(self, variable, gradient, learning_rate, index, assign):
        """One variable's step, from either Keras' ``update_step``: the rule on tensors, then the
        assignments."""
        slots = [getattr(self, attribute)[index] for attribute, _ in self._SLOTS]
        dtype = variable.dtype
        new, new_slots = self._step(
            tf.convert_to_tensor(variable),
            tf.convert_to_tensor(gradient),  # IndexedSlices: the norms need all of it
            [tf.convert_to_tensor(s) for s in slots],
            tf.cast(learning_rate, dtype),
            tf.cast(self.iterations + 1, dtype),
            self._decay_of(variable),
            self._adapts(variable),
        )
        for slot, value in zip(slots, new_slots):
            assign(slot, value)
        assign(variable, new)

    def _step(self, variable, gradient, slots, learning_rate, step, decay, adapt):
        raise NotImplementedError  # pragma: no cover - each rule has its own


class LARS(_LayerWise):
    """LARS: SGD with momentum and a layer-wise trust ratio (You, Gitman & Ginsburg 2017).

    For each variable ``w`` with gradient ``g``: ``local = eta * |w| / (|g| + weight_decay * |w|)``
    (1 where a norm is 0, or for a variable excluded from adaptation), then
    ``v = momentum * v + learning_rate * local * (g + weight_decay * w)`` and ``w = w - v``
    (``nesterov=True``:
    ``w = w - (momentum * v + learning_rate * local * (g + weight_decay * w))``).
    The weight decay is inside the trust ratio, as in the paper.

    Args:
        learning_rate: a number or a Keras learning-rate schedule of the same Keras.
        momentum: in [0, 1).
        nesterov: Nesterov momentum instead of the classic one.
        eta: the trust coefficient, >= 0 (the paper's 0.001).
        weight_decay: >= 0, applied inside the trust ratio.
        exclude_from_weight_decay: name patterns (regular expressions searched in each variable's
            path, e.g. ``["bias", "layer_normalization"]``); the variables they match get no weight
            decay.
        exclude_from_layer_adaptation: patterns whose variables get no trust ratio (default: the
            weight-decay exclusions, as in the papers' code).
        keras_version: 2 (tf_keras, ``tfpar.keras``) or 3 (Keras 3): the Keras of the model compiled
            with it.
        name: the optimizer's name.
        **kwargs: the Keras optimizer's own (``clipnorm``, ``global_clipnorm``, ``clipvalue``,
            ``use_ema``...).

    Raises:
        ValueError: a negative ``eta``, a momentum outside [0, 1), an invalid pattern.
        TypeError: a pattern list that is not a list of strings.

    Examples:
        >>> opt = tfpar.optimizers.LARS(0.1, momentum=0.9, weight_decay=1e-4,  # doctest: +SKIP
        ...                             exclude_from_weight_decay=["bias", "batch_normalization"])
        >>> model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")  # doctest: +SKIP
    """

    _SLOTS = (("momentums", "momentum"),)

    def __init__(
        self,
        learning_rate: float | Any = 0.1,
        momentum: float = 0.9,
        *,
        nesterov: bool = False,
        eta: float = 0.001,
        weight_decay: float = 0.0,
        exclude_from_weight_decay: list[str] | None = None,
        exclude_from_layer_adaptation: list[str] | None = None,
        keras_version: int = 2,
        name: str = "LARS",
        **kwargs: Any,
    ) -> None:
        check_number(
            "eta", eta, minimum=0, hint=" eta is LARS' trust coefficient (the paper's 0.001)."
        )
        momentum = _below_one("momentum", momentum, " Use e.g. 0.9.")
        self._init_keras(learning_rate, name, kwargs)
        self.momentum, self.nesterov, self.eta = momentum, bool(nesterov), float(eta)
        self._layerwise_options(
            weight_decay, exclude_from_weight_decay, exclude_from_layer_adaptation
        )

    def _step(self, variable, gradient, slots, learning_rate, step, decay, adapt):
        w, v = _rules.lars(
            variable,
            gradient,
            slots[0],
            learning_rate,
            momentum=self.momentum,
            nesterov=self.nesterov,
            eta=self.eta,
            decay=decay,
            adapt=adapt,
        )
        return w, (v,)

    def _rule_config(self):
        return {"momentum": self.momentum, "nesterov": self.nesterov, "eta": self.eta}


class LAMB(_LayerWise):
    """LAMB: Adam's moments with a layer-wise trust ratio (You et al. 2019, "from 3 days to 76
    minutes").

    For each variable ``w``: Adam's bias-corrected ``m_hat`` and ``v_hat``, then
    ``r = m_hat / (sqrt(v_hat) + epsilon) + weight_decay * w`` and
    ``w = w - learning_rate * |w| / |r| * r`` (the ratio 1 where a norm is 0, or for a variable
    excluded from adaptation). The weight decay is inside the trust ratio, as in the paper
    (Keras 3's ``Lamb`` decays outside it and has no exclusion lists).

    Args:
        learning_rate: a number or a Keras learning-rate schedule of the same Keras.
        beta_1: the first moment's decay rate, in [0, 1).
        beta_2: the second moment's decay rate, in [0, 1).
        epsilon: added to ``sqrt(v_hat)``, >= 0.
        weight_decay: >= 0, applied inside the trust ratio.
        exclude_from_weight_decay: name patterns (regular expressions searched in each variable's
            path, e.g. ``["bias", "layer_normalization"]``); the variables they match get no weight
            decay.
        exclude_from_layer_adaptation: patterns whose variables get no trust ratio (default: the
            weight-decay exclusions, as in the papers' code).
        keras_version: 2 (tf_keras, ``tfpar.keras``) or 3 (Keras 3): the Keras of the model compiled
            with it.
        name: the optimizer's name.
        **kwargs: the Keras optimizer's own (``clipnorm``, ``global_clipnorm``, ``clipvalue``,
            ``use_ema``...).

    Raises:
        ValueError: a beta outside [0, 1), a negative epsilon or weight decay, an invalid pattern.

    Examples:
        >>> opt = tfpar.optimizers.LAMB(2e-3, weight_decay=0.01, keras_version=3,  # doctest: +SKIP
        ...                             exclude_from_weight_decay=["bias", "layer_normalization"])
    """

    # as Adam's: no momentum correction
    _SLOTS = (
        ("_momentums", "momentum"),
        ("_velocities", "velocity"),
    )

    def __init__(
        self,
        learning_rate: float | Any = 0.001,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-6,
        *,
        weight_decay: float = 0.0,
        exclude_from_weight_decay: list[str] | None = None,
        exclude_from_layer_adaptation: list[str] | None = None,
        keras_version: int = 2,
        name: str = "LAMB",
        **kwargs: Any,
    ) -> None:
        beta_1, beta_2 = _below_one("beta_1", beta_1), _below_one("beta_2", beta_2)
        check_number("epsilon", epsilon, minimum=0)
        self._init_keras(learning_rate, name, kwargs)
        self.beta_1, self.beta_2, self.epsilon = beta_1, beta_2, float(epsilon)
        self._layerwise_options(
            weight_decay, exclude_from_weight_decay, exclude_from_layer_adaptation
        )

    def _step(self, variable, gradient, slots, learning_rate, step, decay, adapt):
        w, m, v = _rules.lamb(
            variable,
            gradient,
            slots[0],
            slots[1],
            learning_rate,
            step,
            beta_1=self.beta_1,
            beta_2=self.beta_2,
            epsilon=self.epsilon,
            decay=decay,
            adapt=adapt,
        )
        return w, (m, v)

    def _rule_config(self):
        return {"beta_1": self.beta_1, "beta_2": self.beta_2, "epsilon": self.epsilon}
