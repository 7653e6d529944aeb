"""One comparison of `tfpar.verify`: the model trained on one replica and under the parallelism,
from the same initial weights and on the same global batches, then each variable's difference."""

import math

import numpy as np

from tfpar._checks import check_int
from tfpar._parallelism import PlacesItself
from tfpar.strategies._prebuild import build_optimizer_state
from tfpar.verify._causes import causes, loss_scale_finding
from tfpar.verify._report import VariableDifference, VerifyReport

__all__ = ["Comparison"]


class Comparison:
    """One model trained on one replica and under a parallelism, compared variable by variable."""

    def __init__(
        self,
        model_fn,
        data_fn,
        parallelism,
        steps,
        global_batch_size,
        tolerance,
        seed,
        accumulation=1,
        references=None,
    ):
        """``accumulation``: the parallelism applies every that many steps, so the one-replica run
        takes steps of that many global batches; ``references``: one-replica runs kept for other
        comparisons."""
        self.model_fn = model_fn
        self.data_fn = data_fn
        self.parallelism = parallelism
        self.steps = steps
        self.tolerance = tolerance
        self.seed = seed
        self.replicas = parallelism.num_replicas_in_sync
        self.batch = global_batch_size or 32 * self.replicas
        self.accumulation = accumulation
        self.references = {} if references is None else references
        check_int("global_batch_size", self.batch, 1)

    def run(self):
        import tensorflow as tf

        self.parallelism.describe(global_batch_size=self.batch)  # a batch that does not divide
        chief = self.parallelism.input_strategy.extended.should_checkpoint
        # The first steps x batch examples, as arrays: every side (a parameter-server worker too)
        # builds the same dataset from them.
        arrays = tf.nest.map_structure(
            lambda t: t.numpy(),
            _examples(self.data_fn(), tf)
            .take(self.steps * self.batch)
            .batch(self.steps * self.batch)
            .get_single_element(),
        )
        count = len(tf.nest.flatten(arrays)[0])
        steps = math.ceil(count / self.batch)

        def examples():
            return tf.data.Dataset.from_tensor_slices(arrays)

        padded = count % self.batch  # real examples in a padded last step (0: none padded)
        reference, start, ref_history = self._reference(examples, steps)
        model, trained = self._build_distributed(start)
        # the model too: what it split and each device's bytes, the blocks it recomputes
        description = self.parallelism.describe(global_batch_size=self.batch, model=model)
        from tfpar.data import distribute

        train = distribute(examples, self.parallelism, self.batch)
        history = model.fit(
            train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=1, shuffle=False, verbose=0
        ).history
        self.weights = (start, reference.get_weights(), trained())  # for a path's row
        layer_causes, anywhere = causes(
            reference, self.parallelism, self.batch, padded, self.accumulation
        )
        variables = []
        for variable, mine, theirs in zip(reference.weights, reference.get_weights(), trained()):
            own = layer_causes.get(id(variable), [])
            variables.append(
                VariableDifference(
                    getattr(variable, "path", None) or variable.name,
                    float(
                        np.max(
                            np.abs(np.asarray(mine, np.float64) - np.asarray(theirs, np.float64)),
                            initial=0.0,
                        )
                    ),
                    tuple(own + [c for c in anywhere if c not in own]),
                )
            )
        findings = loss_scale_finding(reference.optimizer, model.optimizer)
        # else the metrics follow the weights
        if all(v.max_difference <= self.tolerance for v in variables):
            findings += self._metrics(ref_history, history, padded)
        return VerifyReport(
            description, steps, self.tolerance, tuple(variables), tuple(findings), chief
        )

    def _reference(self, examples, steps):
        """The one-replica model, its initial weights and its history, trained (once per global
        batch and precision policy: kept in ``references``)."""
        from tfpar.precision import current

        key = (self.batch * self.accumulation, steps, current())
        if key not in self.references:
            if steps % self.accumulation:  # the data held fewer examples than steps x batch
                raise ValueError(
                    f"{self.accumulation} accumulated steps are compared with one step of "
                    f"{self.accumulation} global batches, and the data gives {steps} steps of "
                    f"{self.batch}. Received: data for steps={steps}. Give data for a multiple of "
                    f"{self.accumulation} steps."
                )
            reference = self._build_reference()
            start = reference.get_weights()
            batch, count = key[0], steps // self.accumulation
            if self.accumulation > 1 and _accumulates_itself(reference, self.accumulation):
                batch, count = self.batch, steps
            build_optimizer_state(reference)  # its step traced once, as the strategies' are
            history = reference.fit(
                examples().batch(batch), epochs=1, steps_per_epoch=count, shuffle=False, verbose=0
            ).history
            self.references[key] = (reference, start, history)
        return self.references[key]

    def _build_reference(self):
        _seed(self.seed)
        model = self.model_fn()
        if getattr(model, "optimizer", None) is None or not hasattr(model, "fit"):
            raise ValueError(
                "model_fn must return a compiled Keras model (build it, then model.compile(...)). "
                f"Received: a {type(model).__name__} without an optimizer."
            )
        if not model.built or not model.weights:
            raise ValueError(
                "verify copies the one-replica model's initial weights into the distributed one, "
                f"and {model.name!r} has none yet (a subclassed model is built at its first call). "
                f"Received: a model with built={model.built}. Build it in model_fn: "
                "model.build(input_shape), or give it an Input."
            )
        return model

    def _build_distributed(self, start):
        """The model under the parallelism, from ``start``; returns it and a function that gives
        its weights in the reference's order."""
        _seed(self.seed)
        # the pipeline, tensor parallelism: they split a built model
        if isinstance(self.parallelism, PlacesItself):
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
                why = (
                    f"the last step is padded ({remainder} real examples of {self.batch}) and the "
                    "metric counts the padding: compile it as weighted_metrics=, not metrics="
                    if remainder
                    else "no cause tfpar can detect"
                )
                findings.append(
                    f"DIFF metric {name!r}: {a:.6g} on one replica, {b:.6g} distributed; likely: "
                    f"{why}"
                )
        return findings


def _accumulates_itself(model, steps):
    """Keras 3: ``model`` compiled again with its optimizer's own ``gradient_accumulation_steps``,
    the reference for a strategy's accumulation (`tfpar.verify._paths`); returns whether it was.
    tf_keras has no such option: there one step of the larger batch is the reference."""
    from tfpar._keras import inner_optimizer, is_keras3, keras_of

    if not is_keras3(model):
        return False
    k, optimizer = keras_of(model), model.optimizer
    inner = inner_optimizer(optimizer)
    accumulating = type(inner).from_config(
        {**inner.get_config(), "gradient_accumulation_steps": steps}
    )
    if inner is not optimizer:
        accumulating = k.optimizers.LossScaleOptimizer(accumulating)
    model.compile(optimizer=accumulating, loss=model.loss)
    return True


def _seed(seed):
    """The Keras seed of tf_keras, and of Keras 3 when it is loaded (a model_fn may build in
    either)."""
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
    raise TypeError(
        "data_fn must return (x, y) or (x, y, sample_weight) arrays, or an unbatched "
        f"tf.data.Dataset. Received: a {type(data).__name__}."
    )
