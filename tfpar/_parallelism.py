"""What every tfpar strategy and the pipeline offer, so that one script runs on either.

A *parallelism* is a tfpar strategy (`DataParallel`, `HorovodStrategy`,
`ParameterServer`: real ``tf.distribute.Strategy`` objects) or a `tfpar.pipeline.Pipeline`.
Each has:

- ``build(model_fn)``: calls ``model_fn()`` where the model's variables belong and returns
  the model to compile (a pipeline returns it cut into stages);
- ``scope()``: compile (and build anything else) under it;
- ``num_replicas_in_sync``: the data-parallel copies the global batch is split over;
- ``input_strategy``: the ``tf.distribute.Strategy`` that `tfpar.data.distribute` feeds
  (a strategy's is itself; a pipeline's is TensorFlow's default strategy, as the pipeline
  splits the batch over its stages and replicas itself);
- ``describe(global_batch_size=None, model=None)``: a summary to print.

Examples:
    >>> parallelism = tfpar.DataParallel()  # or tfpar.pipeline.Pipeline(num_stages=2)  # doctest:
    +SKIP
    >>> model = parallelism.build(make_model)  # doctest: +SKIP
    >>> with parallelism.scope():  # doctest: +SKIP
    ...     model.compile("adam", "sparse_categorical_crossentropy")
    >>> train = tfpar.data.distribute(make_dataset, parallelism, 64)  # doctest: +SKIP
"""

import contextlib
from collections.abc import Callable
from typing import Any

from tfpar import _owned
from tfpar._checks import options_signature
from tfpar._topology import derived_topology

__all__ = [
    "PlacesItself",
    "Parallelism",
    "check_compiled_in_its_scope",
    "check_model_fn",
    "owned_model_checks",
    "sum_over_workers",
]


def sum_over_workers(strategy, value, whole=True):
    """Each worker's ``value`` (a number or an array, float64) summed over the workers, in one
    collective; every worker gets the sum (rounded to int64 when ``whole``, else float64). Each
    of a worker's replicas adds its share of it."""
    import numpy as np
    import tensorflow as tf

    share = np.asarray(value, np.float64) / len(strategy.extended.worker_devices)
    summed = strategy.reduce(
        tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(share)), axis=None
    ).numpy()
    return np.rint(summed).astype(np.int64) if whole else summed


def check_compiled_in_its_scope(model, arguments=None):
    """Refuses ``compile`` outside the scope of the strategy the model was built under: tf_keras
    would fail at ``fit`` ("Mixing different tf.distribute.Strategy objects"), and Keras 3 would
    make the optimizer's variables plain, not mirrored, and train on."""
    import tensorflow as tf

    built_under = model.distribute_strategy  # the model's strategy, else the current one
    current = tf.distribute.get_strategy()
    if built_under is not current and isinstance(built_under, Parallelism):
        raise ValueError(
            f"Compile the model under the scope of the strategy it was built under. Received: "
            f"{model.name!r}, built under {type(built_under).__name__}, compiled under "
            f"{type(current).__name__}. Write `with strategy.scope(): model.compile(...)`; the "
            "optimizer's variables must be created there too."
        )


def owned_model_checks():
    """``(method, when, check)`` of every model tfpar owns (`tfpar._owned`): one Keras in the model,
    its optimizer and callbacks; compiled under the scope it was built under; Keras 3's loss scale
    agreed over the replicas; a `tfpar.data.distribute` input started at ``initial_epoch``."""
    from tfpar._keras import check_callbacks_keras, check_one_keras
    from tfpar.data.resume import start_where_fit_starts
    from tfpar.precision.policy import agree_on_overflow

    return (
        ("compile", "before", check_one_keras),
        ("compile", "before", check_compiled_in_its_scope),
        ("compile", "after", agree_on_overflow),
        *((method, "before", check_callbacks_keras) for method in ("fit", "evaluate", "predict")),
        ("fit", "before", start_where_fit_starts),
    )


@contextlib.contextmanager
def _owning(scope):
    from tfpar import _compat

    _compat.keep_malloc_policy()  # before the strategy's input pipeline pins glibc's threshold
    with _owned.discovering(), scope as strategy:
        yield strategy


def check_model_fn(model_fn):
    """Raises TypeError unless ``model_fn`` is a function (a built model is callable too)."""
    if not callable(model_fn) or hasattr(model_fn, "count_params"):  # a Keras model or layer
        raise TypeError(
            "model_fn must be a function that builds and returns the Keras model (it is called "
            f"where the model's variables belong). Received: model_fn={model_fn!r}. Pass the "
            "function itself, e.g. build(make_model), not build(make_model())."
        )


class Parallelism:
    """The shared part of tfpar's strategies: ``build`` under ``scope()``, fed as themselves, and
    the checks of the models built under them (`tfpar._owned`)."""

    CONFIG: type | None = None
    """The dataclass of the strategy's options: its constructor takes ``(config=None, **options)``,
    and shows the options as its signature (``help()``, an IDE)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.CONFIG is not None:
            cls.__signature__ = options_signature(cls.CONFIG)

    def scope(self) -> contextlib.AbstractContextManager:
        """The strategy's scope (``tf.distribute.Strategy.scope``): the Keras models created under
        it are this strategy's, and run `model_checks` at compile, fit, evaluate and predict."""
        return _owning(super().scope())  # type: ignore[misc]  # tf.distribute.Strategy's, after this mixin

    @property
    def topology(self):
        """Where this process stands in the job (`tfpar._topology.Topology`): workers, this one's
        index, replicas per worker, and whether a coordinator drives them."""
        return derived_topology(self)

    def model_checks(self) -> tuple:
        """``(method, when, check)`` for the models built under this strategy (`tfpar._owned`):
        `owned_model_checks`; a strategy adds its own."""
        return owned_model_checks()

    def build(self, model_fn: Callable[[], Any]) -> Any:
        """Calls ``model_fn()`` under ``self.scope()`` and returns its model.

        Raises:
            TypeError: ``model_fn`` is not callable.
        """
        check_model_fn(model_fn)
        with self.scope():
            model = model_fn()
        # owned even if Keras 3 loaded only now
        if hasattr(model, "compile") and hasattr(model, "fit"):
            _owned.own(model, self.model_checks())
        return model

    @property
    def input_strategy(self):
        """The strategy `tfpar.data.distribute` feeds: this one."""
        return self


class PlacesItself(Parallelism):
    """A parallelism that places its model's parts itself, in this process, under TensorFlow's
    default strategy, and wraps a built model (`split`): the pipeline and tensor parallelism."""

    _FIX = "Build and compile the model outside it."

    def split(self, model: Any) -> Any:
        """``model`` made this parallelism's (the pipeline's ``stage``, tensor parallelism's
        ``shard``)."""
        raise NotImplementedError

    @property
    def input_strategy(self):
        """TensorFlow's default strategy: this parallelism splits each batch over its devices
        itself."""
        from tfpar._keras import tf

        return tf.distribute.get_strategy()

    def scope(self) -> contextlib.AbstractContextManager:
        """The default strategy's scope; compile the model under it.

        Raises:
            ValueError: called inside another strategy's scope.
        """
        from tfpar._keras import tf

        if tf.distribute.has_strategy():
            raise ValueError(
                f"{type(self).__name__} places its model's parts itself, in this process, so it "
                "cannot run inside another strategy's scope. Received: a call inside "
                f"{type(tf.distribute.get_strategy()).__name__}.scope(). {self._FIX}"
            )
        return tf.distribute.get_strategy().scope()

    def build(self, model_fn: Callable[[], Any]) -> Any:
        """Builds ``model_fn()`` and returns it made this parallelism's (`split`).

        Raises:
            TypeError: ``model_fn`` is not callable, or its model is not a Keras model.
            ValueError: inside another strategy's scope, or as `split` does.
        """
        check_model_fn(model_fn)
        with self.scope():
            return self.split(model_fn())
