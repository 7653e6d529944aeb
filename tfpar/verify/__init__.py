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
    >>> report = tfpar.verify.verify(make_compiled_model, make_data, strategy="data_parallel")  # doctest: +SKIP
    >>> report.passed  # doctest: +SKIP
    True
"""

import dataclasses
import importlib
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from tfpar._checks import check_choice, check_int, check_number
from tfpar._factory import STRATEGIES, ParallelismSpec
from tfpar._parallelism import PlacesItself, check_model_fn
from tfpar.verify._causes import causes, loss_scale_finding

__all__ = ["VariableDifference", "VerifyReport", "load_function", "verify"]

@dataclasses.dataclass(frozen=True)
class VariableDifference:
    """One variable: its largest absolute difference, and the likely causes when it differs."""

    name: str
    max_difference: float
    causes: tuple = ()


@dataclasses.dataclass(frozen=True)
class VerifyReport:
    """What `verify` found; ``passed`` when every variable is within ``tolerance`` and nothing
    else (loss scale, metrics, the batch) disagrees."""

    description: str
    steps: int
    tolerance: float
    variables: tuple
    findings: tuple = ()
    chief: bool = True
    """Whether this process is the job's chief (worker 0, rank 0), which prints the report."""

    @property
    def passed(self):
        return not self.findings and all(v.max_difference <= self.tolerance for v in self.variables)

    def describe(self) -> str:
        lines = [self.description, f"after {self.steps} steps from the same weights and batches "
                 f"(tolerance {self.tolerance:g}):"]
        width = max([len(v.name) for v in self.variables] + [8])
        causes = []
        for v in self.variables:
            line = f"  {'ok  ' if v.max_difference <= self.tolerance else 'DIFF'} {v.name:<{width}}  " \
                   f"max |difference| {v.max_difference:.3g}"
            if v.max_difference > self.tolerance:
                for cause in v.causes:
                    if cause not in causes:
                        causes.append(cause)
                line += "  likely: " + (" ".join(f"[{causes.index(c) + 1}]" for c in v.causes)
                                        or "no cause tfpar can detect")
            lines.append(line)
        lines.extend(f"  [{n}] {cause}" for n, cause in enumerate(causes, 1))
        lines.extend(f"  {finding}" for finding in self.findings)
        lines.append("PASSED: trains like one replica" if self.passed else "FAILED: differs from one replica")
        return "\n".join(lines)


def load_function(spec: str, parameter: str) -> Callable:
    """``"module:function"`` → the function (the module imported as Python imports it).

    Raises:
        ValueError: not of that form, or the module or the function cannot be found.
        TypeError: the name is not a function.
    """
    module_name, _, name = str(spec).partition(":")
    if not module_name or not name:
        raise ValueError(f"{parameter} takes module:function. Received: {parameter}={spec!r}. "
                         f"Write e.g. {parameter}=mypackage.models:build_model.")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"{parameter}: cannot import {module_name!r} ({e}). Received: {parameter}={spec!r}. "
                         "Run from the folder that holds it, or put it on PYTHONPATH.") from None
    function = getattr(module, name, None)
    if function is None:
        raise ValueError(f"{parameter}: {module_name} has no {name!r}. Received: {parameter}={spec!r}.")
    if not callable(function):
        raise TypeError(f"{parameter} must name a function. Received: {parameter}={spec!r}, a "
                        f"{type(function).__name__}.")
    return function


def verify(model_fn: Callable[[], Any], data_fn: Callable[[], Any], *, strategy: str = "data_parallel",
           replicas: int | None = None, steps: int = 10, global_batch_size: int | None = None,
           tolerance: float = 1e-5, seed: int = 0, tensor_parallel: int = 1, zero_stage: int = 0,
           paths: Any = None) -> Any:
    """Trains ``steps`` steps on one replica and under ``strategy``; returns a `VerifyReport`.

    Args:
        model_fn: builds and compiles the model (called once with no strategy, once under the
            strategy's scope, each time after ``keras.utils.set_random_seed(seed)``).
        data_fn: returns the training examples: ``(x, y)`` or ``(x, y, sample_weight)`` arrays,
            or an unbatched ``tf.data.Dataset``; the first ``steps`` global batches are used, in order.
        strategy: one of `tfpar._factory.STRATEGIES`.
        replicas: "data_parallel": this process's devices (default 2; 1 per worker under
            ``tfpar launch``); "parameter_server": workers (default 1: more train asynchronously, which
            verify names as the cause); "pipeline": copies of the 2-stage
            pipeline (default 1); "horovod": the ranks (set by the launcher); "tensor_parallel": the
            devices each planned layer is split over (default 2, ``plan="auto"``).
        steps: steps on each side, >= 1.
        tensor_parallel: "pipeline": each stage split over this many devices (``plan="auto"``).
        zero_stage: "data_parallel": the optimizer state sharded over the replicas (ZeRO 1 or 2).
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
        raise TypeError(f"data_fn must be a function that returns the examples. Received: data_fn={data_fn!r}.")
    check_choice("strategy", strategy, STRATEGIES)
    check_int("steps", steps, 1, hint=" Verify needs at least one step on each side.")
    check_number("tolerance", tolerance, above=0)
    check_int("seed", seed, 0)
    if replicas is not None:
        check_int("replicas", replicas, 1)
    if strategy == "horovod" and replicas is not None:
        raise ValueError("--strategy horovod takes its replicas from the launcher (one per rank). Received: "
                         f"replicas={replicas}. Start it with tfpar launch --horovod -n N, without --replicas.")
    multi_worker = bool(os.environ.get("TF_CONFIG", "").strip())
    default = {"data_parallel": 1 if multi_worker else 2, "parameter_server": 1, "pipeline": 1, "horovod": None,
               "tensor_parallel": 2}[strategy]
    replicas = replicas or default
    if tensor_parallel != 1 and strategy != "pipeline":
        raise ValueError(f"tensor_parallel splits a pipeline's stages. Received: tensor_parallel={tensor_parallel} with "
                         f"strategy {strategy!r}. Use --strategy pipeline, or --strategy tensor_parallel alone.")
    if paths is not None:
        return _verify_paths(model_fn, data_fn, strategy, replicas, steps, global_batch_size,
                             tolerance, seed, paths, zero_stage)
    if strategy == "pipeline":
        spec = ParallelismSpec(kind="pipeline", replicas=replicas or 1, balance="time", tensor_parallel=tensor_parallel)
    else:
        spec = ParallelismSpec(kind=strategy, devices=replicas, zero_stage=zero_stage)
    parallelism = spec.build()
    return _Comparison(model_fn, data_fn, parallelism, steps, global_batch_size, tolerance, seed).run()


def _verify_paths(model_fn, data_fn, strategy, replicas, steps, global_batch_size, tolerance, seed,
                  paths, zero_stage):
    """`verify` of each gradient path (`tfpar.verify._paths`), the one-replica runs shared."""
    from tfpar.verify._paths import PathsReport, check_paths, compare_paths

    if strategy not in ("data_parallel", "horovod"):
        raise ValueError(f"paths are the gradient paths of data_parallel and horovod. Received: strategy "
                         f"{strategy!r} with paths={paths!r}. Use --strategy data_parallel or horovod.")
    check_paths(paths, steps, zero_stage)
    references: dict = {}

    def compare(path):
        parallelism = ParallelismSpec(kind=strategy, devices=replicas, **path.options()).build()
        comparison = _Comparison(model_fn, data_fn, parallelism, steps, global_batch_size, tolerance, seed,
                                 path.accumulation, references)
        return comparison.run(), comparison.weights

    rows, description, chief = compare_paths(paths, compare, tolerance)
    return PathsReport(description, steps, rows, chief)


class _Comparison:
    def __init__(self, model_fn, data_fn, parallelism, steps, global_batch_size, tolerance, seed, accumulation=1,
                 references=None):
        """``accumulation``: the parallelism applies every that many steps, so the one-replica run takes
        steps of that many global batches; ``references``: one-replica runs kept for other comparisons."""
        self.model_fn, self.data_fn, self.parallelism = model_fn, data_fn, parallelism
        self.steps, self.tolerance, self.seed = steps, tolerance, seed
        self.replicas = parallelism.num_replicas_in_sync
        self.batch = global_batch_size or 32 * self.replicas
        self.accumulation = accumulation
        self.references = {} if references is None else references
        check_int("global_batch_size", self.batch, 1)

    def run(self):
        import tensorflow as tf

        description = self.parallelism.describe(global_batch_size=self.batch)
        chief = self.parallelism.input_strategy.extended.should_checkpoint
        # The first steps x batch examples, as arrays: every side (a parameter-server worker too)
        # builds the same dataset from them.
        arrays = tf.nest.map_structure(
            lambda t: t.numpy(),
            _examples(self.data_fn(), tf).take(self.steps * self.batch).batch(self.steps * self.batch).get_single_element())
        count = len(tf.nest.flatten(arrays)[0])
        steps = math.ceil(count / self.batch)

        def examples():
            return tf.data.Dataset.from_tensor_slices(arrays)

        padded = count % self.batch  # real examples in a padded last step (0: none padded)
        reference, start, ref_history = self._reference(examples, steps)
        model, trained = self._build_distributed(start)
        if isinstance(self.parallelism, PlacesItself):  # what it split, and each device's bytes
            description = self.parallelism.describe(global_batch_size=self.batch, model=model)
        from tfpar.data import distribute

        train = distribute(examples, self.parallelism, self.batch)
        history = model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=1, shuffle=False,
                            verbose=0).history
        self.weights = (start, reference.get_weights(), trained())  # for a path's row
        layer_causes, anywhere = causes(reference, self.parallelism, self.batch, padded, self.accumulation)
        variables = []
        for variable, mine, theirs in zip(reference.weights, reference.get_weights(), trained()):
            own = layer_causes.get(id(variable), [])
            variables.append(VariableDifference(
                getattr(variable, "path", None) or variable.name,
                float(np.max(np.abs(np.asarray(mine, np.float64) - np.asarray(theirs, np.float64)), initial=0.0)),
                tuple(own + [c for c in anywhere if c not in own])))
        findings = loss_scale_finding(reference.optimizer, model.optimizer)
        if all(v.max_difference <= self.tolerance for v in variables):  # else the metrics follow the weights
            findings += self._metrics(ref_history, history, padded)
        return VerifyReport(description, steps, self.tolerance, tuple(variables), tuple(findings), chief)

    def _reference(self, examples, steps):
        """The one-replica model, its initial weights and its history, trained (once per global batch
        and precision policy: kept in ``references``)."""
        from tfpar.precision import current

        key = (self.batch * self.accumulation, steps, current())
        if key not in self.references:
            if steps % self.accumulation:  # the data held fewer examples than steps x batch
                raise ValueError(
                    f"{self.accumulation} accumulated steps are compared with one step of "
                    f"{self.accumulation} global batches, and the data gives {steps} steps of "
                    f"{self.batch}. Received: data for steps={steps}. Give data for a multiple of "
                    f"{self.accumulation} steps.")
            reference = self._build_reference()
            start = reference.get_weights()
            batch, count = key[0], steps // self.accumulation
            if self.accumulation > 1 and _accumulates_itself(reference, self.accumulation):
                batch, count = self.batch, steps
            history = reference.fit(examples().batch(batch), epochs=1, steps_per_epoch=count, shuffle=False,
                                    verbose=0).history
            self.references[key] = (reference, start, history)
        return self.references[key]

    def _build_reference(self):
        _seed(self.seed)
        model = self.model_fn()
        if getattr(model, "optimizer", None) is None or not hasattr(model, "fit"):
            raise ValueError("model_fn must return a compiled Keras model (build it, then model.compile(...)). "
                             f"Received: a {type(model).__name__} without an optimizer.")
        if not model.built or not model.weights:
            raise ValueError(
                f"verify copies the one-replica model's initial weights into the distributed one, and "
                f"{model.name!r} has none yet (a subclassed model is built at its first call). Received: "
                f"a model with built={model.built}. Build it in model_fn: model.build(input_shape), or "
                "give it an Input.")
        return model

    def _build_distributed(self, start):
        """The model under the parallelism, from ``start``; returns it and a function that gives
        its weights in the reference's order."""
        _seed(self.seed)
        if isinstance(self.parallelism, PlacesItself):  # the pipeline, tensor parallelism: they split a built model
            plain = self.model_fn()
            plain.set_weights(start)
            staged = self.parallelism.split(plain)
            optimizer = type(plain.optimizer).from_config(plain.optimizer.get_config())
            with self.parallelism.scope():
                staged.compile(optimizer=optimizer, loss=plain.loss)
            return staged, lambda: staged.plain_model().get_weights()
        model = self.parallelism.build(self.model_fn)
        with self.parallelism.scope():
            model.set_weights(start)
        return model, model.get_weights

    def _metrics(self, reference, history, remainder):
        findings = []
        for name in sorted(set(reference) & set(history) - {"loss"}):
            a, b = reference[name][-1], history[name][-1]
            if abs(a - b) > max(1e-4, 1e-4 * abs(a)):
                why = (f"the last step is padded ({remainder} real examples of {self.batch}) and the metric "
                       "counts the padding: compile it as weighted_metrics=, not metrics="
                       if remainder else "no cause tfpar can detect")
                findings.append(f"DIFF metric {name!r}: {a:.6g} on one replica, {b:.6g} distributed; likely: {why}")
        return findings


def _accumulates_itself(model, steps):
    """Keras 3: ``model`` compiled again with its optimizer's own ``gradient_accumulation_steps``, the
    reference for a strategy's accumulation (`tfpar.verify._paths`); returns whether it was. tf_keras
    has no such option: there one step of the larger batch is the reference."""
    from tfpar._keras import is_keras3, keras_of

    if not is_keras3(model):
        return False
    k, optimizer = keras_of(model), model.optimizer
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    accumulating = type(inner).from_config({**inner.get_config(), "gradient_accumulation_steps": steps})
    if inner is not optimizer:
        accumulating = k.optimizers.LossScaleOptimizer(accumulating)
    model.compile(optimizer=accumulating, loss=model.loss)
    return True


def _seed(seed):
    """The Keras seed of tf_keras, and of Keras 3 when it is loaded (a model_fn may build in either)."""
    import sys

    from tfpar._keras import keras

    keras.utils.set_random_seed(seed)
    if "keras" in sys.modules and hasattr(sys.modules["keras"], "utils"):
        sys.modules["keras"].utils.set_random_seed(seed)


def _examples(data, tf):
    """``data_fn()``'s result as an unbatched dataset of examples."""
    if isinstance(data, tf.data.Dataset):
        return data
    if isinstance(data, (tuple, list)) and len(data) in (2, 3):
        return tf.data.Dataset.from_tensor_slices(tuple(data))
    raise TypeError("data_fn must return (x, y) or (x, y, sample_weight) arrays, or an unbatched tf.data.Dataset. "
                    f"Received: a {type(data).__name__}.")
