"""The Keras models tfpar owns, and the checks their ``compile``, ``fit``, ``evaluate`` and
``predict`` run.

tfpar leaves the classes of both Kerases as they were. A model is tfpar's when it was built under a
tfpar strategy's scope, staged by a Pipeline or quantized; `own` gives that one model its own
``compile``/``fit``/``evaluate``/``predict`` (bound methods in its ``__dict__``, so a deep copy gets
its own), each running the checks its owners gave around Keras' method of the model's class. A
model tfpar does not own never meets tfpar code.

Keras has no hook where a model is created, so `discovering` (entered by a tfpar strategy's
``scope()``) wraps the constructor of the two Keras model classes while some tfpar scope is
entered, and puts Keras' own back when the last one exits: the models created meanwhile, under
a tfpar strategy, are owned with that strategy's checks. Keras 3 is wrapped only if it is loaded
when the scope is entered (importing it costs 1.7 CPU-seconds); `Parallelism.build` owns its model
either way. ARCHITECTURE.md ("Where tfpar touches Keras") says why no other seam works.

This module imports no TensorFlow: ``import tfpar`` registers here the checks of a process
started by ``tfpar launch``.
"""

import contextlib
import functools
import inspect
import sys
import threading
import types

__all__ = ["METHODS", "add_process_check", "checks_of", "discovering", "own"]

METHODS = ("compile", "fit", "evaluate", "predict")
WHEN = ("before", "after")
_CHECKS = (
    "_tfpar_checks"  # the model's __dict__ entry: its checks, (method, when, function) triples
)
_process_checks: list = []  # add_process_check's triples: every owned model runs them
_signatures: dict = {}


def _check_triples(checks):
    triples = tuple(checks)
    for triple in triples:
        if (
            len(triple) != 3
            or triple[0] not in METHODS
            or triple[1] not in WHEN
            or not callable(triple[2])
        ):
            raise ValueError(
                f"checks must be (method, when, function) triples with method in {METHODS} and "
                f"when in {WHEN}. Received: {triple!r}."
            )
    return triples


def add_process_check(method, when, check):
    """``check(model, arguments)`` runs for every owned model's ``method`` in this process (the
    checks of ``tfpar launch``'s options, registered by ``import tfpar``)."""
    (triple,) = _check_triples([(method, when, check)])
    if triple not in _process_checks:
        _process_checks.append(triple)


def checks_of(model):
    """The (method, when, function) triples ``model`` runs (empty if tfpar does not own it)."""
    return tuple(getattr(model, "__dict__", {}).get(_CHECKS, ()))


def _signature(function):
    if function not in _signatures:
        _signatures[function] = inspect.signature(function)
    return _signatures[function]


def _run(model, method, args, kwargs):
    """Keras' ``method`` of ``model``'s class, with ``model``'s checks around it.

    A before-check gets ``(model, arguments)``, ``arguments`` mapping the method's parameters to
    this call's values; a value it replaces there is what the method gets. It may raise to refuse.
    A KerasHub task model's ``fit`` of a distributed dataset is Keras' own (`_keras_method`)."""
    original = getattr(type(model), method)
    checks = [c for c in (*checks_of(model), *_process_checks) if c[0] == method]
    try:
        bound = _signature(original).bind(model, *args, **kwargs)
    except TypeError:  # arguments the method does not take: Keras itself says so
        return original(model, *args, **kwargs)
    bound.apply_defaults()
    arguments = bound.arguments
    given = dict(arguments)
    for _, when, check in checks:
        if when == "before":
            check(model, arguments)
    keras_method = _keras_method(model, method, arguments)
    if keras_method is not None:
        result = keras_method(model, **_keywords(bound))
    elif any(arguments[name] is not value for name, value in given.items()):
        result = original(*bound.args, **bound.kwargs)  # a check replaced an argument
    else:
        result = original(model, *args, **kwargs)
    for _, when, check in checks:
        if when == "after":
            check(model, arguments)
    return result


def _keras_method(model, method, arguments):
    """Keras' ``fit`` where a KerasHub task model's own would refuse a distributed dataset (it takes
    arrays and datasets it can map its preprocessor over), else None."""
    if method != "fit":
        return None
    from tfpar import _compat

    return _compat.keras_hub_fit(model, arguments.get("x"))


def _keywords(bound):
    """A bound call's arguments as keywords (its ``**kwargs`` spread), the model left out."""
    keywords = {}
    for name, value in list(bound.arguments.items())[1:]:
        if bound.signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
            keywords.update(value)
        else:
            keywords[name] = value
    return keywords


def _method(name):
    def method(self, *args, **kwargs):
        return _run(self, name, args, kwargs)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = (
        f"Keras' ``{name}``, with the checks of tfpar, which owns this model (`tfpar._owned`)."
    )
    return method


_METHODS = {name: _method(name) for name in METHODS}


def own(model, checks=()):
    """Makes ``model`` (either Keras) tfpar's, running ``checks`` (and those it had) at its
    ``compile``, ``fit``, ``evaluate`` and ``predict``; returns ``model``."""
    checks = _check_triples(checks)
    state = model.__dict__
    known = list(state.get(_CHECKS, ()))
    known += [c for c in checks if c not in known]
    # object.__setattr__: past Keras' attribute tracking (neither is a layer, a variable or a
    # metric).
    object.__setattr__(model, _CHECKS, tuple(known))
    for name, function in _METHODS.items():
        if (
            not isinstance(state.get(name), types.MethodType)
            or state[name].__func__ is not function
        ):
            object.__setattr__(model, name, types.MethodType(function, model))
    return model


# --- discovery: the models created under a tfpar strategy's scope ---------------------------------

_lock = threading.Lock()
_entered = [0]  # tfpar scopes entered, over all threads
_wrapped: dict = {}  # Keras class -> its own __init__, while wrapped


def _model_classes():
    """The classes whose constructor every Keras model runs: tf_keras' Model, Keras 3's TensorFlow
    trainer (if Keras 3 is loaded)."""
    from tfpar import _compat

    classes = [_compat.tf_keras_model_class()]
    if "keras" in sys.modules:
        classes.append(_compat.keras3_trainer_class())
    return [cls for cls in classes if cls is not None]


def _current_owner():
    """The current strategy of this thread if it is tfpar's (it says which checks its models
    run)."""
    import tensorflow as tf  # loaded: a tfpar strategy's scope is entered

    strategy = tf.distribute.get_strategy()
    return strategy if callable(getattr(strategy, "model_checks", None)) else None


def _wrap(init):
    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        strategy = _current_owner()
        if strategy is not None:
            own(self, strategy.model_checks())

    return __init__


@contextlib.contextmanager
def discovering():
    """While entered (by a tfpar strategy's scope): a Keras model created in a thread whose current
    strategy is tfpar's is owned with that strategy's ``model_checks()``."""
    with _lock:
        # Keras 3 too if it was loaded since the outer scope was entered
        for cls in _model_classes():
            if cls not in _wrapped:
                _wrapped[cls] = cls.__dict__["__init__"]
                cls.__init__ = _wrap(_wrapped[cls])
        _entered[0] += 1
    try:
        yield
    finally:
        with _lock:
            _entered[0] -= 1
            if not _entered[0]:
                while _wrapped:
                    cls, init = _wrapped.popitem()
                    cls.__init__ = init
