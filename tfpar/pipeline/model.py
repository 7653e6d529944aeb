"""`PipelineModel`: a staged model whose training step runs the pipeline schedule.

A training step splits the global batch into microbatches (`microbatching.py`), runs the
schedule's instructions (`schedule.py`) on the stage devices (`executor.py`), accumulates the
gradients over the microbatches and applies them once, so that it computes the same update as
the plain model on the same global batch; it records when each instruction ran (`timing.py`).
With ``replicas=R`` each stage's gradients are summed over the replicas before the update.
`tfpar.pipeline.Pipeline` builds it.

A `PipelineModel` is a model of the Keras its source model was written in: the pipeline is
written once (`PipelineModel`) over the few places where the two Kerases differ (the loss of a
microbatch, loss scaling, applying the summed gradients), which `_TfKerasPipelineModel` and
`_Keras3PipelineModel` fill in.
"""

import functools
import logging
from typing import Any

from tfpar import _compat
from tfpar._keras import is_keras3, keras, keras3, tf
from tfpar.pipeline.copies import check_tied, copy_back, tied_gradients
from tfpar.pipeline.executor import add_gradients, chain_layers, recomputed, run_replica
from tfpar.pipeline.flat import FlatChunk
from tfpar.pipeline.flat_stage import staged_copy
from tfpar.pipeline.microbatching import check_fit_batches, split_microbatches
from tfpar.pipeline.timing import record_timing
from tfpar.tensor_parallel.model import TensorParallelModel, build_optimizer_beside_variables
from tfpar.tensor_parallel.nested import rebuilt
from tfpar.tensor_parallel.ops import placed_on

_log = logging.getLogger(__name__)

__all__ = ["PipelineModel"]


class PipelineModel:
    """A model run as a pipeline; build it with `Pipeline.stage`. It is a ``keras.Model`` of the
    Keras its source model was written in (tf_keras or Keras 3).

    ``call`` (predict, evaluate) runs the stages one after another on their
    devices; ``train_step`` runs the microbatch schedule. ``partition`` tells
    how the model was cut; `plain_model` returns the original model with the
    trained weights.
    """

    _source: Any  # the model it was staged from (set untracked in __init__)
    _copies: list | None  # flattened stages: what ties each to the source (`flat_stage.StageCopy`)
    optimizer: Any  # Keras' (the concrete class is a keras.Model)

    _keras = None  # the Keras module of the concrete class

    def __new__(cls, source=None, *args, **kwargs):
        if cls is PipelineModel:  # the class of the source model's Keras
            cls = _keras3_pipeline_model() if is_keras3(source) else _TfKerasPipelineModel
        return super().__new__(cls)

    def __init__(
        self, source, partition, grid, schedule, recompute=False, tensor_styles=None, workers=None
    ):
        super().__init__(name=f"{source.name}_pipeline")
        self.partition = partition
        self.grid = grid
        self.schedule = schedule
        self.recompute = recompute
        stages, copies = self._stages_of(source, partition, tensor_styles)
        self.stages = stages
        self.__dict__["_recompute"] = recomputed(stages, recompute)
        self.__dict__["_copies"] = copies or None  # what ties each flattened stage to the source
        self.__dict__["_chains"] = self._chains_of(stages, tensor_styles)
        self.__dict__["_source"] = source  # not tracked: its weights are the stages' originals
        # the job's other workers, replicas of this pipeline (or None)
        self.__dict__["_workers"] = workers
        self.num_workers = workers.num_workers if workers else 1
        if workers:
            workers.start_alike([v for stage in stages for v in stage.weights])
        # F, B and W each take a time: a strict order
        self._timeline = schedule.simulate(1.0, 1.0, 1.0)
        self._order = self._timeline.order()
        with tf.device("/cpu:0"):
            # Summed over steps: [stage busy time (mean over stages and replicas), step span].
            self.pipeline_timing = tf.Variable(
                tf.zeros([2], tf.float64), trainable=False, name="pipeline_timing"
            )
            # The last step's instructions, replica by replica in the schedule's order:
            # (start, end).
            self.device_trace = tf.Variable(
                tf.zeros([len(self._trace_keys()), 2], tf.float64),
                trainable=False,
                name="device_trace",
            )

    def _stages_of(self, source, partition, tensor_styles):
        """Each chunk's stage on its devices (a flattened chunk's, a tensor-parallel one's, or a
        copy of the chunk), and the StageCopy of each flattened one."""
        stages = []
        copies = []  # flattened stages: each a StageCopy of the source
        for k, sub in enumerate(partition.models):
            if isinstance(sub, FlatChunk):
                styles = tensor_styles[k] if tensor_styles is not None else None
                with tf.device(self._device(0, k)):
                    copies.append(
                        staged_copy(
                            source, sub, self._keras, styles, list(self._stage_devices(0, k))
                        )
                    )
                stages.append(copies[-1].stage)
                continue
            if tensor_styles is not None:  # the chunk's layers split over its stage's devices
                stages.append(
                    TensorParallelModel(sub, tensor_styles[k], list(self._stage_devices(0, k)))
                )
                continue
            with tf.device(self._device(0, k)):  # the chunk's variables live on its stage's device
                stages.append(self._copy(sub, source))
        return stages, copies

    def _chains_of(self, stages, tensor_styles):
        """Zero-bubble: the layers of each chunk that is a chain, whose B and W split layer by
        layer (None for a chunk that is not, or without a split backward)."""
        by_layer = self.schedule.splits_backward and not self.recompute and tensor_styles is None
        chains = [chain_layers(stage, self._keras) if by_layer else None for stage in stages]
        unsplit = [k for k, chain in enumerate(chains) if chain is None]
        if by_layer and unsplit:
            _log.warning(
                "%s: chunk(s) %s are not a chain of one-input layers, so their weight pass (W) "
                "recomputes the chunk's backward chain that B ran: correct, but W costs about "
                "B + W there.",
                self.schedule.name,
                unsplit,
            )
        return chains

    def _copy(self, sub, source):
        """A chunk's copy with its weights: Keras' clone of a cut, or the whole model (one stage)
        built again from its config, as a task model around its backbone does not clone."""
        if sub is source:
            return rebuilt(source, self._keras)
        clone = self._keras.models.clone_model(sub)
        clone.set_weights(sub.get_weights())
        return clone

    def _stage_devices(self, replica, chunk):
        """The devices of the stage a chunk runs on, in that replica: one, or its tensor-parallel
        ones."""
        entry = self.grid[replica][self.schedule.stage_of(chunk)]
        return entry if isinstance(entry, tuple) else (entry,)

    def _device(self, replica, chunk):
        """Where a chunk of the model runs: the (first) device of the stage its schedule places it
        on, in that replica."""
        return self._stage_devices(replica, chunk)[0]

    def _placement(self, replica, chunk):
        """Inside it, a tensor-parallel chunk computes on that replica's devices."""
        return placed_on(self._stage_devices(replica, chunk))

    def device_track_names(self) -> list[str]:
        """The trace's tracks: one per stage of each replica (`tfpar.callbacks.Timeline`)."""
        return [
            f"stage {k}" + (f" (replica {r})" if len(self.grid) > 1 else "")
            for r in range(len(self.grid))
            for k in range(self.schedule.num_stages)
        ]

    def device_trace_labels(self) -> list:
        """Per row of ``device_trace``: (its track, "F<microbatch>", "B<microbatch>" or
        "W<microbatch>", with the chunk after a "c" under virtual stages)."""
        p, chunks = self.schedule.num_stages, self.schedule.virtual_stages > 1
        return [
            (r * p + self.schedule.stage_of(i.stage), f"{i}c{i.stage}" if chunks else str(i))
            for r, i in self._trace_keys()
        ]

    def _trace_keys(self):
        """The rows of ``device_trace``: (replica, instruction), replica by replica in the
        schedule's order."""
        return [(r, i) for r in range(len(self.grid)) for i in self._order]

    def call(self, inputs, training=None):
        x = inputs
        for k, stage in enumerate(self.stages):
            with tf.device(self._device(0, k)):
                x = stage(x, training=training)
        return x

    def plain_model(self) -> Any:
        """The original model with the pipeline's current weights; save or use it as usual."""
        if self._copies is not None:
            copy_back(self._source, self._copies)
            return self._source
        for stage, sub in zip(self.stages, self.partition.models):
            if isinstance(stage, TensorParallelModel):
                stage.plain_model()  # into sub's layers, which are the source's
            else:
                sub.set_weights(stage.get_weights())
        return self._source

    def compile(self, *args: Any, **kwargs: Any) -> None:
        """Keras' ``compile``; then the optimizer's slots are made next to their variables."""
        super().compile(*args, **kwargs)  # type: ignore[misc]  # keras.Model's, after this mixin
        if self._copies is not None:
            check_tied(self._copies, self.optimizer)
        build_optimizer_beside_variables(self)

    def get_config(self):
        raise NotImplementedError(
            "Save plain_model() instead: a PipelineModel is rebuilt with Pipeline.stage(model)."
        )

    # Plain graph building: Python loops over the schedule.
    @tf.autograph.experimental.do_not_convert
    def train_step(self, data):
        x, y, sample_weight = self._keras.utils.unpack_x_y_sample_weight(data)
        replicas = len(self.grid)
        m = self.schedule.num_microbatches
        xs, ys, weights = split_microbatches(x, y, sample_weight, replicas, m)
        step_start = tf.timestamp()
        predictions, sums, done, losses = {}, {}, {}, []
        for replica in range(len(self.grid)):
            run_replica(self, replica, xs, ys, weights, predictions, sums, done, losses)
        record_timing(self, step_start, done)
        self._track_loss(losses, x)
        self._apply(self._sum_over_replicas(sums))
        y_pred = tf.concat([predictions[j] for j in sorted(predictions)], axis=0)
        return self.compute_metrics(x, y, y_pred, sample_weight)

    # Where the two Kerases differ (filled in by each concrete class).
    def _microbatch_loss(self, y, y_pred, sample_weight):
        """A microbatch's loss with every stage's regularization (the plain model's loss)."""
        raise NotImplementedError

    def _scaled(self, loss):
        """The loss times the loss scale under mixed_float16 (the gradients are unscaled once,
        after the sums over microbatches and replicas, and the optimizer skips the step if
        any of them overflowed)."""
        raise NotImplementedError

    def _apply(self, pairs):
        """Applies the summed (gradient, variable) pairs: unscaled, then the optimizer's step."""
        raise NotImplementedError

    def _track_loss(self, losses, x):
        """Records the step's loss (the microbatches' losses) for the logs."""

    def fit(self, x=None, y=None, batch_size=None, **kwargs):
        """Keras' ``fit``; arrays whose last batch would not split into microbatches are refused
        before the first step (not at the epoch's end, after steps were applied)."""
        parts = len(self.grid) * self.schedule.num_microbatches
        check_fit_batches(x, batch_size, kwargs.get("validation_split"), parts)
        return super().fit(x, y, batch_size=batch_size, **kwargs)

    def _sum_over_replicas(self, sums):
        """(gradient, variable) pairs: each stage's sums added over the replicas on its device."""
        pairs = []
        for k, stage in enumerate(self.stages):
            with tf.device(self._device(0, k)):
                for n, variable in enumerate(stage.trainable_variables):
                    parts = [
                        sums[(r, k)][n]
                        for r in range(len(self.grid))
                        if sums[(r, k)][n] is not None
                    ]
                    if parts:
                        pairs.append((functools.reduce(add_gradients, parts), variable))
        if self._copies is not None:  # a weight two flattened stages hold: both take its sum
            pairs = tied_gradients(self._copies, pairs)
        if self._workers is not None:  # and over the workers' replicas
            pairs = list(zip(self._workers.sum([g for g, _ in pairs]), [v for _, v in pairs]))
        return pairs


class _TfKerasPipelineModel(PipelineModel, keras.Model):
    """A `PipelineModel` of a tf_keras model."""

    _keras = keras

    def _microbatch_loss(self, y, y_pred, sample_weight):
        # compiled_loss also adds the microbatch to the loss metric (equal microbatches: the mean).
        return self.compiled_loss(
            y,
            y_pred,
            sample_weight,
            regularization_losses=[loss for stage in self.stages for loss in stage.losses],
        )

    def _scaled(self, loss):
        if isinstance(self.optimizer, keras.mixed_precision.LossScaleOptimizer):
            return self.optimizer.get_scaled_loss(loss)
        return loss

    def _apply(self, pairs):
        if isinstance(self.optimizer, keras.mixed_precision.LossScaleOptimizer):
            gradients = self.optimizer.get_unscaled_gradients([g for g, _ in pairs])
            pairs = list(zip(gradients, [v for _, v in pairs]))
        self.optimizer.apply_gradients(pairs)


@functools.cache
def _keras3_pipeline_model():
    """The `PipelineModel` class of Keras 3 models (made when first needed: Keras 3 loads then)."""
    k3 = keras3()

    class _Keras3PipelineModel(PipelineModel, k3.Model):
        """A `PipelineModel` of a Keras 3 model."""

        _keras = k3

        def _microbatch_loss(self, y, y_pred, sample_weight):
            # The compiled loss plus self.losses: every stage's regularization.
            return _compat.keras3_compute_loss(self, y, y_pred, sample_weight)

        def _scaled(self, loss):
            return self.optimizer.scale_loss(loss)  # the loss itself unless a LossScaleOptimizer

        def _apply(self, pairs):
            # a LossScaleOptimizer unscales, and skips on overflow
            self.optimizer.apply_gradients(pairs)

        def _track_loss(self, losses, x):
            # Keras 3's train_step records the loss itself; the step's loss is the mean of its
            # equal microbatches' losses, weighted by the batch's size.
            batch = tf.shape(tf.nest.flatten(x)[0])[0]
            _compat.keras3_loss_tracker(self).update_state(
                tf.add_n(losses) / len(losses), sample_weight=batch
            )

    return _Keras3PipelineModel
