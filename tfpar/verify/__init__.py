"""`tfpar verify`: does a model train under a distribution exactly as on one replica?

K steps on one replica (no strategy) and K steps under the chosen parallelism, from the same
initial weights and on the same global batches, in the same order; then each variable's
largest difference, and for each variable that differs the likely causes tfpar can see:

- BatchNormalization whose batch statistics are taken per replica (or per microbatch);
- random layers (Dropout, noise, augmentation) whose draws differ between the two runs;
- quantization-aware-training ranges taken per replica;
- loss-scale skips that happened on one side only;
- metrics that count tfpar's padding examples (``metrics=`` instead of ``weighted_metrics=``).

Examples:
    >>> report = tfpar.verify.verify(make_compiled_model, make_data,  # doctest: +SKIP
    ...                              strategy="data_parallel")
    >>> report.passed  # doctest: +SKIP
    True
"""

import functools
import importlib
from collections.abc import Callable
from typing import Any

from tfpar._checks import check_choice, check_int, check_number
from tfpar._factory import STRATEGIES, ParallelismSpec
from tfpar._parallelism import check_model_fn
from tfpar.verify._comparison import Comparison
from tfpar.verify._report import VariableDifference, VerifyReport

__all__ = ["VariableDifference", "VerifyReport", "load_function", "verify"]


def load_function(spec: str, parameter: str) -> Callable:
    """``"module:function"`` → the function (the module imported as Python imports it).

    Raises:
        ValueError: not of that form, or the module or the function cannot be found.
        TypeError: the name is not a function.
    """
    module_name, _, name = str(spec).partition(":")
    if not module_name or not name:
        raise ValueError(
            f"{parameter} takes module:function. Received: {parameter}={spec!r}. "
            f"Write e.g. {parameter}=mypackage.models:build_model."
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(
            f"{parameter}: cannot import {module_name!r} ({e}). Received: {parameter}={spec!r}. "
            "Run from the folder that holds it, or put it on PYTHONPATH."
        ) from None
    function = getattr(module, name, None)
    if function is None:
        raise ValueError(
            f"{parameter}: {module_name} has no {name!r}. Received: {parameter}={spec!r}."
        )
    if not callable(function):
        raise TypeError(
            f"{parameter} must name a function. Received: {parameter}={spec!r}, a "
            f"{type(function).__name__}."
        )
    return function


def verify(
    model_fn: Callable[[], Any],
    data_fn: Callable[[], Any],
    *,
    strategy: str = "data_parallel",
    replicas: int | None = None,
    steps: int = 10,
    global_batch_size: int | None = None,
    tolerance: float = 1e-5,
    seed: int = 0,
    tensor_parallel: int = 1,
    zero_stage: int = 0,
    paths: Any = None,
    remat: Any = "none",
) -> Any:
    """Trains ``steps`` steps on one replica and under ``strategy``; returns a `VerifyReport`.

    Args:
        model_fn: builds and compiles the model (called once with no strategy, once under the
            strategy's scope, each time after ``keras.utils.set_random_seed(seed)``).
        data_fn: returns the training examples: ``(x, y)`` or ``(x, y, sample_weight)`` arrays,
            or an unbatched ``tf.data.Dataset``; the first ``steps`` global batches are used, in
            order.
        strategy: one of `tfpar._factory.STRATEGIES`.
        replicas: "data_parallel": this process's devices (default 2; 1 per worker under
            ``tfpar launch``); "parameter_server": workers (default 1: more train asynchronously,
            which verify names as the cause); "pipeline": copies of the 2-stage pipeline (default
            1); "horovod": the ranks (set by the launcher); "tensor_parallel": the devices each
            planned layer is split over (default 2, ``plan="auto"``).
        steps: steps on each side, >= 1.
        tensor_parallel: "pipeline": each stage split over this many devices (``plan="auto"``).
        zero_stage: "data_parallel": the optimizer state sharded over the replicas (ZeRO 1 or 2),
            or the parameters too (3).
        remat: "data_parallel", "horovod", "pipeline": the blocks that recompute their activations
            (`tfpar.remat`: "blocks", or layer names or patterns); the one replica keeps them all.
        paths: "data_parallel", "horovod": instead of one comparison, one per gradient path
            ("all", or names of `tfpar.verify._paths.PATHS`, a list or comma-separated); returns a
            `tfpar.verify._paths.PathsReport` of one row per path.
        global_batch_size: examples per step (default 32 per replica).
        tolerance: the largest absolute difference a variable may show, > 0.
        seed: the Keras seed before each build.

    Raises:
        TypeError / ValueError: a bad argument (a global batch that does not divide over the
            replicas among them); a model that is not compiled, or not built.
    """
    import os

    check_model_fn(model_fn)
    if not callable(data_fn):
        raise TypeError(
            f"data_fn must be a function that returns the examples. Received: data_fn={data_fn!r}."
        )
    check_choice("strategy", strategy, STRATEGIES)
    check_int("steps", steps, 1, hint=" Verify needs at least one step on each side.")
    check_number("tolerance", tolerance, above=0)
    check_int("seed", seed, 0)
    if replicas is not None:
        check_int("replicas", replicas, 1)
    if strategy == "horovod" and replicas is not None:
        raise ValueError(
            "--strategy horovod takes its replicas from the launcher (one per rank). Received: "
            f"replicas={replicas}. Start it with tfpar launch --horovod -n N, without --replicas."
        )
    multi_worker = bool(os.environ.get("TF_CONFIG", "").strip())
    default = {
        "data_parallel": 1 if multi_worker else 2,
        "parameter_server": 1,
        "pipeline": 1,
        "horovod": None,
        "tensor_parallel": 2,
    }[strategy]
    replicas = replicas or default
    if tensor_parallel != 1 and strategy != "pipeline":
        raise ValueError(
            "tensor_parallel splits a pipeline's stages. Received: "
            f"tensor_parallel={tensor_parallel} with strategy {strategy!r}. Use --strategy "
            "pipeline, or --strategy tensor_parallel alone."
        )
    # a Comparison of the model under a parallelism with one replica: all but the parallelism given
    comparison = functools.partial(
        Comparison,
        model_fn,
        data_fn,
        steps=steps,
        global_batch_size=global_batch_size,
        tolerance=tolerance,
        seed=seed,
    )
    if paths is not None:
        return _verify_paths(
            comparison, strategy, replicas, steps, tolerance, paths, zero_stage, remat
        )
    if strategy == "pipeline":
        spec = ParallelismSpec(
            kind="pipeline",
            replicas=replicas or 1,
            balance="time",
            tensor_parallel=tensor_parallel,
            remat=remat,
        )
    else:
        spec = ParallelismSpec(kind=strategy, devices=replicas, zero_stage=zero_stage, remat=remat)
    return comparison(spec.build()).run()


def _verify_paths(comparison, strategy, replicas, steps, tolerance, paths, zero_stage, remat):
    """`verify` of each gradient path (`tfpar.verify._paths`), the one-replica runs shared;
    ``comparison``: `verify`'s, a `Comparison` given the parallelism."""
    from tfpar.verify._paths import PathsReport, check_paths, compare_paths

    if strategy not in ("data_parallel", "horovod"):
        raise ValueError(
            f"paths are the gradient paths of data_parallel and horovod. Received: strategy "
            f"{strategy!r} with paths={paths!r}. Use --strategy data_parallel or horovod."
        )
    check_paths(paths, steps, zero_stage)
    references: dict = {}

    def compare(path):
        spec = ParallelismSpec(kind=strategy, devices=replicas, remat=remat, **path.options())
        parallelism = spec.build()
        compared = comparison(parallelism, accumulation=path.accumulation, references=references)
        return compared.run(), compared.weights

    rows, description, chief = compare_paths(paths, compare, tolerance)
    return PathsReport(description, steps, rows, chief)
