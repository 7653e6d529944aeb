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

Example:
    >>> parallelism = tfpar.DataParallel()  # or tfpar.pipeline.Pipeline(num_stages=2)  # doctest: +SKIP
    >>> model = parallelism.build(make_model)  # doctest: +SKIP
    >>> with parallelism.scope():  # doctest: +SKIP
    ...     model.compile("adam", "sparse_categorical_crossentropy")
    >>> train = tfpar.data.distribute(make_dataset, parallelism, 64)  # doctest: +SKIP
"""

from tfpar import _model_checks as model_checks

__all__ = ["STRATEGIES", "Parallelism", "check_compiled_in_its_scope", "check_model_fn", "make_parallelism",
           "sum_over_workers"]

STRATEGIES = ("data_parallel", "horovod", "ps", "pipeline")
"""The names `make_parallelism` (so ``tfpar demo`` and ``tfpar verify``) takes."""


def make_parallelism(name, num_devices=None, replicas=1, microbatches=8, compression="none"):
    """The parallelism called ``name`` (one of `STRATEGIES`), for this process.

    Args:
        name: "data_parallel" (this host's devices, or TF_CONFIG's workers), "horovod" (one
            replica per rank, started by horovodrun or ``tfpar launch --horovod``), "ps" (a local
            cluster of ``num_devices`` workers, default 2, and one ps, as child processes) or
            "pipeline" (2 stages x ``replicas`` on their own devices).
        num_devices: virtual CPU devices when there is no GPU, or the PS workers.
        replicas: "pipeline": data-parallel copies of the 2-stage pipeline.
        microbatches: "pipeline": microbatches per replica and step.
        compression: "data_parallel" and "horovod": the gradients on the wire ("none", "bf16",
            "fp16"); the others send none over a ring.

    Raises:
        ValueError: compression with "ps" or "pipeline".
    """
    from tfpar.devices import configure_devices

    if compression != "none" and name in ("ps", "pipeline"):
        raise ValueError(
            f"Gradient compression applies to data_parallel and horovod, whose replicas all-reduce "
            f"their gradients. Received: strategy {name!r} with compression={compression!r}. Use "
            "--strategy data_parallel or horovod, or leave compression out.")

    if name == "ps":
        from tfpar.strategies.parameter_server import ParameterServer

        return ParameterServer.local(num_workers=num_devices or 2, num_ps=1)
    if name == "horovod":
        from tfpar.strategies.horovod import HorovodStrategy

        return HorovodStrategy(compression=compression)
    if name == "pipeline":
        from tfpar.pipeline import Pipeline

        configure_devices(num_devices or 2 * replicas)
        return Pipeline(num_stages=2, num_microbatches=microbatches, replicas=replicas, balance="time")
    from tfpar.strategies.data_parallel import DataParallel

    configure_devices(num_devices)
    return DataParallel(compression=compression)


def sum_over_workers(strategy, value, whole=True):
    """Each worker's ``value`` (a number or an array, float64) summed over the workers, in one
    collective; every worker gets the sum (rounded to int64 when ``whole``, else float64). Each
    of a worker's replicas adds its share of it."""
    import numpy as np
    import tensorflow as tf

    share = np.asarray(value, np.float64) / len(strategy.extended.worker_devices)
    summed = strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(share)), axis=None).numpy()
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
            "optimizer's variables must be created there too.")


model_checks.register_before(check_compiled_in_its_scope)  # once, at import


def check_model_fn(model_fn):
    """Raises TypeError unless ``model_fn`` is a function (a built model is callable too)."""
    if not callable(model_fn) or hasattr(model_fn, "count_params"):  # a Keras model or layer
        raise TypeError(
            "model_fn must be a function that builds and returns the Keras model (it is called "
            f"where the model's variables belong). Received: model_fn={model_fn!r}. Pass the "
            "function itself, e.g. build(make_model), not build(make_model()).")


class Parallelism:
    """The shared part of tfpar's strategies: ``build`` under ``scope()``, fed as themselves."""

    def build(self, model_fn):
        """Calls ``model_fn()`` under ``self.scope()`` and returns its model.

        Raises:
            TypeError: ``model_fn`` is not callable.
        """
        check_model_fn(model_fn)
        with self.scope():
            return model_fn()

    @property
    def input_strategy(self):
        """The strategy `tfpar.data.distribute` feeds: this one."""
        return self
